"""Binding transformers' MoE MLPs to ours by reference, and their coverage checks: the sigmoid
group-limited MoE with shared experts (DeepSeek-V3, GLM-4-MoE) and what every MoE family shares,
transformers' packed experts.

Our MoE is `dmtp.models.moe.SigmoidMoE` (the class the MTP blocks use), whose parameters ARE the HF
module's (`mlp.gate.weight`, `mlp.gate.e_score_correction_bias`, the experts, `mlp.shared_experts.*`).
transformers keeps routed experts packed in memory (`gate_up_proj` [E, 2*Im, H], gate rows first, and
`down_proj` [E, H, Im]) whatever layout the checkpoint stores (it converts per-expert checkpoints on
load); a module that holds them one by one (`experts.{e}.gate_proj ...`) binds to `PerExpertSwiGLU`.
"""
from __future__ import annotations

import torch
from torch import nn

from dmtp.decode.runners.base import SWIGLU, activation_unsupported, bind, stack_unsupported
from dmtp.models.moe import sigmoid_moe_from_config
from dmtp.models.qwen3 import Qwen3MLP
from dmtp.models.rope_config import rope_type
from dmtp.models.target import TargetModel

SUPPORTED_ROPE = ("default", "yarn")
PACKED_EXPERTS = ("gate_up_proj", "down_proj")
# transformers' flags on packed experts; ours read gate_up_proj [E, 2*Im, H] (gate rows first) and down_proj [E, H, Im].
_PACKED_FLAGS = {"is_transposed": False, "is_concatenated": True, "has_gate": True, "has_bias": False}


def is_moe(mlp: nn.Module) -> bool:
    return getattr(mlp, "experts", None) is not None


def packed_experts_unsupported(experts: nn.Module) -> str | None:
    """Why transformers' packed `experts` cannot be bound to ours (None when they can)."""
    odd = [f"{k}={getattr(experts, k)}" for k, v in _PACKED_FLAGS.items() if getattr(experts, k, v) != v]
    up, down = getattr(experts, "gate_up_proj", None), getattr(experts, "down_proj", None)
    if odd or up is None or down is None or up.dim() != 3:
        return f"packed experts layout {odd or type(experts).__name__} (expected [E, 2*Im, H] gate-first, no bias)"
    return None


def _experts_unsupported(experts: nn.Module, num_experts: int) -> str | None:
    if hasattr(experts, "gate_up_proj"):
        return packed_experts_unsupported(experts)
    if all(hasattr(experts, str(e)) and all(hasattr(getattr(experts, str(e)), n) for n in SWIGLU)
           for e in range(num_experts)):
        return None
    return f"experts layout {type(experts).__name__} (neither packed gate_up_proj/down_proj nor per-expert SwiGLUs)"


def mlp_unsupported(mlp: nn.Module, config) -> str | None:
    """Why `mlp` (one decoder layer's) cannot be bound: None when it is a SwiGLU or a covered MoE."""
    if not is_moe(mlp):
        return None if all(isinstance(getattr(mlp, n, None), nn.Linear) for n in SWIGLU) else \
            f"MLP {type(mlp).__name__} is not a SwiGLU"
    gate = getattr(mlp, "gate", None)
    if gate is None or getattr(gate, "e_score_correction_bias", None) is None:
        return "MoE router without e_score_correction_bias"
    shared = getattr(mlp, "shared_experts", None)
    if shared is None or not all(isinstance(getattr(shared, n, None), nn.Linear) for n in SWIGLU):
        return "MoE without SwiGLU shared_experts"
    return _experts_unsupported(mlp.experts, config.n_routed_experts)


def moe_family_unsupported(target: TargetModel, model_type: str, attention_parts: tuple[str, ...]) -> str | None:
    """The checks both sigmoid-MoE runners share: model type, activation, rope type, module layout, MLPs."""
    cfg = target.config
    mt = getattr(cfg, "model_type", None)
    if mt != model_type:
        return f"model_type {mt!r} is not {model_type!r}"
    why = activation_unsupported(cfg)
    if why:
        return why
    if rope_type(cfg) not in SUPPORTED_ROPE:
        return f"rope type {rope_type(cfg)!r} (supported: {', '.join(SUPPORTED_ROPE)})"
    stack = getattr(target.hf, "model", None)
    why = stack_unsupported(stack)
    if why:
        return why
    for i, layer in enumerate(stack.layers):
        attn = getattr(layer, "self_attn", None)
        if attn is None or not all(hasattr(attn, p) for p in attention_parts):
            return f"layer {i}: attention {type(attn).__name__} lacks {', '.join(attention_parts)}"
        why = mlp_unsupported(layer.mlp, cfg)
        if why:
            return f"layer {i}: {why}"
    return None


def bind_swiglu(src: nn.Module) -> Qwen3MLP:
    """Our dense SwiGLU on `src`'s own gate/up/down projections."""
    with torch.device("meta"):
        dense = Qwen3MLP(src.gate_proj.in_features, src.gate_proj.out_features)
    bind(dense, src, SWIGLU)
    return dense


def bind_mlp(src: nn.Module, config) -> nn.Module:
    """Our dense SwiGLU or `SigmoidMoE` whose parameters are `src`'s own Parameter objects (no copy)."""
    if not is_moe(src):
        return bind_swiglu(src)
    packed = hasattr(src.experts, "gate_up_proj")
    with torch.device("meta"):
        moe = sigmoid_moe_from_config(config, packed=packed)
    bind(moe.gate, src.gate, ("weight", "e_score_correction_bias"))
    if packed:
        bind(moe.experts, src.experts, PACKED_EXPERTS)
    else:
        for e in range(moe.experts.num_experts):
            bind(moe.experts._modules[str(e)], getattr(src.experts, str(e)), SWIGLU)
    bind(moe.shared_experts, src.shared_experts, SWIGLU)
    return moe


__all__ = ["bind_mlp", "bind_swiglu", "mlp_unsupported", "moe_family_unsupported", "packed_experts_unsupported",
           "is_moe", "SUPPORTED_ROPE", "PACKED_EXPERTS"]
