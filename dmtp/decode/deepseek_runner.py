"""Static-cache target runner for DeepSeek-V3 (MLA attention, sigmoid group-limited MoE).

The dense `FastTargetRunner`'s forward (embedding, per-layer static caches at per-request positions,
taps, final norm, head; rollback = not advancing `lengths`), with DeepSeek-V3 layers bound to the HF
model's own Parameters: `dmtp.models.mla.MLADecoderLayer` (latent cache c_kv [B, Lmax, kv_lora_rank] and
roped shared key k_pe [B, Lmax, qk_rope_head_dim] per layer; kv_b_proj absorbed into the query and output
sides, so attention runs in latent space) and a dense SwiGLU (the first `first_k_dense_replace` layers)
or `SigmoidMoE`. q_lora (q_a_proj, q_a_layernorm, q_b_proj) or a plain q_proj, as the config says;
RoPE interleaved or not; "default" and "yarn" rope (cos/sin scaled by transformers' attention factor,
softmax scale by mscale^2). Every shape is static and every position a device tensor, so verify is
graph-capturable; there is no flash-attn path (MLA's latent head is 576 wide on the real model).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from dmtp.decode.moe_binding import bind_mlp, check_bound, moe_family_unsupported
from dmtp.decode.runner_base import bind_linear, bind_norm
from dmtp.decode.target_runner import FastTargetRunner
from dmtp.models.mla import MLACache, MLADecoderLayer, MLAttention, mla_softmax_scale
from dmtp.models.rope_config import rope_parameters
from dmtp.models.target import TargetModel

_PROJECTIONS = ("q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")
_LATENT_NORMS = ("q_a_layernorm", "kv_a_layernorm")


def deepseek_runner_unsupported(target: TargetModel) -> str | None:
    """Why the DeepSeek-V3 runner cannot drive this target (None when it can)."""
    why = moe_family_unsupported(target, "deepseek_v3", ("kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj"))
    if why:
        return why
    cfg = target.config
    ours = mla_softmax_scale(cfg.qk_nope_head_dim + cfg.qk_rope_head_dim, rope_parameters(cfg))
    theirs = getattr(target.hf.model.layers[0].self_attn, "scaling", ours)
    if not math.isclose(ours, float(theirs), rel_tol=1e-9):
        return f"softmax scale {theirs} (transformers) differs from the MLA rule's {ours}"
    return None


def bind_mla_layer(src: nn.Module, cfg) -> MLADecoderLayer:
    """An `MLADecoderLayer` whose parameters are `src`'s own Parameter objects (no copy)."""
    with torch.device("meta"):
        layer = MLADecoderLayer(MLAttention.from_config(cfg), nn.Identity(), cfg.hidden_size, cfg.rms_norm_eps)
    layer.mlp = bind_mlp(src.mlp, cfg)
    for name in _PROJECTIONS:
        if getattr(src.self_attn, name, None) is not None:
            bind_linear(getattr(layer.self_attn, name), getattr(src.self_attn, name))
    for name in _LATENT_NORMS:
        if getattr(src.self_attn, name, None) is not None:
            bind_norm(getattr(layer.self_attn, name), getattr(src.self_attn, name))
    bind_norm(layer.input_layernorm, src.input_layernorm)
    bind_norm(layer.post_attention_layernorm, src.post_attention_layernorm)
    return check_bound(layer, src)


class DeepseekV3TargetRunner(FastTargetRunner):
    kind = "deepseek_v3"
    why_unsupported = staticmethod(deepseek_runner_unsupported)
    bind_layer = staticmethod(bind_mla_layer)

    def _pick_attention(self, attention: str) -> str:
        if attention not in ("auto", "sdpa", "flash"):
            raise ValueError(f"attention must be auto|sdpa|flash, got {attention!r}")
        if attention == "flash":
            raise ValueError("attention='flash' is not available for MLA (DeepSeek-V3): use auto")
        return "latent"   # MLA's own latent-space attention (dmtp.models.mla), on every device

    def new_cache(self, batch_size: int, max_len: int) -> MLACache:
        return self.layers[0].new_cache(batch_size, max_len, self.dtype, self.device)


__all__ = ["DeepseekV3TargetRunner", "deepseek_runner_unsupported", "bind_mla_layer"]
