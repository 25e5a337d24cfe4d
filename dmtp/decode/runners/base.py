"""The interface every target runtime of the decoding loop implements, and the machinery the static-cache
runners share.

State: `lengths [B]` (device, long) counts the tokens each request has committed to the cache.
`prefill` writes the prompts; `verify(tokens, positions)` writes the rows at `positions` (default
`lengths + arange(S)`) and does not move `lengths`; the loop calls `advance(n)` with each request's
committed count. Rejected rows stay in memory beyond `lengths` and are overwritten by the next verify:
caches are never sliced. Every runner returns `TargetOutput(logits, layer_hidden, last_hidden)` with
`TargetModel`'s conventions (`layer_hidden` concatenates `hidden_states[l + 1]` of the tapped layers,
the last layer's entry being the final-norm output; `last_hidden` is the final-norm output).

`StaticCacheRunner` is the forward every family's static-cache runner runs: our own layers whose
parameters ARE the transformers model's Parameters (bound by reference with `bind`, never copied),
static per-layer caches, per-request lengths, every position a device tensor (so a verify step can be
captured in a CUDA graph), and the one choice of attention backend (`pick_attention`: SDPA with a
mask, or flash-attn's kvcache kernel on CUDA fp16/bf16 when installed). A family says which targets
it covers (`why_unsupported`), how it binds a layer (`bind_layers`), what cache a layer keeps
(`new_cache`) and how a layer runs (`run_layer`).
"""
from __future__ import annotations

import torch
from torch import nn

from dmtp.models.qwen3 import KVCache, additive_mask, attend, rope_cos_sin
from dmtp.models.target import TargetModel, TargetOutput

try:  # optional CUDA kernel
    from flash_attn import flash_attn_with_kvcache as _flash_attn_with_kvcache  # type: ignore
except Exception:  # pragma: no cover - not installed on CPU machines
    _flash_attn_with_kvcache = None

ATTENTION_CHOICES = ("auto", "sdpa", "flash")
SILU = ("silu", "swish")
STACK_PARTS = ("embed_tokens", "layers", "norm", "rotary_emb")
# transformers' attribute names that several families' layers share (bound by `bind`).
ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
SWIGLU = ("gate_proj", "up_proj", "down_proj")
LAYER_NORMS = ("input_layernorm", "post_attention_layernorm")


def flash_attn_available() -> bool:
    return _flash_attn_with_kvcache is not None


def flash_attn_with_kvcache():
    """flash-attn's `flash_attn_with_kvcache` (None when flash-attn is not installed)."""
    return _flash_attn_with_kvcache


class TargetRunner:
    """Interface of a target runtime (see module docstring)."""

    supports_graphs = False
    kind = "base"
    # Host-side bound on the cache slots a call attends to (None: all `max_len`). The eager loop sets
    # it from the committed lengths before each call, so attention and masks cost the live length, not
    # the maximum; captured graphs and the compiled path keep None (fixed shapes). A runner that does
    # not read it simply attends over the whole cache.
    span: int | None = None

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

    @staticmethod
    def why_unsupported(target: TargetModel) -> str | None:
        """Why this runner cannot drive `target` (None when it can): each runner says it for itself."""
        raise NotImplementedError

    @property
    def device(self) -> torch.device:
        return self.target.device

    @property
    def dtype(self) -> torch.dtype:
        return self.target.dtype

    def allocate(self, batch_size: int, max_len: int) -> None:
        raise NotImplementedError

    def visible_slots(self) -> int:
        """How many cache slots from 0 the next call attends to: the span, else the whole cache."""
        return self.max_len if self.span is None else min(self.span, self.max_len)

    def prefill(self, ids: torch.Tensor, lengths: torch.Tensor, last_logits_only: bool = False) -> TargetOutput:
        """Right-padded prompts ids [B, T] with valid lengths [B]. Writes positions 0..T-1 and sets
        `lengths`.

        Logits [B, T, V] (or [B, 1, V] at each request's last valid position)."""
        raise NotImplementedError

    def verify(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> TargetOutput:
        raise NotImplementedError

    def verify_positions(self, tokens: torch.Tensor) -> torch.Tensor:
        """The default rows of a verify call: each request's next `S` positions, `lengths + arange(S)`."""
        return self.lengths[:, None] + torch.arange(tokens.shape[1], device=tokens.device)

    def advance(self, n: torch.Tensor) -> None:
        """Commit `n [B]` more rows per request (in place: graph-safe)."""
        self.lengths.add_(n)

    def round_state(self) -> list[torch.Tensor]:
        """Every committed-state tensor that `advance` changes in place (rows past `lengths` are scratch):
        what a CUDA-graph warm-up must snapshot and restore.

        Recurrent runners add their states."""
        return [self.lengths]

    def scratch_state(self) -> list:
        """What `verify` writes only at rows at or past `lengths` (tensors, or cache objects whose every
        tensor counts): the verify stage declares it as scratch (`dmtp.decode.stage.Stage`)."""
        return []

    def set_features(self, layer_ids) -> None:
        self.target.check_layer_ids(layer_ids)
        self.layer_ids = [int(i) for i in layer_ids]
        self.feature_dim = len(self.layer_ids) * self.hidden_size


def gather_rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x [B, T, D], idx [B] -> [B, 1, D]."""
    return x.gather(1, idx.view(-1, 1, 1).expand(-1, 1, x.shape[-1]))


# ---------------------------------------------------------------------------------------------------
# binding transformers' parameters to our modules, by attribute name
# ---------------------------------------------------------------------------------------------------

def bind(dst: nn.Module, src: nn.Module, names, optional: bool = False) -> None:
    """Make each named part of `dst` use `src`'s own tensors (no copy), by attribute name: a tensor
    (parameter or buffer) is shared as is; a norm (a module with `eps`) shares its weight and takes
    `src`'s epsilon; any other module (linear, conv) shares weight and bias. `optional`: names that
    `src` lacks or holds as None are skipped (parts a config may leave out, e.g. q_lora)."""
    for name in names:
        part = getattr(src, name, None)
        if part is None and optional:
            continue
        if isinstance(part, torch.Tensor):
            setattr(dst, name, part)
            continue
        ours = getattr(dst, name)
        ours.weight = part.weight
        if hasattr(ours, "eps"):
            ours.eps = float(getattr(part, "variance_epsilon", getattr(part, "eps", 1e-6)))
        else:
            ours.bias = part.bias


def check_bound(layer: nn.Module, src: nn.Module) -> nn.Module:
    """Every parameter and buffer of `layer` (built on the meta device) must now be one of `src`'s tensors."""
    left = [n for n, t in [*layer.named_parameters(), *layer.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"unbound tensors after binding to {type(src).__name__}: {left}")
    return layer


def activation_unsupported(cfg) -> str | None:
    """Every static-cache family's MLPs are SwiGLU: SiLU only."""
    act = getattr(cfg, "hidden_act", "silu")
    return None if act in SILU else f"activation {act!r}"


def stack_unsupported(stack: nn.Module | None) -> str | None:
    """The decoder stack must hold the parts `StaticCacheRunner` reads."""
    if stack is None or not all(hasattr(stack, a) for a in STACK_PARTS):
        return "unexpected module layout"
    return None


# ---------------------------------------------------------------------------------------------------
# static caches
# ---------------------------------------------------------------------------------------------------

class FlashCache:
    """flash-attn layout [B, Lmax, hkv, d]; the kernel appends at `cache_seqlens` in place."""

    def __init__(self, batch, num_kv_heads, max_len, head_dim, dtype, device):
        shape = (batch, max_len, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)


def check_attention_choice(attention: str) -> None:
    if attention not in ATTENTION_CHOICES:
        raise ValueError(f"attention must be auto|sdpa|flash, got {attention!r}")


def pick_attention(attention: str, device: torch.device, dtype: torch.dtype, head_dim: int) -> str:
    """The attention backend: auto -> flash-attn when it can run here, else SDPA; flash insists."""
    check_attention_choice(attention)
    usable = (flash_attn_available() and device.type == "cuda"
              and dtype in (torch.float16, torch.bfloat16) and head_dim <= 256 and head_dim % 8 == 0)
    if attention == "flash" and not usable:
        raise ValueError("attention='flash' needs flash-attn installed, a CUDA device, fp16/bf16 and head_dim <= 256")
    if attention == "auto":
        return "flash" if usable else "sdpa"
    return attention


class StaticCacheRunner(TargetRunner):
    """The static-cache forward every family shares (see module docstring); rollback = not advancing."""

    supports_graphs = True
    family = "base"   # the name the catalogue gives reasons under

    def __init__(self, target: TargetModel, layer_ids=(), attention: str = "auto"):
        super().__init__(target, layer_ids)
        why = self.why_unsupported(target)
        if why:
            raise ValueError(f"{self.kind} target runner cannot drive this model: {why}")
        stack = self.decoder_stack(target.hf)
        cfg = target.config
        self.embed = stack.embed_tokens
        self.norm = stack.norm
        self.lm_head = target.hf.get_output_embeddings()
        self.layers = nn.ModuleList(self.bind_layers(stack, cfg))
        rot = stack.rotary_emb
        self.inv_freq = rot.inv_freq
        self.rope_scaling = float(getattr(rot, "attention_scaling", 1.0))
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.attention = self._pick_attention(attention)
        self.caches: list = []

    # --- what a family says -----------------------------------------------------------------------

    @staticmethod
    def decoder_stack(hf: nn.Module) -> nn.Module | None:
        """The transformers module holding embed_tokens / layers / norm / rotary_emb."""
        return getattr(hf, "model", None)

    def bind_layers(self, stack: nn.Module, cfg) -> list[nn.Module]:
        """Our layers, bound to the stack's layers."""
        raise NotImplementedError

    def _pick_attention(self, attention: str) -> str:
        return pick_attention(attention, self.device, self.dtype, self.head_dim)

    def new_cache(self, layer: nn.Module, batch_size: int, max_len: int):
        """The static cache of one attention layer, in the chosen backend's layout."""
        cls = FlashCache if self.attention == "flash" else KVCache
        return cls(batch_size, self.num_kv_heads, max_len, self.head_dim, self.dtype, self.device)

    def run_layer(self, layer: nn.Module, x, cos, sin, seen, cache, positions, prompt_lengths):
        """One layer over rows `x` at `positions`; `seen`: `visibility`'s value for this call."""
        raise NotImplementedError

    # --- the shared machinery ---------------------------------------------------------------------

    def allocate(self, batch_size: int, max_len: int) -> None:
        if batch_size == self.batch_size and max_len == self.max_len and self.caches:
            self.lengths.zero_()
            return
        self.batch_size, self.max_len = batch_size, max_len
        self.caches = [self.new_cache(layer, batch_size, max_len) for layer in self.layers]
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=self.device)
        self._slots = torch.arange(max_len, device=self.device)

    def scratch_state(self) -> list:
        return list(self.caches)   # verify writes rows at positions lengths..lengths+S-1

    def visibility(self, positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """What attention needs besides q/k/v, built once per forward: flash-attn's per-request cache
        lengths, else one additive mask for every layer over the slots this call can see (the loop's
        live span, else all)."""
        if self.attention == "flash":
            return positions[:, 0].to(torch.int32)
        slots = self._slots[:self.visible_slots()]
        return additive_mask((slots[None, None, :] <= positions[:, :, None])[:, None], dtype)

    def attend_cached(self, q, k, v, cache, positions, seen) -> torch.Tensor:
        """q [B,h,S,d] over the cache after writing k/v [B,hkv,S,d] at `positions` -> [B,h,S,d]."""
        if self.attention == "flash":
            return flash_attn_with_kvcache()(q.transpose(1, 2), cache.k, cache.v, k=k.transpose(1, 2),
                                             v=v.transpose(1, 2), cache_seqlens=seen, causal=True).transpose(1, 2)
        cache.write(positions, k, v)
        return attend(q, cache.k, cache.v, seen)

    def _forward(self, ids, positions, prompt_lengths=None, logit_rows=None) -> TargetOutput:
        """Rows `ids` at `positions` [B, S] (contiguous per request). `prompt_lengths` [B]: given for
        right-padded prompts (recurrent layers start from zero), None for verify rows. `logit_rows` [B]:
        if given, logits only at that row of each request ([B, 1, V]; prefill's last token); features
        always for all rows."""
        if not self.caches:
            raise RuntimeError("call allocate(batch_size, max_len) first")
        x = self.embed(ids)
        cos, sin = rope_cos_sin(positions, self.inv_freq, x.dtype, self.rope_scaling)
        seen = self.visibility(positions, x.dtype)
        last_layer = self.num_layers - 1
        taps: dict[int, torch.Tensor] = {}
        for i, (layer, cache) in enumerate(zip(self.layers, self.caches)):
            x = self.run_layer(layer, x, cos, sin, seen, cache, positions, prompt_lengths)
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
            positions = self.verify_positions(tokens)
        return self._forward(tokens, positions)


__all__ = ["TargetRunner", "StaticCacheRunner", "FlashCache", "bind", "check_bound", "gather_rows",
           "pick_attention", "check_attention_choice", "activation_unsupported", "stack_unsupported",
           "flash_attn_available", "flash_attn_with_kvcache", "ATTENTION_CHOICES", "ATTENTION_PROJECTIONS", "SWIGLU",
           "LAYER_NORMS"]
