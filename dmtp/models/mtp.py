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

from dmtp.models.moe import packed_experts, sigmoid_moe_from_config
from dmtp.models.mtp_errors import MTPLoadError
from dmtp.models.qwen3 import KVCache, Qwen3MLP, RMSNorm, additive_mask, cache_mask, causal_mask, rope_tables


@dataclass
class MTPSpec:
    """What a family's MTP looks like; filled from the target's config by its family (`dmtp.families`)."""

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
    def __init__(self, spec: MTPSpec, embed_tokens: nn.Embedding, lm_head: nn.Module, block: nn.Module):
        super().__init__()
        h = spec.hidden_size
        self.spec = spec
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = RMSNorm(h, spec.rms_norm_eps, spec.zero_centered_norm)
        self.pre_fc_norm_hidden = RMSNorm(h, spec.rms_norm_eps, spec.zero_centered_norm)
        self.layers = nn.ModuleList([block])   # the family's decoder block (`dmtp.families.<family>`)
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

    def logits(self, g: torch.Tensor, vocab=None) -> torch.Tensor:
        """The shared LM head on g; `vocab` (dmtp.models.draft_vocab.DraftVocab): over its V tokens only, -inf
        elsewhere."""
        return self.lm_head(g) if vocab is None else vocab.logits(g, self.lm_head.weight)

    def new_cache(self, batch: int, max_len: int, dtype=None, device=None):
        p = self.fc.weight
        return self.layers[0].new_cache(batch, max_len, dtype or p.dtype, device or p.device)


# ----------------------------------------------------------------------------------------------------
# what several families' MTP blocks share (DeepSeek-V3, GLM-4-MoE: our decoder layers + transformers' rotary)
# ----------------------------------------------------------------------------------------------------

class RotaryMTPBlock:
    """Mixin giving one of our decoder layers the MTP block protocol, with transformers' rotary embedding
    of the family (`_hf["rotary"]`, kept outside the module tree: its fp32 frequencies follow device
    moves but are never cast with the weights, and no host copy happens inside CUDA-graph capture)."""

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        device = fn(torch.zeros(())).device
        self._hf["rotary"]._apply(lambda t: t.to(device))
        return self

    def forward(self, x, positions, mask, cache=None):
        cos, sin = rope_tables(*self._hf["rotary"](x, positions))
        return super().forward(x, cos, sin, mask, cache=cache, positions=positions)


def hf_family_config(config_cls, cfg: dict):
    """transformers' config object of the family: its class defaults fill what config.json leaves out."""
    return config_cls.from_dict({k: v for k, v in cfg.items() if k not in ("quantization_config",)})


def moe_mtp_block(block_cls, config, rotary_cls, cfg: dict, keys: list[str] | None) -> nn.Module:
    """The MTP layer (index num_hidden_layers) of a DeepSeek-V3 / GLM-4-MoE config: MoE from
    `first_k_dense_replace` on, as transformers decides; experts in the checkpoint's layout."""
    if cfg.get("hidden_act", "silu") != "silu":
        raise MTPLoadError(f"{cfg.get('model_type')} MTP: hidden_act {cfg['hidden_act']!r} is not supported")
    rotary = rotary_cls(config=config)
    # Built on the meta device, then materialised with zeros: real MoE blocks hold billions of weights,
    # which need no random init (every tensor is then loaded).
    with torch.device("meta"):
        if cfg["num_hidden_layers"] >= config.first_k_dense_replace:
            mlp = sigmoid_moe_from_config(config, packed=packed_experts(keys))
        else:
            mlp = Qwen3MLP(config.hidden_size, config.intermediate_size)
        block = block_cls(config, mlp, rotary)
    block = block.to_empty(device="cpu")
    with torch.no_grad():
        for t in [*block.parameters(), *block.buffers()]:
            t.zero_()
    return block
