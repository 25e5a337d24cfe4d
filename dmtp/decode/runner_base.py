"""The interface every target runtime of the decoding loop implements, and the helpers they share.

State: `lengths [B]` (device, long) counts the tokens each request has committed to the cache.
`prefill` writes the prompts; `verify(tokens, positions)` writes the rows at `positions` (default
`lengths + arange(S)`) and does not move `lengths`; the loop calls `advance(n)` with each request's
committed count. Rejected rows stay in memory beyond `lengths` and are overwritten by the next verify:
caches are never sliced. Every runner returns `TargetOutput(logits, layer_hidden, last_hidden)` with
`TargetModel`'s conventions (`layer_hidden` concatenates `hidden_states[l + 1]` of the tapped layers,
the last layer's entry being the final-norm output; `last_hidden` is the final-norm output).
"""
from __future__ import annotations

import torch
from torch import nn

from dmtp.models.target import TargetModel, TargetOutput

try:  # optional CUDA kernel
    from flash_attn import flash_attn_with_kvcache as _flash_attn_with_kvcache  # type: ignore
except Exception:  # pragma: no cover - not installed on CPU machines
    _flash_attn_with_kvcache = None


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
        `lengths`. Logits [B, T, V] (or [B, 1, V] at each request's last valid position)."""
        raise NotImplementedError

    def verify(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> TargetOutput:
        raise NotImplementedError

    def advance(self, n: torch.Tensor) -> None:
        """Commit `n [B]` more rows per request (in place: graph-safe)."""
        self.lengths.add_(n)

    def round_state(self) -> list[torch.Tensor]:
        """Every committed-state tensor that `advance` changes in place (rows past `lengths` are scratch):
        what a CUDA-graph warm-up must snapshot and restore. Recurrent runners add their states."""
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


def bind_linear(dst: nn.Linear, src: nn.Linear) -> None:
    """Make `dst` use `src`'s own Parameter objects (no copy)."""
    dst.weight = src.weight
    dst.bias = src.bias


def bind_norm(dst: nn.Module, src: nn.Module) -> None:
    dst.weight = src.weight
    dst.eps = float(getattr(src, "variance_epsilon", getattr(src, "eps", 1e-6)))


__all__ = ["TargetRunner", "gather_rows", "bind_linear", "bind_norm", "flash_attn_available",
           "flash_attn_with_kvcache"]
