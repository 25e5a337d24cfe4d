"""A correct CPU stand-in for vLLM's rejection-sampler `expand_kernel` (vLLM 0.32's is broken).

vLLM's CPU build replaces the Triton kernel `vllm.v1.sample.rejection_sampler.expand_kernel` with
`vllm.utils.cpu_triton_utils._expand_kernel_impl`, which hands the C++ kernel `output.to(int64)`:
for the float32 temperature and top_p it expands at every non-greedy speculative step, that is a
copy, the kernel fills the copy, and the caller's `new_empty` buffer is never written. The target's
logits are then divided by uninitialised memory (measured: logits of 1e14..1e23 and NaN, recovered
token 0 = EOS after one round), so sampled speculative decoding on CPU ends requests after a token or
two, or not, depending on what that memory held (vllm-project/vllm#55005, fix proposed in #55006).

`install()` swaps the module attribute before vLLM registers its CPU overrides (worker start-up
loads general plugins first, `v1/worker/worker_base.py`), so the registration picks this one up. On
GPUs, and on a vLLM without that module, nothing changes.
"""
from __future__ import annotations

import torch


def expand_at_callers_dtype(output: torch.Tensor, input_val: torch.Tensor, cu_num_tokens: torch.Tensor,
                            replace_from, replace_to, MAX_NUM_TOKENS=None) -> None:  # noqa: N803 (kernel's name)
    """The Triton kernel's semantics: request i's value (replace_from -> replace_to) written over its
    tokens [cu[i-1], cu[i]) of `output`, in `output`'s own dtype and storage."""
    ends = cu_num_tokens.long()
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    values = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    expanded = values.repeat_interleave(counts)
    output[:expanded.shape[0]] = expanded.to(output.dtype)


def install() -> None:
    try:
        from vllm.utils import cpu_triton_utils
    except ImportError:
        return
    if hasattr(cpu_triton_utils, "_expand_kernel_impl"):
        cpu_triton_utils._expand_kernel_impl = expand_at_callers_dtype


__all__ = ["expand_at_callers_dtype", "install"]
