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

DeepSeek-V3 / GLM-4-MoE (`HFDecoderMTPBlock`): transformers' own decoder layer (`DeepseekV3DecoderLayer`,
`Glm4MoeDecoderLayer`, layer_idx = num_hidden_layers: its attention, router, shared experts and norms)
and rotary embedding, wrapped to the protocol; plain x*w norms. Only the routed-experts container is
ours: `PerExpertSwiGLU` for the released per-expert layout (`mlp.experts.{e}.{gate,up,down}_proj.weight`)
or `PackedSwiGLU` for `gate_up_proj`/`down_proj` re-packs, so parameter names match the checkpoint and
the experts can run inside CUDA-graph capture. The router stays fp32 when the block is cast (as
transformers keeps it). Incremental decoding passes a static `RowCache` as the layer's `cache`: transformers'
attention hands it the rows' freshly computed K/V (DeepSeek: the compressed latent and the roped key),
it scatters them at the rows' positions and returns the whole static buffer, and the layer attends
over it under our mask. That is exact and costs O(max_len) per row (MLA re-expands the cached latents
of all max_len slots through kv_b_proj each call, as transformers' own MLA cache path does).
"""
from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from torch import nn

from dmtp.models.mtp import MTPSpec
from dmtp.models.qwen3 import KVCache, Qwen3MLP, RMSNorm, apply_rope, attend, rope_cos_sin, rope_inv_freq


def _error(message: str) -> Exception:
    from dmtp.models.mtp_loading import MTPLoadError  # lazy: mtp_loading imports this module

    return MTPLoadError(message)


def _rope_params(cfg: dict) -> dict:
    return cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}


def _rope_theta(cfg: dict) -> float:
    return float(_rope_params(cfg).get("rope_theta", cfg.get("rope_theta", 10000.0)))


# ----------------------------------------------------------------------------------------------------
# Mixture-of-experts pieces shared by the families
# ----------------------------------------------------------------------------------------------------

class _SwiGLUExperts(nn.Module):
    """Routed SwiGLU experts; call signature as transformers' experts: (hidden [N,H], top_k_index [N,K],
    top_k_weights [N,K]) -> sum_k w[n,k] * expert_{idx[n,k]}(hidden[n]).

    Eagerly each expert runs on its own tokens only (one host sync to list the hit experts). While a
    CUDA graph is being captured (or with `sync_free = True`) every expert runs on every token with a
    zero weight where it is not routed: exact, no host sync, fixed shapes, E times the expert FLOPs."""

    sync_free = False

    def _expert(self, e: int, h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(hidden)
        if self.sync_free or (hidden.is_cuda and torch.cuda.is_current_stream_capturing()):
            dense = torch.zeros(hidden.shape[0], self.num_experts, dtype=top_k_weights.dtype, device=hidden.device)
            dense.scatter_(1, top_k_index, top_k_weights)
            for e in range(self.num_experts):
                out += (self._expert(e, hidden) * dense[:, e, None]).to(out.dtype)
            return out
        for e in torch.unique(top_k_index).tolist():
            token, slot = torch.where(top_k_index == e)
            y = self._expert(e, hidden[token]) * top_k_weights[token, slot, None]
            out.index_add_(0, token, y.to(out.dtype))
        return out


class PerExpertSwiGLU(_SwiGLUExperts):
    """Experts as `{e}.gate_proj / up_proj / down_proj` (the per-expert checkpoint layout)."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.num_experts = num_experts
        for e in range(num_experts):
            self.add_module(str(e), Qwen3MLP(hidden_size, intermediate_size))

    def _expert(self, e: int, h: torch.Tensor) -> torch.Tensor:
        return self._modules[str(e)](h)


class PackedSwiGLU(_SwiGLUExperts):
    """Experts as `gate_up_proj` [E, 2*Im, H] (rows 0..Im-1 = gate) and `down_proj` [E, H, Im]."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.num_experts = num_experts
        self.gate_up_proj = nn.Parameter(torch.zeros(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.zeros(num_experts, hidden_size, intermediate_size))

    def _expert(self, e: int, h: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(h, self.gate_up_proj[e]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.down_proj[e])


def _packed_experts(keys: list[str] | None, prefix: str = "mlp.experts.") -> bool:
    return keys is not None and any(k.startswith(prefix + "gate_up_proj") for k in keys)


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

    def forward(self, x, cos, sin, mask, cache: KVCache | None = None, positions=None):
        b, t, _ = x.shape
        q, gate = self.q_proj(x).view(b, t, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        q = apply_rope(self.q_norm(q).transpose(1, 2), cos, sin)
        k = self.k_norm(self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        k = apply_rope(k, cos, sin)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if cache is not None:
            cache.write(positions, k, v)
            k, v = cache.k, cache.v
        out = attend(q, k, v, mask).transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(out * torch.sigmoid(gate.reshape(b, t, -1)))


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
    rope = _rope_params(cfg)
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise _error(f"{cfg.get('model_type')} MTP: rope_type {rope_type!r} is not supported (only 'default')")
    heads = cfg["num_attention_heads"]
    partial = cfg.get("partial_rotary_factor", rope.get("partial_rotary_factor", 0.25))
    return MTPSpec(family=cfg.get("model_type", "qwen3_5"), hidden_size=cfg["hidden_size"], num_attention_heads=heads,
                   num_key_value_heads=cfg.get("num_key_value_heads", heads),
                   head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
                   intermediate_size=cfg.get("intermediate_size") or cfg.get("shared_expert_intermediate_size") or 0,
                   rms_norm_eps=cfg.get("rms_norm_eps", 1e-6), rope_theta=_rope_theta(cfg),
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
            raise _error(f"{cfg.get('model_type')} MTP has a dense MLP but the config has no intermediate_size")
        mlp = Qwen3MLP(spec.hidden_size, cfg["intermediate_size"])
    return Qwen35MTPBlock(spec, mlp)


# ----------------------------------------------------------------------------------------------------
# DeepSeek-V3 / GLM-4-MoE: transformers' decoder layer wrapped to the block protocol
# ----------------------------------------------------------------------------------------------------

class RowCache:
    """Static per-request cache handed to a transformers attention layer as its `cache`.

    The layer calls `update(a, b, layer_idx, ...)` with the new rows' cached tensors ([B, heads, T, d];
    DeepSeek MLA: normed latent and roped shared key; GLM: key and value); they are written at the rows'
    positions (set by the block before the call) and the full [B, heads, max_len, d] buffers returned.
    Nothing is cropped: stale slots are hidden by the caller's mask and overwritten by later writes.
    Buffers are allocated up front (`shapes` = ((heads_a, d_a), (heads_b, d_b))), so a captured CUDA
    graph only writes into them."""

    def __init__(self, batch: int, max_len: int, shapes, dtype, device):
        (ha, da), (hb, db) = shapes
        self.a = torch.zeros(batch, ha, max_len, da, dtype=dtype, device=device)
        self.b = torch.zeros(batch, hb, max_len, db, dtype=dtype, device=device)
        self.positions: torch.Tensor | None = None

    @property
    def max_len(self) -> int:
        return self.a.shape[2]

    def _write(self, buf, new):
        if new.shape[1] != buf.shape[1] or new.shape[3] != buf.shape[3]:
            raise RuntimeError(f"RowCache: rows of shape {list(new.shape)} do not fit a {list(buf.shape)} buffer")
        idx = self.positions[:, None, :, None].expand(-1, new.shape[1], -1, new.shape[3])
        buf.scatter_(2, idx, new.to(buf.dtype))

    def update(self, a: torch.Tensor, b: torch.Tensor, layer_idx: int = 0, *args, **kwargs):
        if self.positions is None:
            raise RuntimeError("RowCache.update called outside HFDecoderMTPBlock.forward")
        self._write(self.a, a)
        self._write(self.b, b)
        return self.a, self.b


class HFDecoderMTPBlock(nn.Module):
    """A transformers decoder layer as the MTP block.

    The layer's submodules are registered directly on this module (so parameter names are the layer's
    own: `self_attn.*`, `mlp.*`, `input_layernorm`, ...); the layer object itself and its rotary embedding
    are kept outside the module tree (the rotary's fp32 frequencies must not be cast with the weights)."""

    def __init__(self, layer: nn.Module, rotary: nn.Module, cache_shapes):
        super().__init__()
        self.cache_shapes = cache_shapes
        for name, child in layer.named_children():
            self.add_module(name, child)
        if list(layer.named_parameters(recurse=False)) or list(layer.named_buffers(recurse=False)):
            raise TypeError(f"{type(layer).__name__} has own parameters; cannot wrap it")
        self._hf = {"layer": layer, "rotary": rotary}

    @property
    def hf_layer(self) -> nn.Module:
        return self._hf["layer"]

    def _apply(self, fn, recurse=True):
        """Like transformers' `_keep_in_fp32_modules_strict`: the MoE router (`mlp.gate`: weight and
        e_score_correction_bias) follows device moves but stays fp32 when the block is cast; so does
        the rotary embedding (kept on the block's device: no host copy inside CUDA-graph capture)."""
        device = fn(torch.zeros(())).device
        mlp = self._modules.get("mlp")
        router = mlp._modules.get("gate") if mlp is not None else None
        keep_router = router is not None and not isinstance(router, nn.Linear)
        if keep_router:
            del mlp._modules["gate"]
        try:
            super()._apply(fn, recurse)
        finally:
            if keep_router:
                mlp._modules["gate"] = router
        for module in [self._hf["rotary"]] + ([router] if keep_router else []):
            module._apply(lambda t: t.to(device))
        return self

    def train(self, mode: bool = True):
        super().train(mode)
        self.hf_layer.training = mode
        return self

    def forward(self, x, positions, mask, cache: RowCache | None = None):
        cos, sin = self._hf["rotary"](x, positions)
        visible = mask | ~mask.any(-1, keepdim=True)          # a fully masked row attends anywhere (unused)
        additive = torch.zeros(visible.shape, dtype=x.dtype, device=x.device)
        additive = additive.masked_fill(~visible, torch.finfo(x.dtype).min)
        if cache is not None:
            cache.positions = positions
        try:
            return self.hf_layer(x, attention_mask=additive, position_ids=positions, cache=cache,
                                 position_embeddings=(cos, sin))
        finally:
            if cache is not None:
                cache.positions = None

    def new_cache(self, batch: int, max_len: int, dtype, device) -> RowCache:
        return RowCache(batch, max_len, self.cache_shapes, dtype, device)


def _hf_config(config_cls, cfg: dict):
    config = config_cls.from_dict({k: v for k, v in cfg.items() if k not in ("quantization_config",)})
    config._attn_implementation = "sdpa"
    return config


def _hf_block(layer_cls, rotary_cls, config_cls, cfg: dict, keys: list[str] | None, cache_shapes) -> HFDecoderMTPBlock:
    if cfg.get("hidden_act", "silu") != "silu":
        raise _error(f"{cfg.get('model_type')} MTP: hidden_act {cfg['hidden_act']!r} is not supported")
    config = _hf_config(config_cls, cfg)
    # Built on the meta device, then materialised: transformers' packed experts would otherwise be
    # allocated (uninitialised, fp32) even when they are replaced below. Every tensor is then loaded.
    with torch.device("meta"):
        layer = layer_cls(config, layer_idx=cfg["num_hidden_layers"])
        if getattr(layer.mlp, "experts", None) is not None:
            # Released checkpoints store experts one by one (`experts.{e}.*`); re-packs use transformers'
            # `gate_up_proj`/`down_proj`. Our expert modules mirror either layout by name and also run
            # inside CUDA-graph capture (transformers' expert loop needs host syncs).
            experts = PackedSwiGLU if _packed_experts(keys) else PerExpertSwiGLU
            layer.mlp.experts = experts(config.n_routed_experts, config.hidden_size, config.moe_intermediate_size)
    persistent = set(layer.state_dict())
    transient = [n for n, _ in layer.named_buffers() if n not in persistent]
    if transient:
        raise TypeError(f"{layer_cls.__name__} has non-persistent buffers {transient}; they would not be loaded")
    layer = layer.to_empty(device="cpu")
    with torch.no_grad():
        for t in [*layer.parameters(), *layer.buffers()]:
            t.zero_()
    return HFDecoderMTPBlock(layer, rotary_cls(config=config), cache_shapes)


def _deepseek_v3_spec(cfg: dict) -> MTPSpec:
    heads = cfg["num_attention_heads"]
    return MTPSpec(family="deepseek_v3", hidden_size=cfg["hidden_size"], num_attention_heads=heads,
                   num_key_value_heads=cfg.get("num_key_value_heads", heads),
                   head_dim=cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"],
                   intermediate_size=cfg.get("moe_intermediate_size") or cfg["intermediate_size"],
                   rms_norm_eps=cfg.get("rms_norm_eps", 1e-6), rope_theta=_rope_theta(cfg),
                   attention_bias=cfg.get("attention_bias", False))


def _deepseek_v3_block(spec: MTPSpec, cfg: dict, keys: list[str] | None = None) -> HFDecoderMTPBlock:
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer, DeepseekV3RotaryEmbedding

    # MLA caches the normed latent [1 head, kv_lora_rank] and the roped shared key [1 head, qk_rope_head_dim].
    shapes = ((1, cfg["kv_lora_rank"]), (1, cfg["qk_rope_head_dim"]))
    return _hf_block(DeepseekV3DecoderLayer, DeepseekV3RotaryEmbedding, DeepseekV3Config, cfg, keys, shapes)


def _glm4_moe_spec(cfg: dict) -> MTPSpec:
    heads = cfg["num_attention_heads"]
    return MTPSpec(family="glm4_moe", hidden_size=cfg["hidden_size"], num_attention_heads=heads,
                   num_key_value_heads=cfg.get("num_key_value_heads", heads),
                   head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
                   intermediate_size=cfg.get("moe_intermediate_size") or cfg["intermediate_size"],
                   rms_norm_eps=cfg.get("rms_norm_eps", 1e-5), rope_theta=_rope_theta(cfg),
                   partial_rotary_factor=float(cfg.get("partial_rotary_factor",
                                                       _rope_params(cfg).get("partial_rotary_factor", 0.5))),
                   attention_bias=cfg.get("attention_bias", False))


def _glm4_moe_block(spec: MTPSpec, cfg: dict, keys: list[str] | None = None) -> HFDecoderMTPBlock:
    from transformers import Glm4MoeConfig
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeDecoderLayer, Glm4MoeRotaryEmbedding

    kv = (spec.num_key_value_heads, spec.head_dim)
    return _hf_block(Glm4MoeDecoderLayer, Glm4MoeRotaryEmbedding, Glm4MoeConfig, cfg, keys, (kv, kv))


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
           "HFDecoderMTPBlock", "RowCache", "block_accepts_keys"]
