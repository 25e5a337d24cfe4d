"""The hybrid family: Qwen3-Next, Qwen3.5, Qwen3.6 (dense and MoE; gated DeltaNet + gated attention).

MTP (`Qwen35MTPBlock`): one full-attention decoder layer, all norms x*(1+w), gated attention (q_proj ->
per-head [query | gate]; per-head q/k norms; partial NeoX RoPE; o_proj of attn * sigmoid(gate)), then a
dense SwiGLU MLP or a softmax-top-k MoE with a sigmoid-gated shared expert. Qwen3.5's interleaved mRoPE
reduces to 1-D RoPE for text (three equal position streams), which is what is implemented. The block's
parameter names are the checkpoint's (`mtp.layers.0.*` stripped), so strict loading proves coverage.

Runner (`HybridTargetRunner`): `StaticCacheRunner`'s forward for the text model at `hf.model.language_model` (multimodal
`*ForConditionalGeneration`) or `hf.model` (`*ForCausalLM`):

* full-attention layers: gated attention (`Qwen35GatedAttention`: per-head query|gate split of q_proj,
  (1+w) q/k norms, partial rotary, sigmoid output gate) over the shared static KV caches and attention
  backend; rollback = not advancing;
* Gated DeltaNet layers (`dmtp.models.gated_deltanet`): a per-request conv window and fp32 recurrent
  state. A verify block keeps the state after every row; `advance(n)` selects each request's state
  after its own n committed rows with device indices (n = 0 keeps the old one): no re-run, no host
  sync, no snapshot of the cache. On CUDA with `fla` and `causal-conv1d` installed (fp16/bf16) the
  layer runs their kernels, else plain torch; the same tokens either way;
* MLPs: SwiGLU, or softmax top-k MoE with a sigmoid-gated shared expert (`Qwen35SparseMoE`) bound to
  transformers' packed experts (`mlp.experts.gate_up_proj` / `down_proj`: the in-memory layout for
  both checkpoint layouts, per-expert and packed, in this transformers).

The one extra rule over `TargetRunner`'s conventions: the GDN layers continue from the committed
state, so verify rows must sit at `lengths + arange(S)` (the loop's default); `positions` only feed
the attention layers.
"""
from __future__ import annotations

import torch
from torch import nn

from dmtp.decode.runners.base import (ATTENTION_PROJECTIONS, LAYER_NORMS, SWIGLU, StaticCacheRunner,
                                     activation_unsupported, bind, check_bound, stack_unsupported)
from dmtp.decode.runners.moe import PACKED_EXPERTS, bind_swiglu, packed_experts_unsupported
from dmtp.families.base import Family
from dmtp.models import gdn_kernels
from dmtp.models.gated_deltanet import GatedDeltaNet
from dmtp.models.moe import PackedSwiGLU, PerExpertSwiGLU, packed_experts
from dmtp.models.mtp import MTPSpec
from dmtp.models.mtp_errors import MTPLoadError
from dmtp.models.qwen3 import KVCache, Qwen3MLP, RMSNorm, apply_rope, attend, rope_cos_sin, rope_inv_freq
from dmtp.models.rope_config import rope_parameters, rope_theta, rope_type
from dmtp.models.target import TargetModel

HYBRID_MODEL_TYPES = ("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
HYBRID_LAYER_TYPES = ("linear_attention", "full_attention")
GDN_KERNELS = ("auto", "torch", "fla")


# ---------------------------------------------------------------------------------------------------
# the native MTP; its attention and MoE are also the runner's
# ---------------------------------------------------------------------------------------------------

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


def qwen35_mtp_spec(cfg: dict) -> MTPSpec:
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


def qwen35_mtp_block(spec: MTPSpec, cfg: dict, keys: list[str] | None = None) -> Qwen35MTPBlock:
    """Dense SwiGLU or MoE, and the expert layout, from the checkpoint's keys (else from the config)."""
    if keys is not None:
        moe = "mlp.gate.weight" in keys
    else:
        moe = bool(cfg.get("num_experts"))
    if moe:
        mlp = Qwen35SparseMoE(spec.hidden_size, cfg["num_experts"], cfg["num_experts_per_tok"],
                              cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"],
                              cfg.get("norm_topk_prob", True), packed=packed_experts(keys))
    else:
        if not cfg.get("intermediate_size"):
            raise MTPLoadError(f"{cfg.get('model_type')} MTP has a dense MLP but the config has no intermediate_size")
        mlp = Qwen3MLP(spec.hidden_size, cfg["intermediate_size"])
    return Qwen35MTPBlock(spec, mlp)



# ---------------------------------------------------------------------------------------------------
# the static-cache runner
# ---------------------------------------------------------------------------------------------------



def text_model(hf: nn.Module) -> nn.Module | None:
    """The decoder stack: `model.language_model` of the multimodal wrappers, else `model`."""
    base = getattr(hf, "model", None)
    language_model = getattr(base, "language_model", None)
    return language_model if language_model is not None else base


def _gdn_projections(mixer: nn.Module) -> str | None:
    if all(hasattr(mixer, n) for n in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")):
        return "separate"
    if all(hasattr(mixer, n) for n in ("in_proj_qkvz", "in_proj_ba")):
        return "grouped"
    return None


def hybrid_runner_unsupported(target: TargetModel) -> str | None:
    """Why the hybrid runner cannot drive this target (None when it can)."""
    cfg = target.config
    mt = getattr(cfg, "model_type", None)
    if mt not in HYBRID_MODEL_TYPES:
        return f"model_type {mt!r} is not one of {HYBRID_MODEL_TYPES}"
    why = activation_unsupported(cfg)
    if why:
        return why
    types = list(getattr(cfg, "layer_types", None) or [])
    for t in types:
        if t not in HYBRID_LAYER_TYPES:
            return f"layer type {t!r}"
    if rope_type(cfg) != "default":
        return f"rope type {rope_type(cfg)!r}"
    stack = text_model(target.hf)
    if stack_unsupported(stack) or len(types) != len(stack.layers):
        return "unexpected module layout"
    if getattr(cfg, "linear_num_value_heads", 1) % getattr(cfg, "linear_num_key_heads", 1):
        return "linear_num_value_heads not a multiple of linear_num_key_heads"
    for layer, t in zip(stack.layers, types):
        if t == "linear_attention" and _gdn_projections(getattr(layer, "linear_attn", None)) is None:
            return "linear-attention projections (neither in_proj_qkv/z/b/a nor in_proj_qkvz/ba)"
        if t == "full_attention" and not hasattr(getattr(layer, "self_attn", None), "q_norm"):
            return "full-attention layer without q/k norms"
        experts = getattr(layer.mlp, "experts", None)
        if experts is not None:
            why = packed_experts_unsupported(experts)
            if why:
                return why
    return None


# ---------------------------------------------------------------------------------------------------
# binding transformers' modules
# ---------------------------------------------------------------------------------------------------

def _bind_attention(src: nn.Module, cfg) -> Qwen35GatedAttention:
    heads = cfg.num_attention_heads
    spec = MTPSpec(family=cfg.model_type, hidden_size=cfg.hidden_size, num_attention_heads=heads,
                   num_key_value_heads=getattr(cfg, "num_key_value_heads", None) or heads,
                   head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads, intermediate_size=0,
                   rms_norm_eps=float(cfg.rms_norm_eps), rope_theta=0.0, zero_centered_norm=True,
                   attention_bias=bool(getattr(cfg, "attention_bias", False)))
    with torch.device("meta"):
        attn = Qwen35GatedAttention(spec)
    bind(attn, src, ATTENTION_PROJECTIONS + ("q_norm", "k_norm"))
    return attn


def _bind_gdn(src: nn.Module, cfg) -> GatedDeltaNet:
    grouped = _gdn_projections(src) == "grouped"
    with torch.device("meta"):
        gdn = GatedDeltaNet(cfg.hidden_size, cfg.linear_num_key_heads, cfg.linear_num_value_heads,
                            cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim,
                            float(cfg.rms_norm_eps), grouped_projections=grouped,
                            conv_bias=src.conv1d.bias is not None)
    names = ("in_proj_qkvz", "in_proj_ba") if grouped else ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
    bind(gdn, src, names + ("out_proj", "conv1d", "dt_bias", "A_log", "norm"))
    return gdn


def _bind_mlp(src: nn.Module) -> nn.Module:
    experts = getattr(src, "experts", None)
    if experts is None:
        return bind_swiglu(src)
    num, two_inter, hidden = experts.gate_up_proj.shape
    router = src.gate
    with torch.device("meta"):
        # transformers' Qwen3.5/3.6 router always renormalises the top-k; Qwen3-Next's follows the config.
        mlp = Qwen35SparseMoE(hidden, num, router.top_k, two_inter // 2, src.shared_expert.gate_proj.weight.shape[0],
                              bool(getattr(router, "norm_topk_prob", True)), packed=True)
    bind(mlp.gate, router, ("weight",))
    bind(mlp.experts, experts, PACKED_EXPERTS)
    bind(mlp.shared_expert, src.shared_expert, SWIGLU)
    bind(mlp, src, ("shared_expert_gate",))
    return mlp


class HybridLayer(nn.Module):
    """Pre-norm token mixer (gated attention or Gated DeltaNet) + MLP, bound to a transformers layer."""

    def __init__(self, src: nn.Module, layer_type: str, cfg):
        super().__init__()
        self.is_attention = layer_type == "full_attention"
        with torch.device("meta"):
            self.input_layernorm = RMSNorm(cfg.hidden_size, zero_centered=True)
            self.post_attention_layernorm = RMSNorm(cfg.hidden_size, zero_centered=True)
        bind(self, src, LAYER_NORMS)
        self.mixer = _bind_attention(src.self_attn, cfg) if self.is_attention else _bind_gdn(src.linear_attn, cfg)
        self.mlp = _bind_mlp(src.mlp)
        check_bound(self, src)


# ---------------------------------------------------------------------------------------------------
# the runner: the shared static-cache forward, plus the GDN layers' recurrent state
# ---------------------------------------------------------------------------------------------------

class HybridTargetRunner(StaticCacheRunner):
    kind = "hybrid"
    family = "hybrid"
    why_unsupported = staticmethod(hybrid_runner_unsupported)
    decoder_stack = staticmethod(text_model)

    def __init__(self, target: TargetModel, layer_ids=(), attention: str = "auto", kernels: str = "auto"):
        super().__init__(target, layer_ids, attention=attention)
        self.kernels = self._pick_kernels(kernels, target.config.linear_conv_kernel_dim)
        for layer in self.layers:
            if not layer.is_attention:
                layer.mixer.use_kernels = self.kernels == "fla"

    def bind_layers(self, stack: nn.Module, cfg) -> list[nn.Module]:
        return [HybridLayer(layer, t, cfg) for layer, t in zip(stack.layers, cfg.layer_types)]

    def _pick_kernels(self, kernels: str, conv_kernel: int) -> str:
        if kernels not in GDN_KERNELS:
            raise ValueError(f"kernels must be {'|'.join(GDN_KERNELS)}, got {kernels!r}")
        usable = gdn_kernels.usable(self.device, self.dtype, conv_kernel)
        if kernels == "fla" and not usable:
            raise ValueError("kernels='fla' needs flash-linear-attention and causal-conv1d installed, a CUDA device, "
                             "fp16/bf16 and a conv kernel of 2..4")
        if kernels == "auto":
            return "fla" if usable else "torch"
        return kernels

    def new_cache(self, layer: nn.Module, batch_size: int, max_len: int):
        if layer.is_attention:
            return super().new_cache(layer, batch_size, max_len)
        return layer.mixer.new_cache(batch_size, self.dtype, self.device)

    def round_state(self) -> list[torch.Tensor]:
        """The lengths and every GDN layer's committed conv and recurrent state (advance rewrites them);
        the scratch (`scratch_state`, every cache) is the attention K/V and the GDN per-row block buffers."""
        gdn = [c for layer, c in zip(self.layers, self.caches) if not layer.is_attention]
        return [self.lengths] + [t for c in gdn for t in (c.conv, c.state)]

    def visibility(self, positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Under SDPA, a boolean mask over the whole cache (not the base's additive mask over the live
        span): the two give the same tokens but not bitwise the same logits (~1e-7 apart on the tiny
        targets), so moving this runner onto the span is a change to measure on its own, not part of
        sharing the forward."""
        if self.attention == "flash":
            return super().visibility(positions, dtype)
        return (self._slots[None, None, :] <= positions[:, :, None])[:, None]

    def run_layer(self, layer, x, cos, sin, seen, cache, positions, prompt_lengths):
        """With `prompt_lengths`: right-padded prompts (the GDN layers start from zero and keep the state
        after each prompt's last token); else verify rows continuing the committed state."""
        h = layer.input_layernorm(x)
        if layer.is_attention:
            q, gate, k, v = layer.mixer.project(h, cos, sin)
            h = layer.mixer.output(self.attend_cached(q, k, v, cache, positions, seen), gate)
        elif prompt_lengths is not None:
            h = layer.mixer.forward_prompt(h, prompt_lengths, cache)
        else:
            h = layer.mixer.forward_rows(h, cache)
        x = x + h
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def advance(self, n: torch.Tensor) -> None:
        super().advance(n)
        for layer, cache in zip(self.layers, self.caches):
            if not layer.is_attention:
                cache.commit(n)


FAMILY = Family(name="hybrid", title="Qwen3-Next / Qwen3.5 / Qwen3.6", model_types=HYBRID_MODEL_TYPES,
                mtp_layout="mtp", mtp_spec=qwen35_mtp_spec, mtp_block=qwen35_mtp_block, runner=HybridTargetRunner,
                micro="micro_hybrid", test="tests/test_hybrid_runner.py")

__all__ = ["FAMILY", "HybridTargetRunner", "Qwen35MTPBlock", "Qwen35GatedAttention", "Qwen35SparseMoE",
           "hybrid_runner_unsupported", "text_model", "HYBRID_MODEL_TYPES", "GDN_KERNELS"]
