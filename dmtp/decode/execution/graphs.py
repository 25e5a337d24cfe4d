"""CUDA graphs for the decoding round (decode-loop.md §3).

`SpecDecoder` hands `RoundGraphs` the round's stages (`dmtp.decode.stage.Stage`: no-argument functions
that read and write buffers allocated before capture (KV caches, lengths, anchors, candidates, verify outputs, logs) — for
one batch-size bucket and one sampling mode. `capture`:

1. warms every stage up on a side stream (three passes), the second under
   `torch.cuda.set_sync_debug_mode("error")`: a stage that syncs with the host (`.item()`, a copy from
   a Python list, ...) cannot be captured and stays eager;
2. restores the state the warm-up mutated (`reset`: the loop's snapshot of what the stages declare they write);
3. captures each remaining stage into its own graph, all in one memory pool (shared across buckets),
   on the warm-up stream; a stage whose capture fails also stays eager;
4. restores the state again.

Only temporaries live in the pool: anything read across stages or rounds is a pre-allocated buffer
written in place, so replay order cannot corrupt it, and no host value is baked into a graph (every
position/length is a device tensor; Python values — temperature, top-k/p, widths — are fixed per
graph key). Random sampling uses the default CUDA generator, whose philox offset advances on replay.

`granularity="stage"` (default) gives per-stage timing with CUDA events between replays;
`granularity="round"` captures the whole round as one graph (fewest launches; only "round" timing)
when every stage is capturable. On CPU nothing here is used: the loop calls the same stages eagerly.
"""
from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable

import torch

from dmtp.decode.stage import Stage

_SHARED_POOL = None


def graphs_available(device) -> bool:
    return torch.device(device).type == "cuda" and torch.cuda.is_available()


def _shared_pool():
    global _SHARED_POOL
    if _SHARED_POOL is None:
        _SHARED_POOL = torch.cuda.graph_pool_handle()
    return _SHARED_POOL


@contextlib.contextmanager
def _sync_debug_error():
    prev = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(prev)


class RoundGraphs:
    def __init__(self, stages: list[Stage], granularity: str = "stage",
                 warmup_iters: int = 2, pool=None):
        if granularity not in ("stage", "round"):
            raise ValueError(f"granularity must be 'stage' or 'round', got {granularity!r}")
        self.stages = list(stages)
        self.granularity = granularity
        self.warmup_iters = max(1, warmup_iters)
        self.pool = pool
        self.items: list[tuple[str, Callable[[], None] | None, torch.cuda.CUDAGraph | None]] = []
        self.eager_stages: list[str] = []

    def capture(self, reset: Callable[[], None]) -> "RoundGraphs":
        pool = self.pool if self.pool is not None else _shared_pool()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        eager: set[int] = set()
        with torch.cuda.stream(stream):
            for it in range(self.warmup_iters + 1):
                for i, stage in enumerate(self.stages):
                    name, fn = stage.name, stage.run
                    if it == 1:  # the first pass may initialise lazily (e.g. RoPE tables); check the second
                        try:
                            with _sync_debug_error():
                                fn()
                        except RuntimeError as e:
                            eager.add(i)
                            warnings.warn(f"decode stage {name!r} syncs with the host and runs eagerly: {e}")
                            fn()
                    else:
                        fn()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        reset()

        items = []
        if self.granularity == "round" and not eager:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool, stream=stream):
                for stage in self.stages:
                    stage.run()
            items.append(("round_graph", None, g))
        else:
            for i, stage in enumerate(self.stages):
                name, fn = stage.name, stage.run
                if i in eager:
                    items.append((name, fn, None))
                    continue
                g = torch.cuda.CUDAGraph()
                try:
                    with torch.cuda.graph(g, pool=pool, stream=stream):
                        fn()
                except Exception as e:  # pragma: no cover - depends on kernels
                    warnings.warn(f"capturing decode stage {name!r} failed ({e}); it runs eagerly")
                    torch.cuda.synchronize()
                    eager.add(i)
                    items.append((name, fn, None))
                    continue
                items.append((name, None, g))
        torch.cuda.synchronize()
        reset()
        self.items = items
        self.eager_stages = [self.stages[i].name for i in sorted(eager)]
        return self

    def replay(self, timer=None) -> None:
        for name, fn, g in self.items:
            ctx = timer.stage(name) if (timer is not None and name != "round_graph") else contextlib.nullcontext()
            with ctx:
                if g is not None:
                    g.replay()
                else:
                    fn()


__all__ = ["RoundGraphs", "graphs_available"]
