"""Static-cache runner for GLM-4-MoE (GLM-4.5 / 4.6 / 4.7 and -Air).

GLM-4-MoE layers are GQA attention with partial rotary (the first `head_dim * partial_rotary_factor`
dims, rotate-half), q/k/v biases, optional per-head q/k RMSNorms (`use_qk_norm`), then a dense SwiGLU
for the first `first_k_dense_replace` layers and the sigmoid group-limited MoE with shared experts after.
That attention is exactly `Qwen3DecoderLayer`'s (with Identity q/k norms when absent), so this runner is
the dense `FastTargetRunner` (static KV caches, per-request lengths, flash-attn on CUDA, graph-safe)
with the MoE bound in place of the dense MLP where the layer has one.
"""
from __future__ import annotations

from torch import nn

from dmtp.decode.runners.dense import ATTENTION_PROJECTIONS, FastTargetRunner, bind_decoder_layer
from dmtp.decode.runners.moe import bind_mlp, moe_family_unsupported
from dmtp.models.qwen3 import Qwen3DecoderLayer
from dmtp.models.target import TargetModel


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


__all__ = ["Glm4MoeTargetRunner", "glm_runner_unsupported", "bind_glm_layer"]
