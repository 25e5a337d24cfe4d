"""Wall-clock (or CUDA-event) milliseconds per named stage of a decoding round, past the warm-up rounds."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["StageTimer"]


def _default_sync(device: torch.device | str | None) -> Callable[[], None]:
    if device is not None and torch.device(device).type == "cuda":
        dev = torch.device(device)
        return lambda: torch.cuda.synchronize(dev)
    return lambda: None


class StageTimer:
    """Accumulates wall-clock ms per named stage and per round.

    Usage::

        timer = StageTimer(skip_rounds=2, device=device)
        for _ in range(rounds):
            with timer.round():                 # times the whole round as "round"
                with timer.stage("drafter"): ...
                with timer.stage("verify"): ...
        timer.ms_per_round()  # {"drafter": ..., "verify": ..., "round": ...}

    ``timer.round()`` closes the round on exit; alternatively call :meth:`end_round`.
    Rounds with index ``< skip_rounds`` (warm-up) are excluded. A stage entered several times
    in a round is summed; a stage absent from a round contributes 0 for that round, so the
    figures are the average cost per counted round.

    Host timing (default) reads ``time.perf_counter`` after calling ``sync`` (by default
    ``torch.cuda.synchronize`` on CUDA devices, a no-op otherwise). With
    ``use_cuda_events=True`` (CUDA only) stages record ``torch.cuda.Event`` pairs on the
    current stream instead, without syncing; they are resolved in :meth:`ms_per_round`.
    """

    def __init__(
        self,
        skip_rounds: int = 0,
        sync: Callable[[], None] | None = None,
        device: torch.device | str | None = None,
        use_cuda_events: bool = False,
    ):
        self.skip_rounds = int(skip_rounds)
        self.sync = sync if sync is not None else _default_sync(device)
        if use_cuda_events and not torch.cuda.is_available():
            raise RuntimeError("use_cuda_events=True needs CUDA")
        self.use_cuda_events = bool(use_cuda_events)
        self.reset()

    def reset(self) -> None:
        self.round_index = 0
        self._totals_ms: dict[str, float] = {}
        self._events: list[tuple[str, Any, Any]] = []  # (name, start, end) for counted rounds
        self._counted_rounds = 0
        self._order: list[str] = []

    @property
    def counted_rounds(self) -> int:
        return self._counted_rounds

    def _counting(self) -> bool:
        return self.round_index >= self.skip_rounds

    def _register(self, name: str) -> None:
        if name not in self._order:
            self._order.append(name)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        counting = self._counting()
        if self.use_cuda_events:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                yield
            finally:
                end.record()
                self._register(name)
                if counting:
                    self._events.append((name, start, end))
            return
        self.sync()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.sync()
            dt_ms = (time.perf_counter() - t0) * 1e3
            self._register(name)
            if counting:
                self._totals_ms[name] = self._totals_ms.get(name, 0.0) + dt_ms

    def end_round(self) -> None:
        if self._counting():
            self._counted_rounds += 1
        self.round_index += 1

    @contextlib.contextmanager
    def round(self, name: str = "round") -> Iterator[None]:
        """Time the whole round as stage ``name`` and close the round on exit."""
        try:
            with self.stage(name):
                yield
        finally:
            self.end_round()

    def total_ms(self) -> dict[str, float]:
        """Total ms per stage over counted rounds (CUDA events are resolved here)."""
        if self._events:
            torch.cuda.synchronize()
            for name, start, end in self._events:
                self._totals_ms[name] = self._totals_ms.get(name, 0.0) + start.elapsed_time(end)
            self._events.clear()
        return {name: self._totals_ms.get(name, 0.0) for name in self._order}

    def ms_per_round(self) -> dict[str, float]:
        """Average ms per counted (post-warm-up, completed) round, per stage."""
        totals = self.total_ms()
        n = self._counted_rounds
        return {name: (t / n if n > 0 else float("nan")) for name, t in totals.items()}
