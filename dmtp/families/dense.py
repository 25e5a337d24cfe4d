"""The dense family: Qwen3 / Qwen2 / Llama / Mistral targets (the embedded `micro` / `tiny` targets are Qwen3).

MTP: a plain Qwen3 decoder layer (`Qwen3MTPBlock`, Qwen3 only: the other model types have no native MTP
dmtp builds). Runner (`FastTargetRunner`): our own forward (the blocks of `dmtp.models.qwen3`) over
`StaticCacheRunner`'s static caches `[B, hkv, Lmax, d]` (or flash-attn's `[B, Lmax, hkv, d]` when
`flash_attn` is installed and the dtype is fp16/bf16). `bind_decoder_layer` is also the attention binding
of the GLM-4-MoE runner.
"""
from __future__ import annotations

import torch
from torch import nn

from dmtp.decode.runners.base import (ATTENTION_PROJECTIONS, LAYER_NORMS, SWIGLU, StaticCacheRunner,
                                     activation_unsupported, bind, check_bound, stack_unsupported)
from dmtp.families.base import Family
from dmtp.models.mtp import MTPSpec
from dmtp.models.qwen3 import KVCache, Qwen3DecoderLayer, rope_cos_sin, rope_inv_freq
from dmtp.models.rope_config import rope_theta, rope_type
from dmtp.models.target import TargetModel

FAST_MODEL_TYPES = ("qwen3", "qwen2", "llama", "mistral")
_STATIC_ROPE = ("default", "linear", "llama3", "yarn")


# ----------------------------------------------------------------------------------------------------
# the native MTP (Qwen3)
# ----------------------------------------------------------------------------------------------------

class Qwen3MTPBlock(Qwen3DecoderLayer):
    """A plain Qwen3 decoder layer as the MTP block (the tiny target's family).

    Every MTP block speaks the same protocol: `forward(x, positions, mask, cache=None)` computes its
    own rotary embedding, and `new_cache(batch, max_len, dtype, device)` gives its private KV cache."""

    def __init__(self, spec: MTPSpec):
        super().__init__(spec.hidden_size, spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim,
                         spec.intermediate_size, spec.rms_norm_eps, spec.attention_bias)
        rotary_dim = int(spec.head_dim * spec.partial_rotary_factor)
        # A plain attribute, not a buffer: frequencies stay fp32 when the block is cast to bf16.
        self._inv_freq = rope_inv_freq(rotary_dim, spec.rope_theta)
        self.num_kv_heads, self.head_dim = spec.num_key_value_heads, spec.head_dim

    def forward(self, x, positions, mask, cache: KVCache | None = None):
        if self._inv_freq.device != x.device:
            self._inv_freq = self._inv_freq.to(x.device)
        cos, sin = rope_cos_sin(positions, self._inv_freq, x.dtype)
        return super().forward(x, cos, sin, mask, cache=cache, positions=positions)

    def new_cache(self, batch: int, max_len: int, dtype, device) -> KVCache:
        return KVCache(batch, self.num_kv_heads, max_len, self.head_dim, dtype, device)


def qwen3_mtp_spec(cfg: dict) -> MTPSpec:
    return MTPSpec(family="qwen3", hidden_size=cfg["hidden_size"], num_attention_heads=cfg["num_attention_heads"],
                   num_key_value_heads=cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
                   head_dim=cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
                   intermediate_size=cfg["intermediate_size"], rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
                   rope_theta=rope_theta(cfg), attention_bias=cfg.get("attention_bias", False))


def qwen3_mtp_block(spec: MTPSpec, cfg: dict, keys: list[str] | None = None) -> Qwen3MTPBlock:
    return Qwen3MTPBlock(spec)


# ----------------------------------------------------------------------------------------------------
# the static-cache runner
# ----------------------------------------------------------------------------------------------------


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


FAMILY = Family(name="dense", title="Qwen3 / Qwen2 / Llama / Mistral", model_types=FAST_MODEL_TYPES,
                mtp_model_types=("qwen3",), mtp_layout="mtp", mtp_spec=qwen3_mtp_spec, mtp_block=qwen3_mtp_block,
                runner=FastTargetRunner, micro="micro", test="tests/test_decode_runner.py")

__all__ = ["FAMILY", "FastTargetRunner", "Qwen3MTPBlock", "fast_runner_unsupported", "bind_decoder_layer",
           "qwen3_mtp_spec", "FAST_MODEL_TYPES"]
