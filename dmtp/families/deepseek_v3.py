"""The DeepSeek-V3 family (MLA attention, sigmoid group-limited MoE).

MTP (`DeepseekV3MTPBlock`, stored as `model.layers.{num_hidden_layers}.*`): our own MLA decoder layer, the
class the runner binds to the target's weights, attending in latent space over a static latent cache
(`dmtp.models.mla`; the cached latents are never re-expanded through kv_b_proj), then the sigmoid
group-limited MoE with shared experts (`dmtp.models.moe`: per-expert or packed routed experts, as the
checkpoint stores them; the router stays fp32 when the block is cast, as transformers keeps it) or a
dense SwiGLU. Rotary cos/sin come from transformers' own rotary embedding of the family (YaRN), built
from the config; plain x*w norms.

Runner (`DeepseekV3TargetRunner`): the dense runner's forward (`StaticCacheRunner`: embedding, per-layer
static caches at per-request positions, taps, final norm, head; rollback = not advancing `lengths`), with DeepSeek-V3 layers bound to
the HF model's own Parameters: `dmtp.models.mla.MLADecoderLayer` (latent cache c_kv [B, Lmax, kv_lora_rank]
and roped shared key k_pe [B, Lmax, qk_rope_head_dim] per layer; kv_b_proj absorbed into the query and
output sides, so attention runs in latent space) and a dense SwiGLU (the first `first_k_dense_replace`
layers) or `SigmoidMoE`. q_lora (q_a_proj, q_a_layernorm, q_b_proj) or a plain q_proj, as the config says;
RoPE interleaved or not; "default" and "yarn" rope (cos/sin scaled by transformers' attention factor,
softmax scale by mscale^2). Every shape is static and every position a device tensor, so verify is
graph-capturable; there is no flash-attn path (MLA's latent head is 576 wide on the real model).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from dmtp.decode.runners.base import LAYER_NORMS, bind, check_attention_choice, check_bound
from dmtp.decode.runners.moe import bind_mlp, moe_family_unsupported
from dmtp.families.base import Family
from dmtp.families.dense import FastTargetRunner
from dmtp.models.mla import MLACache, MLADecoderLayer, MLAttention, mla_softmax_scale
from dmtp.models.mtp import MTPSpec, RotaryMTPBlock, hf_family_config, moe_mtp_block
from dmtp.models.rope_config import rope_parameters, rope_theta
from dmtp.models.target import TargetModel

# Each present or not as the config says (q_lora or a plain q_proj).
_ATTENTION_PARTS = ("q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj",
                    "q_a_layernorm", "kv_a_layernorm")


# ----------------------------------------------------------------------------------------------------
# the native MTP
# ----------------------------------------------------------------------------------------------------

class DeepseekV3MTPBlock(RotaryMTPBlock, MLADecoderLayer):
    """DeepSeek-V3 MTP decoder layer: MLA (latent-space attention over an `MLACache`) + MoE or dense MLP."""

    def __init__(self, config, mlp: nn.Module, rotary: nn.Module):
        MLADecoderLayer.__init__(self, MLAttention.from_config(config), mlp, config.hidden_size, config.rms_norm_eps)
        self._hf = {"rotary": rotary}


def deepseek_v3_mtp_spec(cfg: dict) -> MTPSpec:
    heads = cfg["num_attention_heads"]
    return MTPSpec(family="deepseek_v3", hidden_size=cfg["hidden_size"], num_attention_heads=heads,
                   num_key_value_heads=cfg.get("num_key_value_heads", heads),
                   head_dim=cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"],
                   intermediate_size=cfg.get("moe_intermediate_size") or cfg["intermediate_size"],
                   rms_norm_eps=cfg.get("rms_norm_eps", 1e-6), rope_theta=rope_theta(cfg),
                   attention_bias=cfg.get("attention_bias", False))


def deepseek_v3_mtp_block(spec: MTPSpec, cfg: dict, keys: list[str] | None = None) -> DeepseekV3MTPBlock:
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding

    config = hf_family_config(DeepseekV3Config, cfg)
    return moe_mtp_block(DeepseekV3MTPBlock, config, DeepseekV3RotaryEmbedding, cfg, keys)



# ----------------------------------------------------------------------------------------------------
# the static-cache runner
# ----------------------------------------------------------------------------------------------------

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
    bind(layer.self_attn, src.self_attn, _ATTENTION_PARTS, optional=True)
    bind(layer, src, LAYER_NORMS)
    return check_bound(layer, src)


class DeepseekV3TargetRunner(FastTargetRunner):
    kind = "deepseek_v3"
    family = "deepseek_v3"
    why_unsupported = staticmethod(deepseek_runner_unsupported)
    bind_layer = staticmethod(bind_mla_layer)

    def _pick_attention(self, attention: str) -> str:
        check_attention_choice(attention)
        if attention == "flash":
            raise ValueError("attention='flash' is not available for MLA (DeepSeek-V3): use auto")
        return "latent"   # MLA's own latent-space attention (dmtp.models.mla), on every device

    def new_cache(self, layer: nn.Module, batch_size: int, max_len: int) -> MLACache:
        return layer.new_cache(batch_size, max_len, self.dtype, self.device)


FAMILY = Family(name="deepseek_v3", title="DeepSeek-V3", model_types=("deepseek_v3",), mtp_layout="deepseek",
                mtp_spec=deepseek_v3_mtp_spec, mtp_block=deepseek_v3_mtp_block, runner=DeepseekV3TargetRunner,
                micro="deepseek_v3", test="tests/test_deepseek_glm_runner.py")

__all__ = ["FAMILY", "DeepseekV3TargetRunner", "DeepseekV3MTPBlock", "deepseek_runner_unsupported", "bind_mla_layer"]
