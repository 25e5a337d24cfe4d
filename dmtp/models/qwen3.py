"""Qwen3-family building blocks shared by the MTP layer, the DFlash drafter and the fast target runner.

Parameter names follow Hugging Face's Qwen3 implementation, so checkpoint tensors load by name.
Every attention call goes through `attend`, which takes an explicit mask: boolean (True = may attend),
or its additive float form (`additive_mask`, built once per forward and shared by the layers); the
decoding loop, the training masks and the MTP cache all express visibility the same way. A mask
narrower than the cache hides the slots past its width: the eager decoding loop attends over each
round's live span of the static caches instead of their maximum length.

The decoding models are tiny on CPU, so per-op overhead dominates there: norms are one fused kernel
in fp32, rotary tables are built once per forward in the layout `apply_rope` uses as is, and grouped
K/V heads are never copied (`GQA_MODES`: SDPA's enable_gqa on CPU, the query regrouped elsewhere). Each of these gives bitwise the same values as the plain chain.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32. `zero_centered` selects the Qwen3-Next/3.5 flavour x*(1+w)."""

    def __init__(self, dim: int, eps: float = 1e-6, zero_centered: bool = False):
        super().__init__()
        self.eps = eps
        self.zero_centered = zero_centered
        self.weight = nn.Parameter(torch.zeros(dim) if zero_centered else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        if dtype == torch.float32 and self.weight.dtype == torch.float32 and not self.zero_centered:
            # One fused kernel instead of seven small ones; bitwise equal to the chain below in fp32.
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        w = self.weight.float()
        if self.zero_centered:
            return (x * (1.0 + w)).to(dtype)
        # Cast before the multiply, as transformers' Qwen3RMSNorm does, so bf16 results agree.
        return w.to(dtype) * x.to(dtype)


def rope_inv_freq(rotary_dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype, scale: float = 1.0):
    """Rotary tables for positions [B, T] (NeoX-style rotate-half), in `apply_rope`'s layout (`rope_tables`).
    `scale` multiplies both (transformers' `attention_scaling` of scaled rope types)."""
    freqs = positions.to(torch.float32)[..., None] * inv_freq.to(device=positions.device, dtype=torch.float32)
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos(), emb.sin()
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    return rope_tables(cos.to(dtype), sin.to(dtype))


def rope_tables(cos: torch.Tensor, sin: torch.Tensor):
    """Plain rotate-half tables [B, T, r] (transformers' layout) -> what `apply_rope` takes, built once per
    forward: cos and a signed sin [B, 1, T, r] (broadcast over heads). rotate_half(x) * sin equals
    roll(x, r/2) * [-sin_1, sin_2] bitwise: the sign moves from x into the table."""
    half = sin.shape[-1] // 2
    return cos[:, None], torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)[:, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, heads, T, d]; cos/sin from `rope_cos_sin` / `rope_tables`: [B, 1, T, r] with r <= d (partial
    rotary rotates the first r dims).

    Equals x * cos + rotate_half(x) * sin with the plain tables, bitwise."""
    r = cos.shape[-1]
    if r == x.shape[-1]:
        return x * cos + torch.roll(x, r // 2, dims=-1) * sin
    rot, keep = x[..., :r], x[..., r:]
    return torch.cat([rot * cos + torch.roll(rot, r // 2, dims=-1) * sin, keep], dim=-1)


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive form of a boolean mask (True = attend) for `attend`: 0 where visible, the dtype's
    most negative finite value elsewhere.

    Build it once per forward: SDPA would convert a boolean mask in every layer. Finite, so a fully masked row
    (padding scratch, whose output is unused) averages its keys instead of giving NaN; any row with a visible key
    gets exactly its masked softmax."""
    return torch.full(mask.shape, torch.finfo(dtype).min, dtype=dtype, device=mask.device).masked_fill_(mask, 0.0)


# How grouped K/V heads meet their query heads (h = group x hkv), never by copying the cache:
#   native   SDPA's `enable_gqa=True` (the CPU kernels read grouped heads in place);
#   grouped  the query viewed as [B, hkv, group*Tq, d], so each K/V head is read once by one kernel call
#            with equal heads: what the masked (memory-efficient) CUDA kernel takes on every torch version,
#            where enable_gqa with a mask may fall back to the math kernel, which copies K/V itself;
#   repeat   repeat_interleave of K/V across the cache (the old CUDA path; kept for A/B measurements:
#            it copies the whole cache in every layer, ~0.3 GB per forward at 8B shapes, batch 1, 256 slots).
# auto = native on CPU (bitwise what the tests were written against), grouped elsewhere.
GQA_MODES = ("auto", "native", "grouped", "repeat")
_gqa_mode = "auto"


def set_gqa_mode(mode: str) -> str:
    """Choose how `attend` handles grouped K/V heads (GQA_MODES); returns the previous mode.

    A process-wide setting for benchmarks and tests (tools/bench/profile_decode.py compares them); decoding never
    needs it."""
    global _gqa_mode
    if mode not in GQA_MODES:
        raise ValueError(f"gqa mode must be one of {', '.join(GQA_MODES)}, got {mode!r}")
    prev, _gqa_mode = _gqa_mode, mode
    return prev


def gqa_mode(device) -> str:
    """The mode `attend` uses on `device` (auto resolved)."""
    if _gqa_mode != "auto":
        return _gqa_mode
    return "native" if torch.device(device).type == "cpu" else "grouped"


def _grouped_attention(q, k, v, mask):
    """GQA as equal-head attention: query head j*g + i (K/V head j) becomes row i*Tq + s of K/V head j's
    query block.

    Softmax is per row, so this is the same attention; only K/V are read once."""
    b, h, t, d = q.shape
    hkv = k.shape[1]
    g = h // hkv
    qg = q.reshape(b, hkv, g * t, d)   # a view when q is contiguous: heads are the slow dimension
    if mask is not None:
        if mask.shape[1] == h:          # per-head mask: the same regrouping as the query
            mask = mask.reshape(mask.shape[0], hkv, g * t, mask.shape[-1])
        elif t == 1:                    # one query row per head: broadcast, no copy
            mask = mask.expand(mask.shape[0], 1, g, mask.shape[-1])
        elif g * t >= 2 * h * d:        # a long prefill: the repeated mask (B x g x Tq x W) would outgrow
            return None                 # repeated K/V (B x 2h x W x d); repeat those instead, for this call
        else:                           # rows i*Tq + s see what row s sees (decode rows: Tq x W per request)
            mask = mask.repeat(1, 1, g, 1)
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask)
    return out.reshape(b, h, t, v.shape[-1])


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Scaled dot-product attention with GQA. q [B,h,Tq,d], k/v [B,hkv,Tk,d]; mask [B,1|h,Tq,W] boolean
    (True = attend) or additive float (`additive_mask`), W <= Tk: keys at W and after are not attended
    (a static cache's slots past the live span).

    Grouped heads: see GQA_MODES."""
    if mask is not None and mask.shape[-1] < k.shape[2]:
        k, v = k[:, :, :mask.shape[-1]], v[:, :, :mask.shape[-1]]
    if mask is not None and mask.dtype == torch.bool:
        # A fully masked row would give NaN; let it attend to nothing harmful (its output is unused).
        mask = mask | ~mask.any(-1, keepdim=True)
    if k.shape[1] != q.shape[1]:
        mode = gqa_mode(q.device)
        if mode == "native":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        if mode == "grouped":
            out = _grouped_attention(q, k, v, mask)
            if out is not None:
                return out
        rep = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class Qwen3Attention(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, eps: float,
                 bias: bool = False):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, n, self.head_dim).transpose(1, 2)

    def project_q(self, x, cos, sin):
        return apply_rope(self.q_norm(self._heads(self.q_proj(x), self.num_heads)), cos, sin)

    def project_kv(self, x, cos, sin):
        """Keys (normed, rotated) and values of `x`: what a KV cache stores for these rows."""
        k = apply_rope(self.k_norm(self._heads(self.k_proj(x), self.num_kv_heads)), cos, sin)
        v = self._heads(self.v_proj(x), self.num_kv_heads)
        return k, v

    def output(self, attn: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = attn.shape
        return self.o_proj(attn.transpose(1, 2).reshape(b, t, -1))


class Qwen3MLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class KVCache:
    """Static per-layer K/V buffers [B, hkv, Lmax, d]; rows are written at per-request positions.

    Nothing is ever sliced or cropped: a rejected row stays in memory, hidden by the caller's
    length-based mask, and is overwritten by the next write at that position.
    """

    def __init__(self, batch: int, num_kv_heads: int, max_len: int, head_dim: int, dtype, device):
        shape = (batch, num_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.rows = torch.arange(batch, device=device)[:, None]

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def write(self, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """positions [B, T] (absolute, < max_len); k/v [B, hkv, T, d]. An indexed assignment (index_put_),
        not a scatter_: compiled, it stays in place, where a scatter into the cache would be rewritten
        as a copy of the whole cache per call."""
        self.k[self.rows, :, positions] = k.transpose(1, 2).to(self.k.dtype)
        self.v[self.rows, :, positions] = v.transpose(1, 2).to(self.v.dtype)


class Qwen3DecoderLayer(nn.Module):
    """Pre-norm attention + SwiGLU layer over a static KV cache (target runner and MTP)."""

    def __init__(self, hidden_size, num_heads, num_kv_heads, head_dim, intermediate_size, eps,
                 attention_bias: bool = False):
        super().__init__()
        self.self_attn = Qwen3Attention(hidden_size, num_heads, num_kv_heads, head_dim, eps, attention_bias)
        self.mlp = Qwen3MLP(hidden_size, intermediate_size)
        self.input_layernorm = RMSNorm(hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(hidden_size, eps)

    def forward(self, x, cos, sin, mask, cache: KVCache | None = None, positions=None):
        """Without a cache, attends over the rows of `x` itself (teacher-forced); with one, writes
        the rows at `positions` and attends over the whole cache under `mask` [B,1,T,Lmax]."""
        h = self.input_layernorm(x)
        attn = self.self_attn
        q = attn.project_q(h, cos, sin)
        k, v = attn.project_kv(h, cos, sin)
        if cache is not None:
            cache.write(positions, k, v)
            k, v = cache.k, cache.v
        x = x + attn.output(attend(q, k, v, mask))
        return x + self.mlp(self.post_attention_layernorm(x))


def causal_mask(t: int, device) -> torch.Tensor:
    return torch.ones(t, t, dtype=torch.bool, device=device).tril()[None, None]


def cache_mask(positions: torch.Tensor, width: int, first_valid: int = 0) -> torch.Tensor:
    """[B,1,T,width]: the row at absolute position p sees cache slots first_valid..p (width: the cache's
    length, or the live span of it that covers every position)."""
    slots = torch.arange(width, device=positions.device)
    return ((slots[None, None, :] <= positions[:, :, None]) & (slots >= first_valid))[:, None]


def init_linear_(module: nn.Module, std: float = 0.02) -> None:
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


__all__ = [
    "RMSNorm", "rope_inv_freq", "rope_cos_sin", "rope_tables", "apply_rope", "additive_mask", "attend", "Qwen3Attention", "Qwen3MLP",
    "GQA_MODES", "set_gqa_mode", "gqa_mode",
    "KVCache", "Qwen3DecoderLayer", "causal_mask", "cache_mask", "init_linear_",
]
