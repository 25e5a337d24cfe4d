"""Static-cache target runner for hybrid Gated-DeltaNet targets: Qwen3-Next, Qwen3.5, Qwen3.6 (dense and MoE).

Our own forward whose parameters ARE the transformers model's Parameters (bound by reference, never
copied), for the text model at `hf.model.language_model` (multimodal `*ForConditionalGeneration`) or
`hf.model` (`*ForCausalLM`):

* full-attention layers: gated attention (`Qwen35GatedAttention`: per-head query|gate split of q_proj,
  (1+w) q/k norms, partial rotary, sigmoid output gate) over static KV caches `[B, hkv, Lmax, d]` with
  per-request lengths, as the dense runner (SDPA with a mask; flash-attn's kvcache kernel on CUDA
  fp16/bf16 when installed); rollback = not advancing;
* Gated DeltaNet layers (`dmtp.models.gated_deltanet`): a per-request conv window and fp32 recurrent
  state. A verify block keeps the state after every row; `advance(n)` selects each request's state
  after its own n committed rows with device indices (n = 0 keeps the old one): no re-run, no host
  sync, no snapshot of the cache. On CUDA with `fla` and `causal-conv1d` installed (fp16/bf16) the
  layer runs their kernels, else plain torch; the same tokens either way;
* MLPs: SwiGLU, or softmax top-k MoE with a sigmoid-gated shared expert (`Qwen35SparseMoE`) bound to
  transformers' packed experts (`mlp.experts.gate_up_proj` / `down_proj`: the in-memory layout for
  both checkpoint layouts, per-expert and packed, in this transformers).

Every shape is fixed and every position is a device tensor, so verify + advance can be captured in a
CUDA graph. Conventions (state, rollback, outputs) are `TargetRunner`'s; the one extra rule: the GDN
layers continue from the committed state, so verify rows must sit at `lengths + arange(S)` (the loop's
default); `positions` only feed the attention layers.
"""
from __future__ import annotations

import torch
from torch import nn

from dmtp.decode.runner_base import TargetRunner, bind_linear, bind_norm, flash_attn_with_kvcache, gather_rows
from dmtp.decode.target_runner import FastTargetRunner, _FlashCache
from dmtp.models import gdn_kernels
from dmtp.models.gated_deltanet import GatedDeltaNet
from dmtp.models.mtp import MTPSpec
from dmtp.models.mtp_families import Qwen35GatedAttention, Qwen35SparseMoE
from dmtp.models.qwen3 import KVCache, Qwen3MLP, RMSNorm, attend, rope_cos_sin
from dmtp.models.rope_config import rope_type
from dmtp.models.target import TargetModel, TargetOutput

HYBRID_MODEL_TYPES = ("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
HYBRID_LAYER_TYPES = ("linear_attention", "full_attention")
GDN_KERNELS = ("auto", "torch", "fla")


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


# transformers' flags on packed experts; ours read gate_up_proj [E, 2*Im, H] (gate rows first) and down_proj [E, H, Im].
_PACKED_FLAGS = {"is_transposed": False, "is_concatenated": True, "has_gate": True, "has_bias": False}


def _packed_experts_unsupported(experts: nn.Module) -> str | None:
    odd = [f"{k}={getattr(experts, k)}" for k, v in _PACKED_FLAGS.items() if getattr(experts, k, v) != v]
    up, down = getattr(experts, "gate_up_proj", None), getattr(experts, "down_proj", None)
    if odd or up is None or down is None or up.dim() != 3:
        return f"expert layout {odd or type(experts).__name__} (expected packed gate_up_proj [E, 2*Im, H], down_proj)"
    return None


def hybrid_runner_unsupported(target: TargetModel) -> str | None:
    """Why the hybrid runner cannot drive this target (None when it can)."""
    cfg = target.config
    mt = getattr(cfg, "model_type", None)
    if mt not in HYBRID_MODEL_TYPES:
        return f"model_type {mt!r} is not one of {HYBRID_MODEL_TYPES}"
    act = getattr(cfg, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        return f"hidden_act {act!r}"
    types = list(getattr(cfg, "layer_types", None) or [])
    for t in types:
        if t not in HYBRID_LAYER_TYPES:
            return f"layer type {t!r}"
    if rope_type(cfg) != "default":
        return f"rope type {rope_type(cfg)!r}"
    base = text_model(target.hf)
    if base is None or not all(hasattr(base, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")) \
            or len(types) != len(base.layers):
        return "unexpected module layout"
    if getattr(cfg, "linear_num_value_heads", 1) % getattr(cfg, "linear_num_key_heads", 1):
        return "linear_num_value_heads not a multiple of linear_num_key_heads"
    for layer, t in zip(base.layers, types):
        if t == "linear_attention" and _gdn_projections(getattr(layer, "linear_attn", None)) is None:
            return "linear-attention projections (neither in_proj_qkv/z/b/a nor in_proj_qkvz/ba)"
        if t == "full_attention" and not hasattr(getattr(layer, "self_attn", None), "q_norm"):
            return "full-attention layer without q/k norms"
        experts = getattr(layer.mlp, "experts", None)
        if experts is not None:
            why = _packed_experts_unsupported(experts)
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
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        bind_linear(getattr(attn, name), getattr(src, name))
    for name in ("q_norm", "k_norm"):
        bind_norm(getattr(attn, name), getattr(src, name))
    return attn


def _bind_gdn(src: nn.Module, cfg) -> GatedDeltaNet:
    grouped = _gdn_projections(src) == "grouped"
    with torch.device("meta"):
        gdn = GatedDeltaNet(cfg.hidden_size, cfg.linear_num_key_heads, cfg.linear_num_value_heads,
                            cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim,
                            float(cfg.rms_norm_eps), grouped_projections=grouped,
                            conv_bias=src.conv1d.bias is not None)
    names = ("in_proj_qkvz", "in_proj_ba") if grouped else ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
    for name in names + ("out_proj", "conv1d"):
        bind_linear(getattr(gdn, name), getattr(src, name))
    gdn.dt_bias, gdn.A_log = src.dt_bias, src.A_log
    bind_norm(gdn.norm, src.norm)
    return gdn


def _bind_mlp(src: nn.Module) -> nn.Module:
    experts = getattr(src, "experts", None)
    if experts is None:
        inter, hidden = src.gate_proj.weight.shape
        with torch.device("meta"):
            mlp = Qwen3MLP(hidden, inter)
        for name in ("gate_proj", "up_proj", "down_proj"):
            bind_linear(getattr(mlp, name), getattr(src, name))
        return mlp
    num, two_inter, hidden = experts.gate_up_proj.shape
    router = src.gate
    with torch.device("meta"):
        # transformers' Qwen3.5/3.6 router always renormalises the top-k; Qwen3-Next's follows the config.
        mlp = Qwen35SparseMoE(hidden, num, router.top_k, two_inter // 2, src.shared_expert.gate_proj.weight.shape[0],
                              bool(getattr(router, "norm_topk_prob", True)), packed=True)
    mlp.gate.weight = router.weight
    mlp.experts.gate_up_proj, mlp.experts.down_proj = experts.gate_up_proj, experts.down_proj
    for name in ("gate_proj", "up_proj", "down_proj"):
        bind_linear(getattr(mlp.shared_expert, name), getattr(src.shared_expert, name))
    bind_linear(mlp.shared_expert_gate, src.shared_expert_gate)
    return mlp


class HybridLayer(nn.Module):
    """Pre-norm token mixer (gated attention or Gated DeltaNet) + MLP, bound to a transformers layer."""

    def __init__(self, src: nn.Module, layer_type: str, cfg):
        super().__init__()
        self.is_attention = layer_type == "full_attention"
        with torch.device("meta"):
            self.input_layernorm = RMSNorm(cfg.hidden_size, zero_centered=True)
            self.post_attention_layernorm = RMSNorm(cfg.hidden_size, zero_centered=True)
        bind_norm(self.input_layernorm, src.input_layernorm)
        bind_norm(self.post_attention_layernorm, src.post_attention_layernorm)
        self.mixer = _bind_attention(src.self_attn, cfg) if self.is_attention else _bind_gdn(src.linear_attn, cfg)
        self.mlp = _bind_mlp(src.mlp)
        left = [n for n, p in self.named_parameters() if p.is_meta]
        if left:
            raise RuntimeError(f"unbound parameters after binding to the HF layer: {left}")


# ---------------------------------------------------------------------------------------------------
# the runner
# ---------------------------------------------------------------------------------------------------

class HybridTargetRunner(TargetRunner):
    supports_graphs = True
    kind = "hybrid"

    def __init__(self, target: TargetModel, layer_ids=(), attention: str = "auto", kernels: str = "auto"):
        super().__init__(target, layer_ids)
        why = hybrid_runner_unsupported(target)
        if why:
            raise ValueError(f"hybrid target runner cannot drive this model: {why}")
        cfg = target.config
        base = text_model(target.hf)
        self.embed = base.embed_tokens
        self.norm = base.norm
        self.lm_head = target.hf.get_output_embeddings()
        self.layers = nn.ModuleList(HybridLayer(layer, t, cfg) for layer, t in zip(base.layers, cfg.layer_types))
        self.inv_freq = base.rotary_emb.inv_freq
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.attention = FastTargetRunner._pick_attention(self, attention)
        self.kernels = self._pick_kernels(kernels, cfg.linear_conv_kernel_dim)
        for layer in self.layers:
            if not layer.is_attention:
                layer.mixer.use_kernels = self.kernels == "fla"
        self.caches: list = []

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

    def allocate(self, batch_size: int, max_len: int) -> None:
        if batch_size == self.batch_size and max_len == self.max_len and self.caches:
            self.lengths.zero_()
            return
        self.batch_size, self.max_len = batch_size, max_len
        kv = _FlashCache if self.attention == "flash" else KVCache
        self.caches = [kv(batch_size, self.num_kv_heads, max_len, self.head_dim, self.dtype, self.device)
                       if layer.is_attention else layer.mixer.new_cache(batch_size, self.dtype, self.device)
                       for layer in self.layers]
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=self.device)
        self._slots = torch.arange(max_len, device=self.device)

    def round_state(self) -> list[torch.Tensor]:
        """The lengths and every GDN layer's committed conv and recurrent state (advance rewrites them)."""
        gdn = [c for layer, c in zip(self.layers, self.caches) if not layer.is_attention]
        return [self.lengths] + [t for c in gdn for t in (c.conv, c.state)]

    def scratch_state(self) -> list:
        """The attention layers' K/V (rows lengths..) and the GDN layers' per-row block buffers; their
        committed conv/recurrent states are `round_state`."""
        return list(self.caches)

    def _attend(self, attn: Qwen35GatedAttention, h, cos, sin, positions, mask, cache):
        q, gate, k, v = attn.project(h, cos, sin)
        if self.attention == "flash":
            out = flash_attn_with_kvcache()(q.transpose(1, 2), cache.k, cache.v, k=k.transpose(1, 2),
                                           v=v.transpose(1, 2), cache_seqlens=positions[:, 0].to(torch.int32),
                                           causal=True).transpose(1, 2)
        else:
            cache.write(positions, k, v)
            out = attend(q, cache.k, cache.v, mask)
        return attn.output(out, gate)

    def _forward(self, ids, positions, prompt_lengths=None, logit_rows=None) -> TargetOutput:
        """Rows `ids` at `positions` [B, S]. With `prompt_lengths` [B]: right-padded prompts (the GDN
        layers start from zero and keep the state after each prompt's last token); else verify rows
        continuing the committed state. `logit_rows` [B]: logits only at that row ([B, 1, V])."""
        if not self.caches:
            raise RuntimeError("call allocate(batch_size, max_len) first")
        x = self.embed(ids)
        cos, sin = rope_cos_sin(positions, self.inv_freq, x.dtype)
        mask = None if self.attention == "flash" else (self._slots[None, None, :] <= positions[:, :, None])[:, None]
        last_layer = self.num_layers - 1
        taps: dict[int, torch.Tensor] = {}
        for i, (layer, cache) in enumerate(zip(self.layers, self.caches)):
            h = layer.input_layernorm(x)
            if layer.is_attention:
                h = self._attend(layer.mixer, h, cos, sin, positions, mask, cache)
            elif prompt_lengths is not None:
                h = layer.mixer.forward_prompt(h, prompt_lengths, cache)
            else:
                h = layer.mixer.forward_rows(h, cache)
            x = x + h
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            if i in self.layer_ids and i != last_layer:
                taps[i] = x
        last = self.norm(x)
        taps[last_layer] = last  # transformers' hidden_states[-1] is the final-norm output
        feats = torch.cat([taps[l] for l in self.layer_ids], dim=-1) if self.layer_ids else last[..., :0]
        logits = self.lm_head(last if logit_rows is None else gather_rows(last, logit_rows))
        return TargetOutput(logits, feats, last)

    def prefill(self, ids, lengths, last_logits_only: bool = False) -> TargetOutput:
        b, t = ids.shape
        if b != self.batch_size or t > self.max_len:
            raise ValueError(f"prefill of {tuple(ids.shape)} does not fit caches [{self.batch_size}, {self.max_len}]")
        positions = torch.arange(t, device=ids.device).expand(b, -1)
        lengths = lengths.to(self.device)
        out = self._forward(ids, positions, prompt_lengths=lengths,
                            logit_rows=(lengths - 1) if last_logits_only else None)
        self.lengths.copy_(lengths)
        return out

    def verify(self, tokens, positions=None) -> TargetOutput:
        if positions is None:
            positions = self.lengths[:, None] + torch.arange(tokens.shape[1], device=tokens.device)
        return self._forward(tokens, positions)

    def advance(self, n: torch.Tensor) -> None:
        self.lengths.add_(n)
        for layer, cache in zip(self.layers, self.caches):
            if not layer.is_attention:
                cache.commit(n)


__all__ = ["HybridTargetRunner", "hybrid_runner_unsupported", "text_model", "HYBRID_MODEL_TYPES", "GDN_KERNELS"]
