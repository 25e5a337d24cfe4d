"""MTP families beyond the tiny Qwen3 target: Qwen3-Next / Qwen3.5 / Qwen3.6, DeepSeek-V3, GLM-4-MoE.

Registered into `dmtp.models.mtp_loading.MTP_FAMILIES` by that module (see `FAMILIES` below), keyed
by the text config's `model_type`. Each family gives an `MTPSpec` builder and a block factory
`(spec, cfg, keys) -> nn.Module` speaking the NativeMTP block protocol:

    forward(x [B,T,H], positions [B,T], mask bool [B|1,1,T,S] (True = attend), cache=None) -> [B,T,H]
    new_cache(batch, max_len, dtype, device)

`keys` are the checkpoint's tensor names relative to the block (`mtp.layers.0.` / `model.layers.{L}.`
stripped), so a factory can pick the module layout that matches the checkpoint (dense vs MoE, per-expert
vs packed experts). The block's parameter names equal those names, so strict loading proves coverage.

Qwen3-Next / Qwen3.5 / Qwen3.6 (`Qwen35MTPBlock`): one full-attention decoder layer, all norms x*(1+w),
gated attention (q_proj -> per-head [query | gate]; per-head q/k norms; partial NeoX RoPE; o_proj of
attn * sigmoid(gate)), then a dense SwiGLU MLP or a softmax-top-k MoE with a sigmoid-gated shared expert.
Qwen3.5's interleaved mRoPE reduces to 1-D RoPE for text (three equal position streams), which is
what is implemented.

DeepSeek-V3 / GLM-4-MoE (`DeepseekV3MTPBlock`, `Glm4MoeMTPBlock`): our own decoder layers, the same
classes the static-cache target runners bind to the target's weights: MLA attending in latent space over
a static latent cache (`dmtp.models.mla`), resp. GQA with partial rotary, optional q/k norms and q/k/v
biases (`Qwen3DecoderLayer`); then the sigmoid group-limited MoE with shared experts (`dmtp.models.moe`:
per-expert or packed routed experts, as the checkpoint stores them; the router stays fp32 when the
block is cast, as transformers keeps it). Rotary cos/sin come from transformers' own rotary embedding of
the family (YaRN, partial rotary), built from the config; plain x*w norms. An incremental call attends
over the block's static cache under the caller's mask (fixed shapes, graph-safe); DeepSeek's cached
latents are never re-expanded through kv_b_proj (the transformers-layer wrapper used before did that for
all max_len slots at every call: ~10x slower per 8-row call at 2048 slots).
"""
from __future__ import annotations

import inspect

import torch
from torch import nn

from dmtp.models.mla import MLADecoderLayer, MLAttention
from dmtp.models.moe import PackedSwiGLU, PerExpertSwiGLU, sigmoid_moe_from_config
from dmtp.models.moe import packed_experts as _packed_experts
from dmtp.models.mtp import MTPSpec
from dmtp.models.mtp_errors import MTPLoadError
from dmtp.models.rope_config import rope_parameters, rope_theta, rope_type
from dmtp.models.qwen3 import (KVCache, Qwen3DecoderLayer, Qwen3MLP, RMSNorm, apply_rope, attend, rope_cos_sin,
                               rope_inv_freq, rope_tables)


# ----------------------------------------------------------------------------------------------------
# Qwen3-Next / Qwen3.5 / Qwen3.6
# ----------------------------------------------------------------------------------------------------

class Qwen35SparseMoE(nn.Module):
    """Router softmax (fp32) -> top-k (-> renormalise) over SwiGLU experts + sigmoid-gated shared expert."""

    def __init__(self, hidden_size: int, num_experts: int, top_k: int, moe_intermediate_size: int,
                 shared_intermediate_size: int, norm_topk_prob: bool, packed: bool):
        super().__init__()
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob
        self.gate = nn.Linear(hidden_size, num_experts, bias=False)
        experts = PackedSwiGLU if packed else PerExpertSwiGLU
        self.experts = experts(num_experts, hidden_size, moe_intermediate_size)
        self.shared_expert = Qwen3MLP(hidden_size, shared_intermediate_size)
        self.shared_expert_gate = nn.Linear(hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        probs = torch.softmax(self.gate(flat).float(), dim=-1)
        top_w, top_idx = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            top_w = top_w / top_w.sum(-1, keepdim=True)
        out = self.experts(flat, top_idx, top_w.to(flat.dtype))
        out = out + torch.sigmoid(self.shared_expert_gate(flat)) * self.shared_expert(flat)
        return out.reshape(shape)


class Qwen35GatedAttention(nn.Module):
    def __init__(self, spec: MTPSpec):
        super().__init__()
        h, n, nkv, d, bias = (spec.hidden_size, spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim,
                              spec.attention_bias)
        self.num_heads, self.num_kv_heads, self.head_dim = n, nkv, d
        self.q_proj = nn.Linear(h, 2 * n * d, bias=bias)       # per head: [query | gate]
        self.k_proj = nn.Linear(h, nkv * d, bias=bias)
        self.v_proj = nn.Linear(h, nkv * d, bias=bias)
        self.o_proj = nn.Linear(n * d, h, bias=bias)
        self.q_norm = RMSNorm(d, spec.rms_norm_eps, zero_centered=True)
        self.k_norm = RMSNorm(d, spec.rms_norm_eps, zero_centered=True)

    def project(self, x, cos, sin):
        """x [B,T,H] -> q [B,h,T,d] (normed, rotated), output gate [B,T,h*d], k and v [B,hkv,T,d]."""
        b, t, _ = x.shape
        q, gate = self.q_proj(x).view(b, t, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        q = apply_rope(self.q_norm(q).transpose(1, 2), cos, sin)
        k = self.k_norm(self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        k = apply_rope(k, cos, sin)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return q, gate.reshape(b, t, -1), k, v

    def output(self, attn: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """attn [B,h,T,d] -> o_proj(attn * sigmoid(gate))."""
        b, _, t, _ = attn.shape
        return self.o_proj(attn.transpose(1, 2).reshape(b, t, -1) * torch.sigmoid(gate))

    def forward(self, x, cos, sin, mask, cache: KVCache | None = None, positions=None):
        q, gate, k, v = self.project(x, cos, sin)
        if cache is not None:
            cache.write(positions, k, v)
            k, v = cache.k, cache.v
        return self.output(attend(q, k, v, mask), gate)


class Qwen35MTPBlock(nn.Module):
    """Qwen3-Next / Qwen3.5 / Qwen3.6 MTP decoder layer (always full attention), checkpoint naming."""

    def __init__(self, spec: MTPSpec, mlp: nn.Module):
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, zero_centered=True)
        self.self_attn = Qwen35GatedAttention(spec)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, zero_centered=True)
        self.mlp = mlp
        # A plain fp32 attribute, not a buffer: casting the module to bf16 must not round the frequencies
        # (`_apply` moves it with the module's device, so no host copy happens inside CUDA-graph capture).
        self.inv_freq = rope_inv_freq(int(spec.head_dim * spec.partial_rotary_factor), spec.rope_theta)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self.inv_freq = self.inv_freq.to(fn(torch.zeros(())).device)
        return self

    def forward(self, x, positions, mask, cache: KVCache | None = None):
        cos, sin = rope_cos_sin(positions, self.inv_freq, x.dtype)
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache=cache, positions=positions)
        return x + self.mlp(self.post_attention_layernorm(x))

    def new_cache(self, batch: int, max_len: int, dtype, device) -> KVCache:
        a = self.self_attn
        return KVCache(batch, a.num_kv_heads, max_len, a.head_dim, dtype, device)


def _qwen35_spec(cfg: dict) -> MTPSpec:
    if rope_type(cfg) != "default":
        raise MTPLoadError(f"{cfg.get('model_type')} MTP: rope_type {rope_type(cfg)!r} is not supported "
                           "(only 'default')")
    heads = cfg["num_attention_heads"]
    partial = cfg.get("partial_rotary_factor", rope_parameters(cfg).get("partial_rotary_factor", 0.25))
    return MTPSpec(family=cfg.get("model_type", "qwen3_5"), hidden_size=cfg["hidden_size"], num_attention_heads=heads,
                   num_key_value_heads=cfg.get("num_key_value_heads", heads),
                   head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
                   intermediate_size=cfg.get("intermediate_size") or cfg.get("shared_expert_intermediate_size") or 0,
                   rms_norm_eps=cfg.get("rms_norm_eps", 1e-6), rope_theta=rope_theta(cfg),
                   partial_rotary_factor=float(partial), zero_centered_norm=True,
                   attention_bias=cfg.get("attention_bias", False))


def _qwen35_block(spec: MTPSpec, cfg: dict, keys: list[str] | None = None) -> Qwen35MTPBlock:
    """Dense SwiGLU or MoE, and the expert layout, from the checkpoint's keys (else from the config)."""
    if keys is not None:
        moe = "mlp.gate.weight" in keys
    else:
        moe = bool(cfg.get("num_experts"))
    if moe:
        mlp = Qwen35SparseMoE(spec.hidden_size, cfg["num_experts"], cfg["num_experts_per_tok"],
                              cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"],
                              cfg.get("norm_topk_prob", True), packed=_packed_experts(keys))
    else:
        if not cfg.get("intermediate_size"):
            raise MTPLoadError(f"{cfg.get('model_type')} MTP has a dense MLP but the config has no intermediate_size")
        mlp = Qwen3MLP(spec.hidden_size, cfg["intermediate_size"])
    return Qwen35MTPBlock(spec, mlp)


# ----------------------------------------------------------------------------------------------------
# DeepSeek-V3 / GLM-4-MoE: our decoder layers (shared with the static-cache target runners)
# ----------------------------------------------------------------------------------------------------

class _RotaryMTPBlock:
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


class DeepseekV3MTPBlock(_RotaryMTPBlock, MLADecoderLayer):
    """DeepSeek-V3 MTP decoder layer: MLA (latent-space attention over an `MLACache`) + MoE or dense MLP."""

    def __init__(self, config, mlp: nn.Module, rotary: nn.Module):
        MLADecoderLayer.__init__(self, MLAttention.from_config(config), mlp, config.hidden_size, config.rms_norm_eps)
        self._hf = {"rotary": rotary}


class Glm4MoeMTPBlock(_RotaryMTPBlock, Qwen3DecoderLayer):
    """GLM-4-MoE MTP decoder layer: GQA (partial rotary, q/k/v biases, q/k norms if `use_qk_norm`) + MoE or
    dense MLP, over a `KVCache`."""

    def __init__(self, config, mlp: nn.Module, rotary: nn.Module):
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        Qwen3DecoderLayer.__init__(self, config.hidden_size, heads, config.num_key_value_heads, head_dim, 1,
                                   config.rms_norm_eps, bool(config.attention_bias))
        self.mlp = mlp  # replaces the layer's placeholder SwiGLU of width 1
        if not config.use_qk_norm:
            self.self_attn.q_norm, self.self_attn.k_norm = nn.Identity(), nn.Identity()
        self._hf = {"rotary": rotary}

    def new_cache(self, batch: int, max_len: int, dtype, device) -> KVCache:
        a = self.self_attn
        return KVCache(batch, a.num_kv_heads, max_len, a.head_dim, dtype, device)


def _hf_config(config_cls, cfg: dict):
    """transformers' config object of the family: its class defaults fill what config.json leaves out."""
    return config_cls.from_dict({k: v for k, v in cfg.items() if k not in ("quantization_config",)})


def _moe_family_block(block_cls, config, rotary_cls, cfg: dict, keys: list[str] | None) -> nn.Module:
    """The MTP layer (index num_hidden_layers) of a DeepSeek-V3 / GLM-4-MoE config: MoE from
    `first_k_dense_replace` on, as transformers decides; experts in the checkpoint's layout."""
    if cfg.get("hidden_act", "silu") != "silu":
        raise MTPLoadError(f"{cfg.get('model_type')} MTP: hidden_act {cfg['hidden_act']!r} is not supported")
    rotary = rotary_cls(config=config)
    # Built on the meta device, then materialised with zeros: real MoE blocks hold billions of weights,
    # which need no random init (every tensor is then loaded).
    with torch.device("meta"):
        if cfg["num_hidden_layers"] >= config.first_k_dense_replace:
            mlp = sigmoid_moe_from_config(config, packed=_packed_experts(keys))
        else:
            mlp = Qwen3MLP(config.hidden_size, config.intermediate_size)
        block = block_cls(config, mlp, rotary)
    block = block.to_empty(device="cpu")
    with torch.no_grad():
        for t in [*block.parameters(), *block.buffers()]:
            t.zero_()
    return block


def _deepseek_v3_spec(cfg: dict) -> MTPSpec:
    heads = cfg["num_attention_heads"]
    return MTPSpec(family="deepseek_v3", hidden_size=cfg["hidden_size"], num_attention_heads=heads,
                   num_key_value_heads=cfg.get("num_key_value_heads", heads),
                   head_dim=cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"],
                   intermediate_size=cfg.get("moe_intermediate_size") or cfg["intermediate_size"],
                   rms_norm_eps=cfg.get("rms_norm_eps", 1e-6), rope_theta=rope_theta(cfg),
                   attention_bias=cfg.get("attention_bias", False))


def _deepseek_v3_block(spec: MTPSpec, cfg: dict, keys: list[str] | None = None) -> DeepseekV3MTPBlock:
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding

    config = _hf_config(DeepseekV3Config, cfg)
    return _moe_family_block(DeepseekV3MTPBlock, config, DeepseekV3RotaryEmbedding, cfg, keys)


def _glm4_moe_spec(cfg: dict) -> MTPSpec:
    heads = cfg["num_attention_heads"]
    return MTPSpec(family="glm4_moe", hidden_size=cfg["hidden_size"], num_attention_heads=heads,
                   num_key_value_heads=cfg.get("num_key_value_heads", heads),
                   head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
                   intermediate_size=cfg.get("moe_intermediate_size") or cfg["intermediate_size"],
                   rms_norm_eps=cfg.get("rms_norm_eps", 1e-5), rope_theta=rope_theta(cfg),
                   partial_rotary_factor=float(cfg.get("partial_rotary_factor",
                                                       rope_parameters(cfg).get("partial_rotary_factor", 0.5))),
                   attention_bias=cfg.get("attention_bias", False))


def _glm4_moe_block(spec: MTPSpec, cfg: dict, keys: list[str] | None = None) -> Glm4MoeMTPBlock:
    from transformers import Glm4MoeConfig
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeRotaryEmbedding

    config = _hf_config(Glm4MoeConfig, cfg)
    return _moe_family_block(Glm4MoeMTPBlock, config, Glm4MoeRotaryEmbedding, cfg, keys)


# model_type -> (spec builder, block factory); registered by dmtp.models.mtp_loading.
_QWEN35 = (_qwen35_spec, _qwen35_block)
FAMILIES = {
    "qwen3_next": _QWEN35,
    "qwen3_5": _QWEN35,
    "qwen3_5_text": _QWEN35,
    "qwen3_5_moe": _QWEN35,
    "qwen3_5_moe_text": _QWEN35,
    "deepseek_v3": (_deepseek_v3_spec, _deepseek_v3_block),
    "glm4_moe": (_glm4_moe_spec, _glm4_moe_block),
}


def block_accepts_keys(factory) -> bool:
    """Whether a family's block factory takes the checkpoint's block-relative tensor names (`keys=`)."""
    try:
        return "keys" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


__all__ = ["FAMILIES", "Qwen35MTPBlock", "Qwen35GatedAttention", "Qwen35SparseMoE", "PerExpertSwiGLU", "PackedSwiGLU",
           "DeepseekV3MTPBlock", "Glm4MoeMTPBlock", "block_accepts_keys"]
