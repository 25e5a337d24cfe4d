"""Target runtimes for the decoding loop: static KV caches, per-request lengths, rollback = not advancing.

Two runners share one interface (`TargetRunner`):

* `FastTargetRunner` — dense-attention Qwen3 / Qwen2 / Llama / Mistral targets. Our own forward
  (the blocks of `dmtp.models.qwen3`) whose parameters ARE the Hugging Face model's parameters (bound
  by reference, never copied), over static caches `[B, hkv, Lmax, d]` (or flash-attn's `[B, Lmax, hkv, d]`
  when `flash_attn` is installed and the dtype is fp16/bf16). Every shape is fixed and every
  position is a device tensor, so a verify step can be captured in a CUDA graph.
* `RecomputeTargetRunner` — any other transformers causal LM: it keeps each request's token history
  on the device and re-runs the whole model over it at every call. Exact, slow, no graphs.

Both return `TargetOutput(logits, layer_hidden, last_hidden)` with `TargetModel`'s conventions:
`layer_hidden` concatenates `hidden_states[l + 1]` for the tapped layers (transformers' last entry is
the final-norm output, so tapping the last layer gives a post-norm feature — replicated here), and
`last_hidden` is the final-norm output.

State: `lengths [B]` (device, long) counts the tokens each request has committed to the cache.
`verify(tokens, positions)` writes the rows' K/V at `positions` (default `lengths + arange(S)`) and
does not move `lengths`; the loop calls `advance(n)` with the accepted count. Rejected rows stay in
memory beyond `lengths` and are overwritten by the next verify: caches are never sliced.
"""
from __future__ import annotations

import torch
from torch import nn

from dmtp.models.qwen3 import KVCache, Qwen3DecoderLayer
from dmtp.models.target import TargetModel, TargetOutput

FAST_MODEL_TYPES = ("qwen3", "qwen2", "llama", "mistral")
_STATIC_ROPE = ("default", "linear", "llama3", "yarn", None)

try:  # optional CUDA kernel
    from flash_attn import flash_attn_with_kvcache as _flash_attn_with_kvcache  # type: ignore
except Exception:  # pragma: no cover - not installed on CPU machines
    _flash_attn_with_kvcache = None


def flash_attn_available() -> bool:
    return _flash_attn_with_kvcache is not None


class TargetRunner:
    """Interface of a target runtime (see module docstring)."""

    supports_graphs = False
    kind = "base"

    def __init__(self, target: TargetModel, layer_ids=()):
        target.check_layer_ids(layer_ids)
        self.target = target
        self.layer_ids = [int(i) for i in layer_ids]
        self.num_layers = target.num_layers
        self.hidden_size = target.hidden_size
        self.feature_dim = len(self.layer_ids) * self.hidden_size
        self.batch_size = 0
        self.max_len = 0
        self.lengths: torch.Tensor | None = None

    @property
    def device(self) -> torch.device:
        return self.target.device

    @property
    def dtype(self) -> torch.dtype:
        return self.target.dtype

    def allocate(self, batch_size: int, max_len: int) -> None:
        raise NotImplementedError

    def prefill(self, ids: torch.Tensor, lengths: torch.Tensor, last_logits_only: bool = False) -> TargetOutput:
        """Right-padded prompts ids [B, T] with valid lengths [B]. Writes positions 0..T-1 and sets
        `lengths`. Logits [B, T, V] (or [B, 1, V] at each request's last valid position)."""
        raise NotImplementedError

    def verify(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> TargetOutput:
        raise NotImplementedError

    def advance(self, n: torch.Tensor) -> None:
        """Commit `n [B]` more rows per request (in place: graph-safe)."""
        self.lengths.add_(n)

    def set_features(self, layer_ids) -> None:
        self.target.check_layer_ids(layer_ids)
        self.layer_ids = [int(i) for i in layer_ids]
        self.feature_dim = len(self.layer_ids) * self.hidden_size


def _gather_rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x [B, T, D], idx [B] -> [B, 1, D]."""
    return x.gather(1, idx.view(-1, 1, 1).expand(-1, 1, x.shape[-1]))


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
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type")) not in _STATIC_ROPE:
        return f"rope type {rope.get('rope_type')!r} (position-dependent frequencies)"
    base = getattr(target.hf, "model", None)
    if base is None or not all(hasattr(base, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return "unexpected module layout"
    return None


def _bind_linear(dst: nn.Linear, src: nn.Linear) -> None:
    dst.weight = src.weight
    dst.bias = src.bias


def _bind_norm(dst: nn.Module, src: nn.Module) -> None:
    dst.weight = src.weight
    dst.eps = float(getattr(src, "variance_epsilon", getattr(src, "eps", 1e-6)))


def bind_decoder_layer(src: nn.Module, cfg) -> Qwen3DecoderLayer:
    """A `Qwen3DecoderLayer` whose parameters are `src`'s own Parameter objects (no copy)."""
    attn = src.self_attn
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    n_kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    with torch.device("meta"):
        layer = Qwen3DecoderLayer(cfg.hidden_size, cfg.num_attention_heads, n_kv, head_dim, cfg.intermediate_size,
                                  float(getattr(cfg, "rms_norm_eps", 1e-6)))
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        _bind_linear(getattr(layer.self_attn, name), getattr(attn, name))
    for name in ("q_norm", "k_norm"):  # Qwen3 only; Llama/Qwen2/Mistral have none
        if hasattr(attn, name) and getattr(attn, name) is not None:
            _bind_norm(getattr(layer.self_attn, name), getattr(attn, name))
        else:
            setattr(layer.self_attn, name, nn.Identity())
    for name in ("gate_proj", "up_proj", "down_proj"):
        _bind_linear(getattr(layer.mlp, name), getattr(src.mlp, name))
    _bind_norm(layer.input_layernorm, src.input_layernorm)
    _bind_norm(layer.post_attention_layernorm, src.post_attention_layernorm)
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

    def __init__(self, target: TargetModel, layer_ids=(), attention: str = "auto"):
        super().__init__(target, layer_ids)
        why = fast_runner_unsupported(target)
        if why:
            raise ValueError(f"fast target runner cannot drive this model: {why}")
        base = target.hf.model
        cfg = target.config
        self.embed = base.embed_tokens
        self.norm = base.norm
        self.lm_head = target.hf.get_output_embeddings()
        self.layers = nn.ModuleList(bind_decoder_layer(layer, cfg) for layer in base.layers)
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
        cls = _FlashCache if self.attention == "flash" else KVCache
        self.caches = [cls(batch_size, self.num_kv_heads, max_len, self.head_dim, self.dtype, self.device)
                       for _ in self.layers]
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=self.device)
        self._slots = torch.arange(max_len, device=self.device)

    def _rope(self, positions: torch.Tensor, dtype):
        freqs = positions.to(torch.float32)[..., None] * self.inv_freq.to(device=positions.device, dtype=torch.float32)
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if self.rope_scaling != 1.0:
            cos, sin = cos * self.rope_scaling, sin * self.rope_scaling
        return cos.to(dtype), sin.to(dtype)

    def _layer_flash(self, layer: Qwen3DecoderLayer, x, cos, sin, cache: _FlashCache, seqlens):
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        q = attn.project_q(h, cos, sin).transpose(1, 2)
        k, v = attn.project_kv(h, cos, sin)
        out = _flash_attn_with_kvcache(q, cache.k, cache.v, k=k.transpose(1, 2), v=v.transpose(1, 2),
                                       cache_seqlens=seqlens, causal=True)
        x = x + attn.output(out.transpose(1, 2))
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, logit_rows: torch.Tensor | None = None) -> TargetOutput:
        """Rows `ids` at `positions` [B, S] (contiguous per request). `logit_rows` [B]: if given, logits
        only at that row of each request ([B, 1, V]; prefill's last token); features always for all rows."""
        if not self.caches:
            raise RuntimeError("call allocate(batch_size, max_len) first")
        x = self.embed(ids)
        cos, sin = self._rope(positions, x.dtype)
        last_layer = self.num_layers - 1
        taps: dict[int, torch.Tensor] = {}
        if self.attention == "flash":
            seqlens = positions[:, 0].to(torch.int32)
            for i, layer in enumerate(self.layers):
                x = self._layer_flash(layer, x, cos, sin, self.caches[i], seqlens)
                if i in self.layer_ids and i != last_layer:
                    taps[i] = x
        else:
            mask = (self._slots[None, None, :] <= positions[:, :, None])[:, None]
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
        logits = self.lm_head(last if logit_rows is None else _gather_rows(last, logit_rows))
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

    def _run(self, upto: int) -> TargetOutput:
        return self.target(self.history[:, :upto], layer_ids=self.layer_ids)

    def prefill(self, ids, lengths, last_logits_only: bool = False) -> TargetOutput:
        b, t = ids.shape
        self.history.zero_()
        self.history[:, :t] = ids
        self.lengths.copy_(lengths.to(self.device))
        out = self._run(t)
        if last_logits_only:
            out = TargetOutput(_gather_rows(out.logits, self.lengths - 1), out.layer_hidden, out.last_hidden)
        return out

    def verify(self, tokens, positions=None) -> TargetOutput:
        if positions is None:
            positions = self.lengths[:, None] + torch.arange(tokens.shape[1], device=tokens.device)
        self.history.scatter_(1, positions, tokens)
        out = self._run(int(positions.max()) + 1)

        def pick(x):
            return x.gather(1, positions[..., None].expand(-1, -1, x.shape[-1]))

        return TargetOutput(pick(out.logits), pick(out.layer_hidden), pick(out.last_hidden))


def make_target_runner(target: TargetModel, layer_ids=(), kind: str = "auto", attention: str = "auto") -> TargetRunner:
    """kind: auto (fast when the architecture allows, else recompute) | fast | recompute."""
    if kind not in ("auto", "fast", "recompute"):
        raise ValueError(f"runner kind must be auto|fast|recompute, got {kind!r}")
    if kind == "recompute" or (kind == "auto" and fast_runner_unsupported(target)):
        return RecomputeTargetRunner(target, layer_ids)
    return FastTargetRunner(target, layer_ids, attention=attention)


__all__ = ["TargetRunner", "FastTargetRunner", "RecomputeTargetRunner", "make_target_runner",
           "fast_runner_unsupported", "flash_attn_available", "bind_decoder_layer", "FAST_MODEL_TYPES"]
