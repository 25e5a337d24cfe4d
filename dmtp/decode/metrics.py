"""Decoding metrics (SPEC §6): acceptance statistics, per-stage timing, throughput, tables.

Acceptance length of a round = 1 + accepted candidates (the correction/bonus token is
included). ``hist[k]`` counts rounds that accepted exactly ``k`` of the ``K`` candidates.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["AcceptanceRecorder", "StageTimer", "throughput", "format_table"]


class AcceptanceRecorder:
    """Per-request lists of accepted-candidate counts per verify round.

    Args:
        num_candidates: ``K``, the number of candidates verified per round (0 for plain AR); the
            verified block is ``K + 1`` tokens (A and the candidates), a drafter's ``block_size``.
        num_requests: optional number of requests to pre-register (so requests that never
            get a round still exist; they are ignored by the per-request mean).
    """

    def __init__(self, num_candidates: int, num_requests: int = 0):
        if num_candidates < 0:
            raise ValueError("num_candidates must be >= 0")
        self.num_candidates = int(num_candidates)
        self.per_request: list[list[int]] = [[] for _ in range(num_requests)]

    # -- recording ---------------------------------------------------------------------------
    def record(
        self,
        accepted: Tensor | Sequence[int],
        active: Tensor | Sequence[bool] | None = None,
        request_ids: Tensor | Sequence[int] | None = None,
    ) -> None:
        """Append one round: ``accepted[b]`` for every row with ``active[b]``.

        ``request_ids[b]`` maps batch row ``b`` to a request index (default: the row index).
        Tensors may live on any device; they are moved to the host here (the caller fetches
        them at most once per round).
        """
        acc = torch.as_tensor(accepted).detach().cpu().reshape(-1).tolist()
        n = len(acc)
        if active is None:
            act = [True] * n
        else:
            act = torch.as_tensor(active).detach().cpu().reshape(-1).bool().tolist()
        if request_ids is None:
            rid = list(range(n))
        else:
            rid = torch.as_tensor(request_ids).detach().cpu().reshape(-1).tolist()
        if len(act) != n or len(rid) != n:
            raise ValueError("accepted, active and request_ids must have the same length")
        for a, on, r in zip(acc, act, rid):
            if not on:
                continue
            a = int(a)
            if not 0 <= a <= self.num_candidates:
                raise ValueError(f"accepted count {a} outside 0..{self.num_candidates}")
            r = int(r)
            while len(self.per_request) <= r:
                self.per_request.append([])
            self.per_request[r].append(a)

    def merge(self, other: AcceptanceRecorder) -> AcceptanceRecorder:
        """Append ``other``'s requests (as new requests, after this recorder's). Returns self."""
        if other.num_candidates != self.num_candidates:
            raise ValueError(
                f"cannot merge {self.num_candidates} and {other.num_candidates} candidates per round"
            )
        self.per_request.extend(list(r) for r in other.per_request)
        return self

    # -- statistics --------------------------------------------------------------------------
    def histogram(self) -> list[int]:
        hist = [0] * (self.num_candidates + 1)
        for rounds in self.per_request:
            for a in rounds:
                hist[a] += 1
        return hist

    @property
    def rounds(self) -> int:
        return sum(len(r) for r in self.per_request)

    def summary(self) -> dict[str, Any]:
        """SPEC §6 metrics. Ratios with an empty denominator are ``None``."""
        k_max = self.num_candidates
        hist = self.histogram()
        total = sum(hist)
        req_means = [
            sum(1 + a for a in r) / len(r) for r in self.per_request if len(r) > 0
        ]
        tau_req = sum(req_means) / len(req_means) if req_means else None
        if total > 0:
            tau_verify = 1.0 + sum(k * h for k, h in enumerate(hist)) / total
            t1 = 1.0 - hist[0] / total if k_max > 0 else None
        else:
            tau_verify = None
            t1 = None
        # at_least[k] = #rounds with L >= k, k = 0..K
        at_least = [sum(hist[k:]) for k in range(k_max + 1)]
        p_len_ge = [at_least[k] / total if total > 0 else None for k in range(1, k_max + 1)]
        p_cond = [
            at_least[k] / at_least[k - 1] if at_least[k - 1] > 0 else None
            for k in range(1, k_max + 1)
        ]
        return {
            "tau_per_request": tau_req,
            "tau_per_verify": tau_verify,
            "accept_hist": hist,
            "t1_accept": t1,
            "p_len_ge": p_len_ge,
            "p_cond": p_cond,
            "rounds": total,
            "num_requests": len(req_means),
            "num_candidates": k_max,
            "block_size": k_max + 1,   # the verified block: A and the K candidates
        }


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


def throughput(total_output_tokens: int | float, wall_s: float) -> float:
    """Tokens per second; NaN when ``wall_s <= 0``."""
    if wall_s <= 0:
        return float("nan")
    return float(total_output_tokens) / float(wall_s)


def _fmt_cell(value: Any, float_digits: int) -> str:
    if value is None:
        return "-"
    if isinstance(value, Tensor):
        value = value.tolist()
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.{float_digits}f}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_fmt_cell(v, min(float_digits, 2)) for v in value) + "]"
    return str(value)


def _is_numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def format_table(
    rows: list[dict[str, Any]],
    columns: list[str],
    float_digits: int = 3,
    title: str | None = None,
) -> str:
    """Aligned plain-text table. Numbers are right-aligned, other cells left-aligned;
    missing values and ``None`` print as ``-``."""
    header = [str(c) for c in columns]
    body = [[_fmt_cell(row.get(c), float_digits) for c in columns] for row in rows]
    numeric = [
        all(_is_numeric(row.get(c)) or row.get(c) is None for row in rows) and len(rows) > 0
        for c in columns
    ]
    widths = [
        max([len(header[j])] + [len(r[j]) for r in body]) for j in range(len(columns))
    ]

    def line(cells: list[str]) -> str:
        parts = [
            cell.rjust(widths[j]) if numeric[j] else cell.ljust(widths[j])
            for j, cell in enumerate(cells)
        ]
        return "  ".join(parts).rstrip()

    out = []
    if title:
        out.append(title)
    out.append(line(header))
    out.append("  ".join("-" * w for w in widths))
    out.extend(line(r) for r in body)
    return "\n".join(out)
