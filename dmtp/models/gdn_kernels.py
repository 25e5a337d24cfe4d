"""Optional CUDA kernels for the Gated DeltaNet layer: flash-linear-attention (`fla`) and `causal-conv1d`.

`GatedDeltaNet` calls these only when `usable(...)` said yes for its device and dtype (both packages
importable, CUDA, fp16/bf16); everywhere else, and always on CPU, it runs the plain-torch math of
`dmtp.models.gated_deltanet`, which is the tested reference: both give the same tokens.

Inputs are token-first as the kernels take them: q/k [B,T,Hk,dk] (raw: the kernel normalises them),
v [B,T,Hv,dv], g (fp32 log-decay) and beta [B,T,Hv]; states are fp32 [., Hv, dk, dv].
fla returns only the state after the LAST token of a sequence, so `delta_rule_rows` runs the S prefixes
of each request's block as S variable-length sequences (1, 2, .., S rows) from the same initial
state in one kernel launch: sequence i's final state is the state after row i and its last output is
row i's output. Index tensors are built once per (batch, width) on the device, so the call has fixed
shapes and no host sync (CUDA-graph capturable).
"""
from __future__ import annotations

import torch

try:  # optional CUDA kernels
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as _fla_chunk  # type: ignore
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as _fla_recurrent  # type: ignore
except Exception:  # pragma: no cover - not installed on CPU machines
    _fla_chunk = _fla_recurrent = None

try:
    from causal_conv1d import causal_conv1d_fn as _causal_conv1d_fn  # type: ignore
except Exception:  # pragma: no cover - not installed on CPU machines
    _causal_conv1d_fn = None

KERNEL_DTYPES = (torch.float16, torch.bfloat16)


def available() -> bool:
    return _fla_chunk is not None and _fla_recurrent is not None and _causal_conv1d_fn is not None


def usable(device: torch.device, dtype: torch.dtype, conv_kernel: int) -> bool:
    """Whether the kernel path can run here (causal-conv1d handles kernel widths 2..4)."""
    return available() and torch.device(device).type == "cuda" and dtype in KERNEL_DTYPES and 2 <= conv_kernel <= 4


def conv_silu(window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """SiLU(causal depthwise conv) of the last T columns of window [B, C, K-1+T] -> [B, C, T]."""
    k1 = weight.shape[-1] - 1
    return _causal_conv1d_fn(window.contiguous(), weight[:, 0], bias, activation="silu")[..., k1:]


def delta_rule_prompt(q, k, v, g, beta):
    """Whole prompts from a zero state -> (o [B,T,Hv,dv], final state [B,Hv,dk,dv] fp32)."""
    o, state = _fla_chunk(q=q, k=k, v=v, g=g, beta=beta, initial_state=None, output_final_state=True,
                          use_qk_l2norm_in_kernel=True)
    return o, state.float()


_PREFIXES: dict = {}


def _prefixes(batch: int, width: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token index into the flattened [B*S] block for every prefix row, cu_seqlens, index of each
    prefix's last token), cached per shape so that no index is built inside a captured graph."""
    key = (batch, width, str(device))
    if key not in _PREFIXES:
        rows = torch.cat([torch.arange(i + 1) for i in range(width)])                 # 0 | 0 1 | 0 1 2 | ...
        tokens = (torch.arange(batch)[:, None] * width + rows[None]).flatten()
        lengths = torch.arange(1, width + 1).repeat(batch)
        cu = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
        _PREFIXES[key] = (tokens.to(device), cu.to(device), (cu[1:] - 1).to(device))
    return _PREFIXES[key]


def delta_rule_rows(q, k, v, g, beta, state):
    """S rows continuing state [B,Hv,dk,dv] -> (o [B,S,Hv,dv], state after every row [B,S,Hv,dk,dv])."""
    b, s = q.shape[:2]
    tokens, cu, last = _prefixes(b, s, q.device)

    def packed(x):  # [B, S, ...] -> [1, sum of prefix lengths, ...]
        return x.flatten(0, 1).index_select(0, tokens)[None]

    h0 = state.repeat_interleave(s, dim=0)                                            # [B*S, Hv, dk, dv]
    o, states = _fla_recurrent(q=packed(q), k=packed(k), v=packed(v), g=packed(g), beta=packed(beta),
                               initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                               cu_seqlens=cu)
    o = o[0].index_select(0, last).view(b, s, *o.shape[2:])
    return o, states.float().view(b, s, *states.shape[1:])


__all__ = ["available", "usable", "conv_silu", "delta_rule_prompt", "delta_rule_rows", "KERNEL_DTYPES"]
