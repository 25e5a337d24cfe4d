"""The cost table of `verify_length=auto`: the seconds of one decoding round at each verify length L = 0..K,
measured once per batch shape on the live state (dmtp/decode/verify_length/policy.py reads it).

Each L's round (its CUDA graph, compiled program or eager stages) runs once untimed (first-call allocations),
then `reps` times, the lengths interleaved so that a machine's drift reaches them alike, each run timed
between device syncs and followed by a restore of the state it changed (the capture protocol's `reset`:
the rounds it runs are not decoding). The fastest of each L's runs is its cost: what other work adds to a
run is never negative, so the minimum is the estimate least distorted by it. `clock`: the loop's
(`SpecDecoder.clock`): on CUDA wall time, on a CPU the process's CPU time, which other processes on the
machine do not inflate (wall-clock tables on the 2-core machine shared with other jobs were out of order
by 40% with a median of 5, and by up to 60% with the fastest of 15 under a load of 5)."""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence


def measure_round_costs(rounds: Sequence[Callable[[], None]], reset: Callable[[], None],
                        sync: Callable[[], None], reps: int = 7,
                        clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """rounds[L]: one round verifying L candidates -> seconds per L, the fastest of `reps` (module docstring)."""
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    for run in rounds:
        run()
        sync()
        reset()
    times: list[list[float]] = [[] for _ in rounds]
    for _ in range(reps):
        for length, run in enumerate(rounds):
            sync()
            t0 = clock()
            run()
            sync()
            times[length].append(clock() - t0)
            reset()
    return [min(t) for t in times]


__all__ = ["measure_round_costs"]
