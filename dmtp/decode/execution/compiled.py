"""The compiled round: `torch.compile` (inductor) of each decoding stage, the CPU analogue of CUDA graphs.

On CPU a round of a tiny model is a few thousand small kernels, so per-op overhead is what it costs;
inductor fuses the elementwise chains (norms, RoPE, masks, the accept step) into a few generated C++
kernels. `SpecDecoder(..., compile=True)` hands `CompiledRound` the round's stages (the same
no-argument functions the eager loop and `RoundGraphs` run) for one batch size, cache length and
sampling mode, like a graph capture:

The loop compiles the whole round as one program (granularity "round"): compiled stage by stage,
inductor's programs lost acceptance across the stage boundaries on trained drafters (tokens still exact;
not isolated further), and one program also has the fewest entries and guards.

1. `warm_up` compiles every stage by running it (twice: the first call compiles, the second checks
   that nothing recompiles) and restores the state the warm-up mutated (`reset`, the loop's snapshot of
   what the stages declare they write);
   the seconds it took are the compile time, reported apart from decoding (`DecodeResult.extra`);
2. `replay` runs the compiled stages in order.

Shapes are fixed per state (the loop buckets the cache length and batch as for graphs, and keeps the
eager live span off), so each stage compiles once per (batch, cache length, sampling mode); later
states with the same shapes reuse the compiled code (dynamo guards on shapes, not on the buffers).
Each stage must trace as one graph (`fullgraph`); a replay then runs only the guards that tell a
stage's programs apart (programs of other shapes or methods live on the same code objects), the
protocol `torch.compiler.set_stance(skip_guard_eval_unsafe=True)` is made for: nothing is replayed that
was not warmed up with every guard checked first. One graph per stage is also what keeps dynamo well
behaved across decoders: a stage traced in pieces (a graph break) gets its code object marked "skip"
for the rest of the process, and every later compile of that stage, for any decoder or shape, would
silently run eagerly. This is why compiled rounds are greedy only: sampling reads the run's seeded
`torch.Generator`, which dynamo does not trace (`SpecDecoder.replays_program`).
Inductor's kernels reduce in a different order than eager ATen ones, so logits can differ in the last
bits: greedy tokens are the target's own except at exact near-ties (tested equal to eager's).
"""
from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable

import torch

from dmtp.decode.stage import Stage

# Every (stage, shapes, sampling mode) is one compiled entry of that stage's code object; a benchmark
# decodes several methods at several batch sizes, far beyond dynamo's default of 8 entries.
_MIN_RECOMPILE_LIMIT = 256


def _raise_recompile_limit() -> None:
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):   # the newer name, then the older one
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), _MIN_RECOMPILE_LIMIT))
            return


class CompiledRound:
    """Every stage must trace as one graph.

    A stage that cannot (an op dynamo does not trace) runs eagerly, with a warning, as a stage that syncs does under
    CUDA graphs; the others replay without re-evaluating their guards."""

    def __init__(self, stages: list[Stage], granularity: str = "round", backend: str = "inductor"):
        if granularity not in ("stage", "round"):
            raise ValueError(f"granularity must be 'stage' or 'round', got {granularity!r}")
        _raise_recompile_limit()
        steps = [(s.name, s.run) for s in stages]
        if granularity == "round":   # one program for the whole round: fewest entries, only "round" timing
            steps = [("round_graph", _sequence([fn for _, fn in steps]))]
        # dynamic=False: one specialised program per shape (the loop fixes the shapes per state).
        # fullgraph: a stage compiled in pieces would make dynamo skip its code for good (module docstring).
        self.items = [(name, fn, torch.compile(fn, dynamic=False, backend=backend, fullgraph=True))
                      for name, fn in steps]
        self.eager_stages: list[str] = []
        self.compile_s = 0.0

    def warm_up(self, reset: Callable[[], None]) -> "CompiledRound":
        """Compile every stage by running it twice (the second run must not recompile), then `reset`."""
        t0 = time.perf_counter()
        for it in range(2):
            for i, (name, fn, compiled) in enumerate(self.items):
                if it == 0:
                    try:   # tracing and compiling happen before the stage runs: a failure ran nothing
                        compiled()
                    except (torch._dynamo.exc.Unsupported, torch._dynamo.exc.BackendCompilerFailed) as e:
                        warnings.warn(f"decode stage {name!r} does not compile as one graph and runs eagerly: "
                                      f"{str(e).splitlines()[0]}")
                        self.items[i] = (name, fn, fn)
                        self.eager_stages.append(name)
                        fn()
                else:
                    compiled()
        self.compile_s = time.perf_counter() - t0
        reset()
        return self

    def replay(self, timer=None) -> None:
        # Every program replayed here was compiled and checked against all its guards in `warm_up`. One
        # graph per stage: only the guards that tell a stage's programs apart need to run (all of them
        # cost more than a small stage: ~0.4 ms, for hundreds of tensors reached through the closures).
        with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
            for name, _, fn in self.items:
                with (timer.stage(name) if timer is not None and name != "round_graph" else contextlib.nullcontext()):
                    fn()


def _sequence(fns: list[Callable[[], None]]) -> Callable[[], None]:
    def run_round():
        for fn in fns:
            fn()
    return run_round


__all__ = ["CompiledRound"]
