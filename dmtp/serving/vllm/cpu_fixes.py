"""Corrections to two CPU stand-ins of vLLM 0.32 that speculative decoding runs through (CPU only).

1. The rejection sampler's `expand_kernel` (per-request temperature / top_p / top_k to per-draft-token):
   the CPU build's `vllm.utils.cpu_triton_utils._expand_kernel_impl` hands the C++ kernel
   `output.to(int64)`, a copy for the float32 temperature and top_p, fills the copy, and never writes
   the caller's `new_empty` buffer. The target's logits are then divided by uninitialised memory
   (measured: logits of 1e14..1e23 and NaN, recovered token 0 = EOS after one round), so sampled
   speculative decoding on CPU ends requests after a token or two, or not, depending on what that
   memory held (vllm-project/vllm#55005; fix proposed in #55006).
2. DFlash's context K norm (`DFlashQwen3Model._normalize_context_k`) runs every drafter layer's K
   through one `ops.rms_norm` call with the layers' k_norm weights stacked [L, head_dim]; the CPU
   kernel reads only the first row, so layers 2..L normalise their context K with layer 1's weight.
   A one-layer drafter is unaffected; a multi-layer one (raw DFlash or DMTP) drafts other candidates
   than the checkpoint's (measured on the quick start's 3-layer drafter: 294 of 643 rounds, tau 3.274
   in vLLM vs 3.283 in dmtp's loop).

`install()` swaps both before vLLM uses them: the expand stand-in before vLLM registers its CPU
kernel overrides (worker start-up loads general plugins first, `v1/worker/worker_base.py`), the K
norm on the model class. Other platforms keep vLLM's own code.
"""
from __future__ import annotations

import torch


def expand_at_callers_dtype(output: torch.Tensor, input_val: torch.Tensor, cu_num_tokens: torch.Tensor,
                            replace_from, replace_to, MAX_NUM_TOKENS=None) -> None:
    """The Triton kernel's semantics (its signature, MAX_NUM_TOKENS unused): request i's value (replace_from -> replace_to) written over its
    tokens [cu[i-1], cu[i]) of `output`, in `output`'s own dtype and storage."""
    ends = cu_num_tokens.long()
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    values = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    expanded = values.repeat_interleave(counts)
    output[:expanded.shape[0]] = expanded.to(output.dtype)


def normalize_context_k_per_layer(self, all_k: torch.Tensor) -> torch.Tensor:
    """[L, num_ctx, kv_heads, head_dim]: each layer's context K RMS-normalised with its own k_norm
    weight (`self._k_norm_weights`, [L, head_dim]), as vLLM's per-layer `RMSNorm` computes it."""
    x = all_k.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self._rms_norm_eps)
    return x.to(all_k.dtype) * self._k_norm_weights[:, None, None, :]


def install() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.model_executor.models.qwen3_dflash import DFlashQwen3Model
    from vllm.utils import cpu_triton_utils

    cpu_triton_utils._expand_kernel_impl = expand_at_callers_dtype
    DFlashQwen3Model._normalize_context_k = normalize_context_k_per_layer


__all__ = ["expand_at_callers_dtype", "install", "normalize_context_k_per_layer"]
