"""The target's native MTP (multi-token-prediction) layer, as a frozen first-token drafter.

    u   = fc([N_e(E(x_t)) ; N_h(h_{t-1})])        # embedding first (MiMo: hidden first)
    u   = DecoderLayer(u; own KV cache)
    g_t = norm(u)                                   # the hidden that PREDICTS x_{t+1}
    p(x_{t+1}) = softmax(LMHead(g_t))               # head shared with the target

Row convention used everywhere in dmtp: the MTP row at position t consumes the target's post-norm
hidden h_{t-1} and the token x_t, runs at RoPE position t, and its output g_t predicts x_{t+1}.
So `g` is aligned with the target's own h_t (both predict x_{t+1}); row 0 has no h_{-1} and is zero.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dmtp.models.qwen3 import (KVCache, Qwen3DecoderLayer, RMSNorm, additive_mask, cache_mask, causal_mask,
                               rope_cos_sin, rope_inv_freq)


class Qwen3MTPBlock(Qwen3DecoderLayer):
    """A plain Qwen3 decoder layer as the MTP block (the tiny target's family).

    Every MTP block speaks the same protocol: `forward(x, positions, mask, cache=None)` computes its
    own rotary embedding, and `new_cache(batch, max_len, dtype, device)` gives its private KV cache."""

    def __init__(self, spec: "MTPSpec"):
        super().__init__(spec.hidden_size, spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim,
                         spec.intermediate_size, spec.rms_norm_eps, spec.attention_bias)
        rotary_dim = int(spec.head_dim * spec.partial_rotary_factor)
        # A plain attribute, not a buffer: frequencies stay fp32 when the block is cast to bf16.
        self._inv_freq = rope_inv_freq(rotary_dim, spec.rope_theta)
        self.num_kv_heads, self.head_dim = spec.num_key_value_heads, spec.head_dim

    def forward(self, x, positions, mask, cache: KVCache | None = None):
        if self._inv_freq.device != x.device:
            self._inv_freq = self._inv_freq.to(x.device)
        cos, sin = rope_cos_sin(positions, self._inv_freq, x.dtype)
        return super().forward(x, cos, sin, mask, cache=cache, positions=positions)

    def new_cache(self, batch: int, max_len: int, dtype, device) -> KVCache:
        return KVCache(batch, self.num_kv_heads, max_len, self.head_dim, dtype, device)


@dataclass
class MTPSpec:
    """What a family's MTP looks like; filled from the target's config by `dmtp.models.mtp_loading`."""

    family: str
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    partial_rotary_factor: float = 1.0
    zero_centered_norm: bool = False    # Qwen3-Next/3.5/3.6: x*(1+w)
    hidden_first: bool = False          # MiMo concatenates [hidden; embedding]
    attention_bias: bool = False


class NativeMTP(nn.Module):
    def __init__(self, spec: MTPSpec, embed_tokens: nn.Embedding, lm_head: nn.Module, block: nn.Module | None = None):
        super().__init__()
        h = spec.hidden_size
        self.spec = spec
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = RMSNorm(h, spec.rms_norm_eps, spec.zero_centered_norm)
        self.pre_fc_norm_hidden = RMSNorm(h, spec.rms_norm_eps, spec.zero_centered_norm)
        self.layers = nn.ModuleList([block if block is not None else Qwen3MTPBlock(spec)])
        self.norm = RMSNorm(h, spec.rms_norm_eps, spec.zero_centered_norm)
        # Shared with the target and never trained here; kept out of this module's parameters.
        self._shared = {"embed": embed_tokens, "head": lm_head}

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self._shared["embed"]

    @property
    def lm_head(self) -> nn.Module:
        return self._shared["head"]

    def fuse(self, tokens: torch.Tensor, prev_hidden: torch.Tensor) -> torch.Tensor:
        e = self.pre_fc_norm_embedding(self.embed_tokens(tokens))
        h = self.pre_fc_norm_hidden(prev_hidden.to(e.dtype))
        return self.fc(torch.cat([h, e] if self.spec.hidden_first else [e, h], dim=-1))

    def forward_teacher(self, input_ids: torch.Tensor, target_hidden: torch.Tensor) -> torch.Tensor:
        """All positions at once. input_ids [B,T], target_hidden [B,T,H] (post final norm).

        Returns g [B,T,H] with g[:, t] predicting x_{t+1}; g[:, 0] = 0."""
        b, t = input_ids.shape
        u = self.fuse(input_ids[:, 1:], target_hidden[:, :-1])
        positions = torch.arange(1, t, device=input_ids.device).expand(b, -1)
        mask = causal_mask(t - 1, u.device)
        for layer in self.layers:
            u = layer(u, positions, mask)
        g = self.norm(u)
        return torch.cat([torch.zeros_like(g[:, :1]), g], dim=1)

    def forward_rows(self, tokens: torch.Tensor, prev_hidden: torch.Tensor, positions: torch.Tensor,
                     cache: KVCache, span: int | None = None) -> torch.Tensor:
        """Incremental rows with the MTP's own static KV cache.

        tokens [B,R] (x_t), prev_hidden [B,R,H] (h_{t-1}), positions [B,R] (t). The rows' K/V are
        written at their positions; each row attends to cache slots 1..t (slot 0 never holds a row).
        Rows beyond a request's valid count are harmless scratch: later writes overwrite them.
        `span`: attend over the first `span` slots only (> every position; None: the whole cache)."""
        u = self.fuse(tokens, prev_hidden)
        width = cache.max_len if span is None else min(span, cache.max_len)
        mask = additive_mask(cache_mask(positions, width, first_valid=1), u.dtype)
        for layer in self.layers:
            u = layer(u, positions, mask, cache=cache)
        return self.norm(u)

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        return self.lm_head(g)

    def new_cache(self, batch: int, max_len: int, dtype=None, device=None):
        p = self.fc.weight
        return self.layers[0].new_cache(batch, max_len, dtype or p.dtype, device or p.device)
