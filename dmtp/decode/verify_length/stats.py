"""What the rounds record for `verify_length=auto` (dmtp/decode/verify_length/policy.py), on the device, in the verify
stage, with no host sync: the loop reads it at its `done` polls (`LengthStats.read` -> `Readout`)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

# Rows of the batch-wide accumulator (`LengthStats.tensor` [ROWS, K]), summed over active requests and rounds.
PREDICTED, HITS, OBSERVED, PREDICTED_OBSERVED, REQUESTS = range(5)
ROWS = 5
# Upper edges of the bins of predicted survival under which verified candidates are also counted (`binned`):
# realized survival per bin is the calibration where a ratio to the prediction is not (a request the signal
# calls hopeless is accepted far more often than that, relatively, than a confident one).
SURVIVAL_BINS = (0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.85)


@dataclass
class Readout:
    """One read: `rows` [ROWS][K] since the last read; per request, its predicted survival of candidates
    1..K (the mean over the rounds it drafted in; None where it has not drafted yet) and its remaining
    output budget (0 once it is done)."""
    rows: list[list[float]]
    request_survival: list[list[float] | None]
    remaining: list[int]
    binned: list[list[list[float]]] | None = None   # [2][K][bins]: hits, observed per bin of predicted survival
    request_rounds: list[int] | None = None          # per request, the rounds its survival is the mean of
    # per request and candidate j: how many rounds verified j, and in how many it survived (accepted >= j)
    request_observed: list[list[float]] | None = None
    request_hits: list[list[float]] | None = None


class LengthStats:
    """Per candidate j, the predicted survival summed over the active requests of drafted rounds, and over
    the candidates verified: how many were verified, how many survived (accepted >= j), their predicted
    survival; row REQUESTS counts the active requests of drafted rounds.

    Per request, the mean of its predicted survival over the rounds it drafted in, and its own verified / survived
    counts per candidate: a static batch ends with its slowest request, whose remaining rounds its long-run rate
    sets (a recent window's estimate, noisier, made the slowest request look slower than it was: an EMA of 0.8 per
    round turned drafting off where it paid, batch 8)."""

    def __init__(self, batch: int, num_candidates: int, device):
        self.tensor = torch.zeros(ROWS, num_candidates, dtype=torch.float32, device=device)
        self.request_sum = torch.zeros(batch, num_candidates, dtype=torch.float32, device=device)
        self.request_rounds = torch.zeros(batch, dtype=torch.float32, device=device)
        self.request_realized = torch.zeros(2, batch, num_candidates, dtype=torch.float32, device=device)
        self.binned = torch.zeros(2, num_candidates, len(SURVIVAL_BINS) + 1, dtype=torch.float32, device=device)
        self._edges = torch.tensor(SURVIVAL_BINS, dtype=torch.float32, device=device)
        self._positions = torch.arange(1, num_candidates + 1, device=device)

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        """What `accumulate` writes (the verify stage declares them)."""
        return self.tensor, self.request_sum, self.request_rounds, self.request_realized, self.binned

    def reset(self) -> None:
        for t in self.tensors:
            t.zero_()

    def accumulate(self, survival: torch.Tensor, kept: torch.Tensor, verified: torch.Tensor, accepted: torch.Tensor,
                   active: torch.Tensor) -> None:
        """survival [B, K] (predicted; float), kept [B] (candidates a confidence threshold keeps, K without
        one: survival past them counts 0), verified [B] (candidates verified this round: min(kept, L)),
        accepted [B] (before the EOS / budget cut), active [B] bool.

        In place, fixed shapes."""
        pos = self._positions[None]
        live = active[:, None].float()
        effective = survival.float() * (pos <= kept[:, None])
        predicted = effective * live
        observed = (pos <= verified[:, None]).float() * live
        t = self.tensor
        hits = (accepted[:, None] >= pos) * observed
        t[PREDICTED] += predicted.sum(0)
        t[HITS] += hits.sum(0)
        t[OBSERVED] += observed.sum(0)
        t[PREDICTED_OBSERVED] += (predicted * observed).sum(0)
        t[REQUESTS] += live.sum()
        self.request_sum.add_(predicted)
        self.request_rounds.add_(active.float())
        self.request_realized[0] += observed
        self.request_realized[1] += hits
        bins = torch.nn.functional.one_hot(torch.bucketize(effective.contiguous(), self._edges),
                                           self.binned.shape[-1]).float()              # [B, K, bins]
        self.binned[0] += (bins * hits[..., None]).sum(0)
        self.binned[1] += (bins * observed[..., None]).sum(0)

    def read(self, remaining: torch.Tensor) -> Readout:
        """The record since the last read, its batch-wide rows cleared; `remaining` [B]: each request's output
        budget left, 0 once done (a host read: the loop does it where it polls anyway)."""
        rows, binned = self.tensor.tolist(), self.binned.tolist()
        self.tensor.zero_()
        self.binned.zero_()
        mean = self.request_sum / self.request_rounds.clamp(min=1)[:, None]
        per = torch.cat([mean, self.request_rounds[:, None], remaining[:, None].float()], dim=1).tolist()
        observed, hits = self.request_realized.tolist()
        return Readout(rows, [r[:-2] if r[-2] else None for r in per], [int(r[-1]) for r in per], binned,
                       [int(r[-2]) for r in per], observed, hits)


__all__ = ["HITS", "OBSERVED", "PREDICTED", "PREDICTED_OBSERVED", "REQUESTS", "ROWS", "SURVIVAL_BINS", "LengthStats",
           "Readout"]
