"""DeepSeek-V3 multi-head latent attention (MLA) over a static compressed-latent cache, in latent space.

MLA compresses keys and values of a token to one latent `c = kv_a_layernorm(kv_a(x))` [kv_lora_rank]
plus one roped key `k_pe` [qk_rope_head_dim] shared by all heads; head h's key is `[W_uk[h] c ; k_pe]`
and its value `W_uv[h] c`, with `kv_b_proj.weight` = per head [W_uk[h] (qk_nope rows); W_uv[h] (v rows)].
Only (c, k_pe) are cached. Instead of expanding every cached latent through kv_b_proj at each call
(O(context x heads x rank) work and memory), `kv_b_proj` is absorbed into both sides, as serving engines do:

    score_h(t, s) = q_nope_h(t) . W_uk[h] c_s + q_pe_h(t) . k_pe_s = [W_uk[h]^T q_nope_h(t) ; q_pe_h(t)] . [c_s ; k_pe_s]
    out_h(t)      = W_uv[h] sum_s p_h(t, s) c_s

so attention is one multi-query attention with key [c ; k_pe] and value c; the same up to fp32 rounding
as transformers' expanded form. RoPE: transformers' `rope_interleave` (the DeepSeek checkpoints' layout:
rotary pairs (x0, x1), (x2, x3), ...) equals NeoX rotate-half RoPE on the de-interleaved vector
[x0, x2, ..; x1, x3, ..]; queries and keys get the same permutation, so their dot products are unchanged.
The softmax scale is qk_head_dim^-0.5, times mscale^2 for YaRN checkpoints with `mscale_all_dim`.

One implementation serves the static-cache target runner (`dmtp.families.deepseek_v3`) and the
DeepSeek-V3 MTP block (the same file). Parameter names are the checkpoint's.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from dmtp.models.qwen3 import RMSNorm, apply_rope
from dmtp.models.rope_config import rope_parameters

# transformers builds q_a_layernorm / kv_a_layernorm with its RMSNorm default, not config.rms_norm_eps.
LATENT_NORM_EPS = 1e-6


def mla_softmax_scale(qk_head_dim: int, rope_parameters: dict | None) -> float:
    """qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2 under YaRN (DeepSeek's long-context recipe)."""
    scale = qk_head_dim ** -0.5
    params = rope_parameters or {}
    mscale_all_dim = params.get("mscale_all_dim") or 0
    factor = float(params.get("factor") or 1.0)
    if params.get("rope_type", "default") != "default" and mscale_all_dim and factor > 1:
        mscale = 0.1 * mscale_all_dim * math.log(factor) + 1.0
        scale *= mscale * mscale
    return scale


class MLACache:
    """Static per-layer latent cache: `c_kv` [B, Lmax, kv_lora_rank] (normed) and `k_pe` [B, Lmax,
    qk_rope_head_dim] (roped), written at per-request positions.

    Never sliced: stale rows are hidden by the caller's mask and overwritten by later writes."""

    def __init__(self, batch: int, max_len: int, kv_lora_rank: int, rope_dim: int, dtype, device):
        self.c_kv = torch.zeros(batch, max_len, kv_lora_rank, dtype=dtype, device=device)
        self.k_pe = torch.zeros(batch, max_len, rope_dim, dtype=dtype, device=device)

    @property
    def max_len(self) -> int:
        return self.c_kv.shape[1]

    def write(self, positions: torch.Tensor, c_kv: torch.Tensor, k_pe: torch.Tensor) -> None:
        """positions [B, T] (absolute, < max_len); c_kv [B, T, rank]; k_pe [B, T, rope_dim]. An indexed
        assignment, as `dmtp.models.qwen3.KVCache.write` (in place when compiled too)."""
        rows = torch.arange(positions.shape[0], device=positions.device)[:, None]
        for buf, new in ((self.c_kv, c_kv), (self.k_pe, k_pe)):
            buf[rows, positions] = new.to(buf.dtype)


class MLAttention(nn.Module):
    """MLA with transformers' DeepSeek-V3 parameter names; attention in latent space (module docstring)."""

    def __init__(self, hidden_size: int, num_heads: int, q_lora_rank: int | None, kv_lora_rank: int,
                 qk_nope_head_dim: int, qk_rope_head_dim: int, v_head_dim: int, scaling: float,
                 rope_interleave: bool, bias: bool = False):
        super().__init__()
        self.num_heads, self.q_lora_rank, self.kv_lora_rank = num_heads, q_lora_rank, kv_lora_rank
        self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.scaling, self.rope_interleave = float(scaling), bool(rope_interleave)
        qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        if q_lora_rank is None:
            self.q_proj = nn.Linear(hidden_size, num_heads * qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden_size, q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(q_lora_rank, num_heads * qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden_size, kv_lora_rank + qk_rope_head_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj = nn.Linear(kv_lora_rank, num_heads * (qk_nope_head_dim + v_head_dim), bias=False)
        self.o_proj = nn.Linear(num_heads * v_head_dim, hidden_size, bias=bias)

    @classmethod
    def from_config(cls, config) -> "MLAttention":
        """Zero-initialised, dimensions from transformers' DeepseekV3Config (its defaults included)."""
        return cls(config.hidden_size, config.num_attention_heads, config.q_lora_rank, config.kv_lora_rank,
                   config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim,
                   mla_softmax_scale(config.qk_nope_head_dim + config.qk_rope_head_dim, rope_parameters(config)),
                   bool(getattr(config, "rope_interleave", True)), bool(config.attention_bias))

    def new_cache(self, batch: int, max_len: int, dtype, device) -> MLACache:
        return MLACache(batch, max_len, self.kv_lora_rank, self.qk_rope_head_dim, dtype, device)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [B, heads, T, rope_dim]."""
        if self.rope_interleave:
            x = torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)
        return apply_rope(x, cos, sin)

    def _kv_b(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of kv_b_proj.weight: W_uk [heads, qk_nope, rank], W_uv [heads, v, rank] (no copies)."""
        w = self.kv_b_proj.weight.view(self.num_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
        return w[:, :self.qk_nope_head_dim], w[:, self.qk_nope_head_dim:]

    def queries(self, h: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """h [B, T, H] -> absorbed query q_lat [B, heads, T, rank] and roped q_pe [B, heads, T, rope_dim]."""
        b, t, _ = h.shape
        if self.q_lora_rank is None:
            q = self.q_proj(h)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(h)))
        q = q.view(b, t, self.num_heads, -1).transpose(1, 2)
        q_nope, q_pe = q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        w_uk, _ = self._kv_b()
        return torch.einsum("bhtd,hdr->bhtr", q_nope, w_uk), self._rope(q_pe, cos, sin)

    def latents(self, h: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """h [B, T, H] -> what the cache stores: c_kv [B, T, rank] (normed), k_pe [B, T, rope_dim] (roped)."""
        c, k_pe = self.kv_a_proj_with_mqa(h).split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        return self.kv_a_layernorm(c), self._rope(k_pe[:, None], cos, sin)[:, 0]

    def attend(self, q_lat, q_pe, c_kv, k_pe, mask: torch.Tensor | None) -> torch.Tensor:
        """Queries [B, heads, T, .] over keys [B, L, .]; mask [B|1, 1, T, W] (W <= L), boolean (True = attend)
        or additive (`dmtp.models.qwen3.additive_mask`), as `attend` takes it: keys at W and after are not
        attended -> [B, T, H]. Heads share one key/value, so they are folded into the query rows of one
        batched matmul."""
        b, nh, t, rank = q_lat.shape
        if mask is not None and mask.shape[-1] < c_kv.shape[1]:
            c_kv, k_pe = c_kv[:, :mask.shape[-1]], k_pe[:, :mask.shape[-1]]
        scores = q_lat.reshape(b, nh * t, rank) @ c_kv.transpose(1, 2)
        scores = scores + q_pe.reshape(b, nh * t, -1) @ k_pe.transpose(1, 2)
        scores = scores.view(b, nh, t, -1) * self.scaling
        if mask is not None and mask.dtype != torch.bool:
            scores = scores + mask
        elif mask is not None:
            # finfo.min, not -inf: a fully masked row (padding scratch) stays finite; its output is unused.
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores.float(), dim=-1).to(c_kv.dtype)
        o_lat = (probs.view(b, nh * t, -1) @ c_kv).view(b, nh, t, rank)
        _, w_uv = self._kv_b()
        out = torch.einsum("bhtr,hvr->bthv", o_lat, w_uv)
        return self.o_proj(out.reshape(b, t, nh * self.v_head_dim))

    def forward(self, h, cos, sin, mask, cache: MLACache | None = None, positions=None) -> torch.Tensor:
        """Without a cache, attends over the rows of `h` itself (teacher-forced); with one, writes the
        rows' latents at `positions` and attends over the whole cache under `mask` [B, 1, T, Lmax]."""
        q_lat, q_pe = self.queries(h, cos, sin)
        c_kv, k_pe = self.latents(h, cos, sin)
        if cache is not None:
            cache.write(positions, c_kv, k_pe)
            c_kv, k_pe = cache.c_kv, cache.k_pe
        return self.attend(q_lat, q_pe, c_kv, k_pe, mask)


class MLADecoderLayer(nn.Module):
    """Pre-norm MLA + MLP layer (the MLP: a dense SwiGLU or `dmtp.models.moe.SigmoidMoE`)."""

    def __init__(self, self_attn: MLAttention, mlp: nn.Module, hidden_size: int, eps: float):
        super().__init__()
        self.self_attn = self_attn
        self.mlp = mlp
        self.input_layernorm = RMSNorm(hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(hidden_size, eps)

    def forward(self, x, cos, sin, mask, cache: MLACache | None = None, positions=None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache=cache, positions=positions)
        return x + self.mlp(self.post_attention_layernorm(x))

    def new_cache(self, batch: int, max_len: int, dtype, device) -> MLACache:
        return self.self_attn.new_cache(batch, max_len, dtype, device)


__all__ = ["MLACache", "MLAttention", "MLADecoderLayer", "mla_softmax_scale", "LATENT_NORM_EPS"]
