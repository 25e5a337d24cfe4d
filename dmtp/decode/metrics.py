"""Decoding statistics (SPEC §6): acceptance and throughput (per-stage timing: dmtp.decode.execution.stage_timer;
tables: dmtp.reports.tables).

Acceptance length of a round = 1 + accepted candidates (the correction/bonus token is
included). ``hist[k]`` counts rounds that accepted exactly ``k`` of the ``K`` candidates.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["AcceptanceRecorder", "nothing_verified", "throughput"]


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
        """Append ``other``'s requests (as new requests, after this recorder's).

        Returns self."""
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
        """SPEC §6 metrics.

        Ratios with an empty denominator are ``None``."""
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


def nothing_verified(method: str, summary: dict) -> str | None:
    """One line when confidence-scheduled verification verified no candidate of `method` in any round
    (`summary`: a decoding summary, its `verified_per_round` and `sampling`): its tau is then 1 and its T1
    acceptance 0 by construction, not measured.

    None otherwise."""
    threshold = (summary.get("sampling") or {}).get("confidence_threshold") or 0
    if threshold <= 0 or not summary.get("rounds") or summary.get("verified_per_round") != 0:
        return None
    return (f"[dmtp] confidence_threshold={threshold} verified no candidate of {method} in any of its "
            f"{summary['rounds']} rounds (its predicted survival never reached {threshold}): its tau 1 and T1 0 are "
            "the threshold's, not the drafter's; lower it (0 = off) or train the confidence head")


def throughput(total_output_tokens: int | float, wall_s: float) -> float:
    """Tokens per second; NaN when ``wall_s <= 0``."""
    if wall_s <= 0:
        return float("nan")
    return float(total_output_tokens) / float(wall_s)
