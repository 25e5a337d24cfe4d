"""Dense-attention target runtimes: static KV caches, per-request lengths, rollback = not advancing.

Two runners of the `TargetRunner` interface (`dmtp.decode.runner_base`); `dmtp.decode.runners` picks one:

* `FastTargetRunner` — dense-attention Qwen3 / Qwen2 / Llama / Mistral targets. Our own forward
  (the blocks of `dmtp.models.qwen3`) whose parameters ARE the Hugging Face model's parameters (bound
  by reference, never copied), over static caches `[B, hkv, Lmax, d]` (or flash-attn's `[B, Lmax, hkv, d]`
  when `flash_attn` is installed and the dtype is fp16/bf16). Every shape is fixed and every
  position is a device tensor, so a verify step can be captured in a CUDA graph.
* `RecomputeTargetRunner` — any other transformers causal LM: it keeps each request's token history
  on the device and re-runs the whole model over it at every call. Exact, slow, no graphs.

Conventions (state, rollback, outputs) are `TargetRunner`'s.
"""
from __future__ import annotations

import torch
from torch import nn

from dmtp.decode.runner_base import (TargetRunner, bind_linear, bind_norm, flash_attn_available, flash_attn_with_kvcache,
                                     gather_rows)
from dmtp.models.qwen3 import KVCache, Qwen3DecoderLayer, additive_mask, rope_cos_sin
from dmtp.models.rope_config import rope_type
from dmtp.models.target import TargetModel, TargetOutput

FAST_MODEL_TYPES = ("qwen3", "qwen2", "llama", "mistral")
_STATIC_ROPE = ("default", "linear", "llama3", "yarn")


# ---------------------------------------------------------------------------------------------------
# fast runner
# ---------------------------------------------------------------------------------------------------

def fast_runner_unsupported(target: TargetModel) -> str | None:
    """Why the fast runner cannot drive this target (None when it can)."""
    cfg = target.config
    mt = getattr(cfg, "model_type", None)
    if mt not in FAST_MODEL_TYPES:
        return f"model_type {mt!r} is not one of {FAST_MODEL_TYPES}"
    if getattr(cfg, "hidden_act", "silu") not in ("silu", "swish"):
        return f"activation {cfg.hidden_act!r}"
    types = getattr(cfg, "layer_types", None) or []
    if any(t != "full_attention" for t in types) or (getattr(cfg, "use_sliding_window", False)
                                                    and getattr(cfg, "sliding_window", None)):
        return "sliding-window layers"
    if mt == "mistral" and getattr(cfg, "sliding_window", None):
        return "sliding-window attention"
    if rope_type(cfg) not in _STATIC_ROPE:
        return f"rope type {rope_type(cfg)!r} (position-dependent frequencies)"
    base = getattr(target.hf, "model", None)
    if base is None or not all(hasattr(base, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return "unexpected module layout"
    return None


def bind_decoder_layer(src: nn.Module, cfg, mlp: nn.Module | None = None) -> Qwen3DecoderLayer:
    """A `Qwen3DecoderLayer` whose parameters are `src`'s own Parameter objects (no copy). `mlp`: an
    already bound MLP to use instead of binding `src.mlp` as a dense SwiGLU (MoE layers)."""
    attn = src.self_attn
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    n_kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    with torch.device("meta"):
        layer = Qwen3DecoderLayer(cfg.hidden_size, cfg.num_attention_heads, n_kv, head_dim, cfg.intermediate_size,
                                  float(getattr(cfg, "rms_norm_eps", 1e-6)))
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        bind_linear(getattr(layer.self_attn, name), getattr(attn, name))
    for name in ("q_norm", "k_norm"):  # Qwen3 only; Llama/Qwen2/Mistral have none
        if hasattr(attn, name) and getattr(attn, name) is not None:
            bind_norm(getattr(layer.self_attn, name), getattr(attn, name))
        else:
            setattr(layer.self_attn, name, nn.Identity())
    if mlp is not None:
        layer.mlp = mlp
    else:
        for name in ("gate_proj", "up_proj", "down_proj"):
            bind_linear(getattr(layer.mlp, name), getattr(src.mlp, name))
    bind_norm(layer.input_layernorm, src.input_layernorm)
    bind_norm(layer.post_attention_layernorm, src.post_attention_layernorm)
    left = [n for n, p in layer.named_parameters() if p.is_meta]
    if left:
        raise RuntimeError(f"unbound parameters after binding to the HF layer: {left}")
    return layer


class _FlashCache:
    """flash-attn layout [B, Lmax, hkv, d]; the kernel appends at `cache_seqlens` in place."""

    def __init__(self, batch, num_kv_heads, max_len, head_dim, dtype, device):
        shape = (batch, max_len, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)


class FastTargetRunner(TargetRunner):
    supports_graphs = True
    kind = "fast"
    # A family's subclass swaps these for its own coverage check, layer binding and per-layer cache.
    why_unsupported = staticmethod(fast_runner_unsupported)
    bind_layer = staticmethod(bind_decoder_layer)

    def __init__(self, target: TargetModel, layer_ids=(), attention: str = "auto"):
        super().__init__(target, layer_ids)
        why = self.why_unsupported(target)
        if why:
            raise ValueError(f"{self.kind} target runner cannot drive this model: {why}")
        base = target.hf.model
        cfg = target.config
        self.embed = base.embed_tokens
        self.norm = base.norm
        self.lm_head = target.hf.get_output_embeddings()
        self.layers = nn.ModuleList(self.bind_layer(layer, cfg) for layer in base.layers)
        rot = base.rotary_emb
        self.inv_freq = rot.inv_freq
        self.rope_scaling = float(getattr(rot, "attention_scaling", 1.0))
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.attention = self._pick_attention(attention)
        self.caches: list = []

    def _pick_attention(self, attention: str) -> str:
        if attention not in ("auto", "sdpa", "flash"):
            raise ValueError(f"attention must be auto|sdpa|flash, got {attention!r}")
        usable = (flash_attn_available() and self.device.type == "cuda"
                  and self.dtype in (torch.float16, torch.bfloat16) and self.head_dim <= 256 and self.head_dim % 8 == 0)
        if attention == "flash" and not usable:
            raise ValueError("attention='flash' needs flash-attn installed, a CUDA device, fp16/bf16 and head_dim <= 256")
        if attention == "auto":
            return "flash" if usable else "sdpa"
        return attention

    def allocate(self, batch_size: int, max_len: int) -> None:
        if batch_size == self.batch_size and max_len == self.max_len and self.caches:
            self.lengths.zero_()
            return
        self.batch_size, self.max_len = batch_size, max_len
        self.caches = [self.new_cache(batch_size, max_len) for _ in self.layers]
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=self.device)
        self._slots = torch.arange(max_len, device=self.device)

    def scratch_state(self) -> list:
        return list(self.caches)   # verify writes K/V at positions lengths..lengths+S-1

    def new_cache(self, batch_size: int, max_len: int):
        cls = _FlashCache if self.attention == "flash" else KVCache
        return cls(batch_size, self.num_kv_heads, max_len, self.head_dim, self.dtype, self.device)

    def _layer_flash(self, layer: Qwen3DecoderLayer, x, cos, sin, cache: _FlashCache, seqlens):
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        q = attn.project_q(h, cos, sin).transpose(1, 2)
        k, v = attn.project_kv(h, cos, sin)
        out = flash_attn_with_kvcache()(q, cache.k, cache.v, k=k.transpose(1, 2), v=v.transpose(1, 2),
                                       cache_seqlens=seqlens, causal=True)
        x = x + attn.output(out.transpose(1, 2))
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, logit_rows: torch.Tensor | None = None) -> TargetOutput:
        """Rows `ids` at `positions` [B, S] (contiguous per request). `logit_rows` [B]: if given, logits
        only at that row of each request ([B, 1, V]; prefill's last token); features always for all rows."""
        if not self.caches:
            raise RuntimeError("call allocate(batch_size, max_len) first")
        x = self.embed(ids)
        cos, sin = rope_cos_sin(positions, self.inv_freq, x.dtype, self.rope_scaling)
        last_layer = self.num_layers - 1
        taps: dict[int, torch.Tensor] = {}
        if self.attention == "flash":
            seqlens = positions[:, 0].to(torch.int32)
            for i, layer in enumerate(self.layers):
                x = self._layer_flash(layer, x, cos, sin, self.caches[i], seqlens)
                if i in self.layer_ids and i != last_layer:
                    taps[i] = x
        else:
            # One mask for every layer, over the slots this call can see (the loop's live span, else all).
            slots = self._slots[:self.visible_slots()]
            mask = additive_mask((slots[None, None, :] <= positions[:, :, None])[:, None], x.dtype)
            for i, layer in enumerate(self.layers):
                x = layer(x, cos, sin, mask, cache=self.caches[i], positions=positions)
                if i in self.layer_ids and i != last_layer:
                    taps[i] = x
        last = self.norm(x)
        taps[last_layer] = last  # transformers' hidden_states[-1] is the final-norm output
        if self.layer_ids:
            feats = torch.cat([taps[l] for l in self.layer_ids], dim=-1)
        else:
            feats = last[..., :0]
        logits = self.lm_head(last if logit_rows is None else gather_rows(last, logit_rows))
        return TargetOutput(logits, feats, last)

    def prefill(self, ids, lengths, last_logits_only: bool = False) -> TargetOutput:
        b, t = ids.shape
        if b != self.batch_size or t > self.max_len:
            raise ValueError(f"prefill of {tuple(ids.shape)} does not fit caches [{self.batch_size}, {self.max_len}]")
        positions = torch.arange(t, device=ids.device).expand(b, -1)
        lengths = lengths.to(self.device)
        out = self._forward(ids, positions, (lengths - 1) if last_logits_only else None)
        self.lengths.copy_(lengths)
        return out

    def verify(self, tokens, positions=None) -> TargetOutput:
        if positions is None:
            positions = self.lengths[:, None] + torch.arange(tokens.shape[1], device=tokens.device)
        return self._forward(tokens, positions)


# ---------------------------------------------------------------------------------------------------
# generic (exact, slow) runner
# ---------------------------------------------------------------------------------------------------

class RecomputeTargetRunner(TargetRunner):
    """Any transformers causal LM. Keeps token history [B, Lmax] on the device; every call re-runs the
    model over the history up to the furthest written position (right padding is harmless: a causal
    model never lets a position see later ones). Not graph-safe (one host sync per call)."""

    kind = "recompute"

    def allocate(self, batch_size: int, max_len: int) -> None:
        self.batch_size, self.max_len = batch_size, max_len
        self.history = torch.zeros(batch_size, max_len, dtype=torch.long, device=self.device)
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=self.device)

    def scratch_state(self) -> list:
        return [self.history]   # verify writes the tokens at positions lengths..lengths+S-1

    def _run(self, upto: int) -> TargetOutput:
        return self.target(self.history[:, :upto], layer_ids=self.layer_ids)

    def prefill(self, ids, lengths, last_logits_only: bool = False) -> TargetOutput:
        b, t = ids.shape
        self.history.zero_()
        self.history[:, :t] = ids
        self.lengths.copy_(lengths.to(self.device))
        out = self._run(t)
        if last_logits_only:
            out = TargetOutput(gather_rows(out.logits, self.lengths - 1), out.layer_hidden, out.last_hidden)
        return out

    def verify(self, tokens, positions=None) -> TargetOutput:
        if positions is None:
            positions = self.lengths[:, None] + torch.arange(tokens.shape[1], device=tokens.device)
        self.history.scatter_(1, positions, tokens)
        out = self._run(int(positions.max()) + 1)

        def pick(x):
            return x.gather(1, positions[..., None].expand(-1, -1, x.shape[-1]))

        return TargetOutput(pick(out.logits), pick(out.layer_hidden), pick(out.last_hidden))


__all__ = ["TargetRunner", "FastTargetRunner", "RecomputeTargetRunner", "fast_runner_unsupported",
           "flash_attn_available", "bind_decoder_layer", "FAST_MODEL_TYPES"]
