"""Static-cache runner for dense-attention Qwen3 / Qwen2 / Llama / Mistral targets.

Our own forward (the blocks of `dmtp.models.qwen3`) over `StaticCacheRunner`'s static caches
`[B, hkv, Lmax, d]` (or flash-attn's `[B, Lmax, hkv, d]` when `flash_attn` is installed and the dtype
is fp16/bf16). `bind_decoder_layer` is also the attention binding of the GLM-4-MoE runner.
"""
from __future__ import annotations

import torch
from torch import nn

from dmtp.decode.runners.base import StaticCacheRunner, activation_unsupported, bind, check_bound, stack_unsupported
from dmtp.models.qwen3 import Qwen3DecoderLayer
from dmtp.models.rope_config import rope_type
from dmtp.models.target import TargetModel

FAST_MODEL_TYPES = ("qwen3", "qwen2", "llama", "mistral")
_STATIC_ROPE = ("default", "linear", "llama3", "yarn")
ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
SWIGLU = ("gate_proj", "up_proj", "down_proj")
LAYER_NORMS = ("input_layernorm", "post_attention_layernorm")


def fast_runner_unsupported(target: TargetModel) -> str | None:
    """Why the dense runner cannot drive this target (None when it can)."""
    cfg = target.config
    mt = getattr(cfg, "model_type", None)
    if mt not in FAST_MODEL_TYPES:
        return f"model_type {mt!r} is not one of {FAST_MODEL_TYPES}"
    why = activation_unsupported(cfg)
    if why:
        return why
    types = getattr(cfg, "layer_types", None) or []
    if any(t != "full_attention" for t in types) or (getattr(cfg, "use_sliding_window", False)
                                                    and getattr(cfg, "sliding_window", None)):
        return "sliding-window layers"
    if mt == "mistral" and getattr(cfg, "sliding_window", None):
        return "sliding-window attention"
    if rope_type(cfg) not in _STATIC_ROPE:
        return f"rope type {rope_type(cfg)!r} (position-dependent frequencies)"
    return stack_unsupported(getattr(target.hf, "model", None))


def bind_decoder_layer(src: nn.Module, cfg, mlp: nn.Module | None = None) -> Qwen3DecoderLayer:
    """A `Qwen3DecoderLayer` whose parameters are `src`'s own Parameter objects (no copy). `mlp`: an
    already bound MLP to use instead of binding `src.mlp` as a dense SwiGLU (MoE layers)."""
    attn = src.self_attn
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    n_kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    with torch.device("meta"):
        layer = Qwen3DecoderLayer(cfg.hidden_size, cfg.num_attention_heads, n_kv, head_dim, cfg.intermediate_size,
                                  float(getattr(cfg, "rms_norm_eps", 1e-6)))
    bind(layer.self_attn, attn, ATTENTION_PROJECTIONS)
    for name in ("q_norm", "k_norm"):  # Qwen3 only; Llama/Qwen2/Mistral have none
        if getattr(attn, name, None) is None:
            setattr(layer.self_attn, name, nn.Identity())
    bind(layer.self_attn, attn, ("q_norm", "k_norm"), optional=True)
    if mlp is not None:
        layer.mlp = mlp
    else:
        bind(layer.mlp, src.mlp, SWIGLU)
    bind(layer, src, LAYER_NORMS)
    return check_bound(layer, src)


class FastTargetRunner(StaticCacheRunner):
    kind = "fast"
    family = "dense"
    why_unsupported = staticmethod(fast_runner_unsupported)
    # A MoE family's subclass swaps this for its own layer binding (and `why_unsupported`).
    bind_layer = staticmethod(bind_decoder_layer)

    def bind_layers(self, stack: nn.Module, cfg) -> list[nn.Module]:
        return [self.bind_layer(layer, cfg) for layer in stack.layers]

    def run_layer(self, layer, x, cos, sin, seen, cache, positions, prompt_lengths):
        if self.attention != "flash":   # SDPA (or MLA's latent attention): the layer's own cached forward
            return layer(x, cos, sin, seen, cache=cache, positions=positions)
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        q = attn.project_q(h, cos, sin)
        k, v = attn.project_kv(h, cos, sin)
        x = x + attn.output(self.attend_cached(q, k, v, cache, positions, seen))
        return x + layer.mlp(layer.post_attention_layernorm(x))


__all__ = ["FastTargetRunner", "fast_runner_unsupported", "bind_decoder_layer", "FAST_MODEL_TYPES", "SWIGLU"]
