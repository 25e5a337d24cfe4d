"""The GLM-4-MoE family (GLM-4.5 / 4.6 / 4.7 and -Air).

MTP (`Glm4MoeMTPBlock`, stored as `model.layers.{num_hidden_layers}.*`): our own decoder layer (GQA with
partial rotary, optional q/k norms and q/k/v biases: `Qwen3DecoderLayer`), then the sigmoid group-limited
MoE with shared experts or a dense SwiGLU, as for DeepSeek-V3; transformers' rotary embedding of the family.

Runner (`Glm4MoeTargetRunner`): GLM-4-MoE layers are GQA attention with partial rotary (the first
`head_dim * partial_rotary_factor` dims, rotate-half), q/k/v biases, optional per-head q/k RMSNorms (`use_qk_norm`), then a dense SwiGLU
for the first `first_k_dense_replace` layers and the sigmoid group-limited MoE with shared experts after.
That attention is exactly `Qwen3DecoderLayer`'s (with Identity q/k norms when absent), so this runner is
the dense `FastTargetRunner` (static KV caches, per-request lengths, flash-attn on CUDA, graph-safe)
with the MoE bound in place of the dense MLP where the layer has one.
"""
from __future__ import annotations

from torch import nn

from dmtp.decode.runners.base import ATTENTION_PROJECTIONS
from dmtp.decode.runners.moe import bind_mlp, moe_family_unsupported
from dmtp.families.base import Family
from dmtp.families.dense import FastTargetRunner, bind_decoder_layer
from dmtp.models.mtp import MTPSpec, RotaryMTPBlock, hf_family_config, moe_mtp_block
from dmtp.models.qwen3 import KVCache, Qwen3DecoderLayer
from dmtp.models.rope_config import rope_parameters, rope_theta
from dmtp.models.target import TargetModel


# ----------------------------------------------------------------------------------------------------
# the native MTP
# ----------------------------------------------------------------------------------------------------

class Glm4MoeMTPBlock(RotaryMTPBlock, Qwen3DecoderLayer):
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


def glm4_moe_mtp_spec(cfg: dict) -> MTPSpec:
    heads = cfg["num_attention_heads"]
    return MTPSpec(family="glm4_moe", hidden_size=cfg["hidden_size"], num_attention_heads=heads,
                   num_key_value_heads=cfg.get("num_key_value_heads", heads),
                   head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
                   intermediate_size=cfg.get("moe_intermediate_size") or cfg["intermediate_size"],
                   rms_norm_eps=cfg.get("rms_norm_eps", 1e-5), rope_theta=rope_theta(cfg),
                   partial_rotary_factor=float(cfg.get("partial_rotary_factor",
                                                       rope_parameters(cfg).get("partial_rotary_factor", 0.5))),
                   attention_bias=cfg.get("attention_bias", False))


def glm4_moe_mtp_block(spec: MTPSpec, cfg: dict, keys: list[str] | None = None) -> Glm4MoeMTPBlock:
    from transformers import Glm4MoeConfig
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeRotaryEmbedding

    config = hf_family_config(Glm4MoeConfig, cfg)
    return moe_mtp_block(Glm4MoeMTPBlock, config, Glm4MoeRotaryEmbedding, cfg, keys)



# ----------------------------------------------------------------------------------------------------
# the static-cache runner
# ----------------------------------------------------------------------------------------------------

def glm_runner_unsupported(target: TargetModel) -> str | None:
    """Why the GLM-4-MoE runner cannot drive this target (None when it can)."""
    return moe_family_unsupported(target, "glm4_moe", ATTENTION_PROJECTIONS)


def bind_glm_layer(src: nn.Module, cfg) -> Qwen3DecoderLayer:
    """Our decoder layer on `src`'s own parameters: attention and norms as the dense runner binds them,
    the MLP dense or MoE."""
    return bind_decoder_layer(src, cfg, mlp=bind_mlp(src.mlp, cfg))


class Glm4MoeTargetRunner(FastTargetRunner):
    kind = "glm4_moe"
    family = "glm4_moe"
    why_unsupported = staticmethod(glm_runner_unsupported)
    bind_layer = staticmethod(bind_glm_layer)


FAMILY = Family(name="glm4_moe", title="GLM-4-MoE (GLM-4.5 / 4.6 / 4.7, -Air)", model_types=("glm4_moe",),
                mtp_layout="deepseek", mtp_spec=glm4_moe_mtp_spec, mtp_block=glm4_moe_mtp_block,
                runner=Glm4MoeTargetRunner, micro="glm4_moe", test="tests/test_deepseek_glm_runner.py")

__all__ = ["FAMILY", "Glm4MoeTargetRunner", "Glm4MoeMTPBlock", "glm_runner_unsupported", "bind_glm_layer"]
