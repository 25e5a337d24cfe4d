"""What the DeepSeek-V3 and GLM-4-MoE static-cache runners share: binding transformers' MLPs (dense SwiGLU,
or the sigmoid group-limited MoE with shared experts) to ours by reference, and the coverage checks.

Our MoE is `dmtp.models.moe.SigmoidMoE` (the class the MTP blocks use), whose parameters ARE the HF
module's (`mlp.gate.weight`, `mlp.gate.e_score_correction_bias`, the experts, `mlp.shared_experts.*`).
transformers keeps routed experts packed in memory (`gate_up_proj` [E, 2*Im, H], gate rows first, and
`down_proj` [E, H, Im]) whatever layout the checkpoint stores (it converts per-expert checkpoints on
load); a module that holds them one by one (`experts.{e}.gate_proj ...`) binds to `PerExpertSwiGLU`.
"""
from __future__ import annotations

import torch
from torch import nn

from dmtp.decode.runner_base import bind_linear
from dmtp.models.moe import sigmoid_moe_from_config
from dmtp.models.qwen3 import Qwen3MLP
from dmtp.models.rope_config import rope_type
from dmtp.models.target import TargetModel

SUPPORTED_ROPE = ("default", "yarn")
_SWIGLU = ("gate_proj", "up_proj", "down_proj")


def _is_moe(mlp: nn.Module) -> bool:
    return getattr(mlp, "experts", None) is not None


def _experts_unsupported(experts: nn.Module, num_experts: int) -> str | None:
    if hasattr(experts, "gate_up_proj"):
        flags = {"is_transposed": False, "is_concatenated": True, "has_gate": True, "has_bias": False}
        odd = [f"{k}={getattr(experts, k)}" for k, v in flags.items() if getattr(experts, k, v) != v]
        if odd or getattr(experts, "down_proj", None) is None or experts.gate_up_proj.dim() != 3:
            return f"packed experts layout {odd or type(experts).__name__} (expected [E, 2*Im, H] gate-first, no bias)"
        return None
    if all(hasattr(experts, str(e)) and all(hasattr(getattr(experts, str(e)), n) for n in _SWIGLU)
           for e in range(num_experts)):
        return None
    return f"experts layout {type(experts).__name__} (neither packed gate_up_proj/down_proj nor per-expert SwiGLUs)"


def mlp_unsupported(mlp: nn.Module, config) -> str | None:
    """Why `mlp` (one decoder layer's) cannot be bound: None when it is a SwiGLU or a covered MoE."""
    if not _is_moe(mlp):
        return None if all(isinstance(getattr(mlp, n, None), nn.Linear) for n in _SWIGLU) else \
            f"MLP {type(mlp).__name__} is not a SwiGLU"
    gate = getattr(mlp, "gate", None)
    if gate is None or getattr(gate, "e_score_correction_bias", None) is None:
        return "MoE router without e_score_correction_bias"
    shared = getattr(mlp, "shared_experts", None)
    if shared is None or not all(isinstance(getattr(shared, n, None), nn.Linear) for n in _SWIGLU):
        return "MoE without SwiGLU shared_experts"
    return _experts_unsupported(mlp.experts, config.n_routed_experts)


def moe_family_unsupported(target: TargetModel, model_type: str, attention_parts: tuple[str, ...]) -> str | None:
    """The checks both MoE runners share: model type, activation, rope type, module layout, MLPs."""
    cfg = target.config
    mt = getattr(cfg, "model_type", None)
    if mt != model_type:
        return f"model_type {mt!r} is not {model_type!r}"
    if getattr(cfg, "hidden_act", "silu") not in ("silu", "swish"):
        return f"activation {cfg.hidden_act!r}"
    if rope_type(cfg) not in SUPPORTED_ROPE:
        return f"rope type {rope_type(cfg)!r} (supported: {', '.join(SUPPORTED_ROPE)})"
    base = getattr(target.hf, "model", None)
    if base is None or not all(hasattr(base, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return "unexpected module layout"
    for i, layer in enumerate(base.layers):
        attn = getattr(layer, "self_attn", None)
        if attn is None or not all(hasattr(attn, p) for p in attention_parts):
            return f"layer {i}: attention {type(attn).__name__} lacks {', '.join(attention_parts)}"
        why = mlp_unsupported(layer.mlp, cfg)
        if why:
            return f"layer {i}: {why}"
    return None


def _bind_swiglu(dst: Qwen3MLP, src: nn.Module) -> Qwen3MLP:
    for name in _SWIGLU:
        bind_linear(getattr(dst, name), getattr(src, name))
    return dst


def bind_mlp(src: nn.Module, config) -> nn.Module:
    """Our dense SwiGLU or `SigmoidMoE` whose parameters are `src`'s own Parameter objects (no copy)."""
    if not _is_moe(src):
        with torch.device("meta"):
            dense = Qwen3MLP(src.gate_proj.in_features, src.gate_proj.out_features)
        return _bind_swiglu(dense, src)
    packed = hasattr(src.experts, "gate_up_proj")
    with torch.device("meta"):
        moe = sigmoid_moe_from_config(config, packed=packed)
    moe.gate.weight = src.gate.weight
    moe.gate.e_score_correction_bias = src.gate.e_score_correction_bias
    if packed:
        moe.experts.gate_up_proj = src.experts.gate_up_proj
        moe.experts.down_proj = src.experts.down_proj
    else:
        for e in range(moe.experts.num_experts):
            _bind_swiglu(moe.experts._modules[str(e)], getattr(src.experts, str(e)))
    _bind_swiglu(moe.shared_experts, src.shared_experts)
    return moe


def check_bound(layer: nn.Module, src: nn.Module) -> nn.Module:
    """Every parameter and buffer of `layer` must now be one of the HF layer's tensors."""
    left = [n for n, t in [*layer.named_parameters(), *layer.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"unbound tensors after binding to {type(src).__name__}: {left}")
    return layer


__all__ = ["bind_mlp", "check_bound", "mlp_unsupported", "moe_family_unsupported", "SUPPORTED_ROPE"]
