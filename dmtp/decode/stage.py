"""One step of a decoding round, with the state it changes declared next to it.

A stage is a no-argument function over preallocated buffers (so that it can run eagerly, replay as a
CUDA graph or run compiled). What it mutates is part of its definition:

* `writes`: tensors it changes in place that later stages or rounds read (lengths, anchors, output
  buffers, the MTP's next hidden, ...). A graph capture or a compile warm-up runs the stages on the live
  state and must put these back: `snapshot` copies exactly them.
* `scratch`: buffers (tensors, or cache objects whose every tensor counts) that it writes only at rows
  at or past the committed lengths: KV caches, the MTP's chained rows, a recurrent layer's per-row
  states. Nothing reads those rows before a later round overwrites them, so a warm-up may leave them.

tests/test_decode_stage_writes.py runs every stage of every method and fails if it changes a tensor it
did not declare, so a new buffer cannot silently escape the snapshot.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[], None]
    writes: tuple[torch.Tensor, ...] = ()
    scratch: tuple[object, ...] = ()

    def scratch_tensors(self) -> list[torch.Tensor]:
        """The scratch tensors as of now (a cache may allocate its per-width buffers on first use)."""
        out = []
        for item in self.scratch:
            if isinstance(item, torch.Tensor):
                out.append(item)
            else:
                out += [v for v in vars(item).values() if isinstance(v, torch.Tensor)]
        return out


def present(*tensors: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """The tensors that exist (optional buffers are None when a mode does not need them)."""
    return tuple(t for t in tensors if t is not None)


def snapshot(stages: Iterable[Stage]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(buffer, copy) of every tensor the stages declare they write, each once."""
    seen: set[int] = set()
    out = []
    for stage in stages:
        for t in stage.writes:
            if id(t) not in seen:
                seen.add(id(t))
                out.append((t, t.clone()))
    return out


def restore(saved: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
    for t, copy in saved:
        t.copy_(copy)


__all__ = ["Stage", "present", "restore", "snapshot"]
