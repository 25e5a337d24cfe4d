"""One verify length per batch from measured costs (`verify_length=auto`, issue 41).

The loop verifies [A, c1..cL] with one L for the whole batch, one captured program per L (its shape is
L + 1 rows). Which L pays depends on the engine: where a round costs about the same whatever its rows
(a GPU at batch 1), the whole block; where the verify's cost grows with its rows (a CPU, a large batch),
fewer candidates, down to L = 0 (drafting off: the target alone, the proposer's state kept up to date).
As vLLM's DSpark scheduler does, `VerifyLengthPolicy` picks the L that maximizes expected tokens per second:

* a cost table T(L), the seconds of one round at each L, measured once per batch shape (`length_costs.py`:
  the fastest of several interleaved runs),
  plus a per-round overhead c0 + c1 x tokens regressed online (what the table does not see: the host's
  polls, the context growing);
* the expected accepted candidates of a request at L, sum_{j <= L} min(s_j x c_j, 1): s_j an EMA of the
  proposer's predicted survival of candidate j (the product of its confidences: DSpark's head, the MTP's
  top-1 probability), c_j its calibration, realized / predicted survival over the candidates that were
  verified (clamped to 0.25..4; set when `calibration_min_observed` were first seen, an EMA after that).
  Until every candidate is calibrated (or `explore_rounds` passed) the whole block is verified: a signal
  that under-predicts (the MTP's top-1 probability does, here) would otherwise turn drafting off before
  the realized acceptance could correct it;
* hysteresis: the current L stays unless another is more than 5% better; L = 0 is probed (the best L >= 1
  for one readout) after `probe_every` readouts at 0, since rounds without drafts predict nothing.

The policy only reads what earlier rounds left (`LengthStats`, read at the loop's `done` polls): L is fixed
before a round drafts, so the round verifies a fixed shorter block, exact by the shorter block's rules in
every verification mode. Host-only, pure Python: tests/test_verify_length.py drives it with given tables.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

# Rows of the device-side accumulator (`LengthStats.tensor` [ROWS, K]), summed over active rows and rounds.
PREDICTED, HITS, OBSERVED, PREDICTED_OBSERVED, REQUESTS = range(5)
ROWS = 5


class LengthStats:
    """The rounds' device-side record for the policy, accumulated in the verify stage without a host sync:
    per candidate j, the predicted survival summed over the active requests of drafted rounds, and over
    the candidates verified: how many were verified, how many survived (accepted >= j), their predicted
    survival; row REQUESTS counts the active requests of drafted rounds. The loop reads and clears it."""

    def __init__(self, num_candidates: int, device):
        self.tensor = torch.zeros(ROWS, num_candidates, dtype=torch.float32, device=device)
        self._positions = torch.arange(1, num_candidates + 1, device=device)

    def accumulate(self, survival: torch.Tensor, kept: torch.Tensor, verified: torch.Tensor, accepted: torch.Tensor,
                   active: torch.Tensor) -> None:
        """survival [B, K] (predicted; float), kept [B] (candidates a confidence threshold keeps, K without
        one: survival past them counts 0), verified [B] (candidates verified this round: min(kept, L)),
        accepted [B] (before the EOS / budget cut), active [B] bool. In place, fixed shapes."""
        pos = self._positions[None]
        live = active[:, None].float()
        predicted = survival.float() * (pos <= kept[:, None]) * live
        observed = (pos <= verified[:, None]).float() * live
        t = self.tensor
        t[PREDICTED] += predicted.sum(0)
        t[HITS] += ((accepted[:, None] >= pos) * observed).sum(0)
        t[OBSERVED] += observed.sum(0)
        t[PREDICTED_OBSERVED] += (predicted * observed).sum(0)
        t[REQUESTS] += live.sum()

    def read(self) -> list[list[float]]:
        """The rows since the last read, cleared (a host read: the loop does it where it polls anyway)."""
        rows = self.tensor.tolist()
        self.tensor.zero_()
        return rows


class VerifyLengthPolicy:
    """The length choice (module docstring). `costs[L]`: seconds of one round at L = 0..K."""

    def __init__(self, costs: Sequence[float], *, hysteresis: float = 0.05, survival_decay: float = 0.9,
                 calibration_decay: float = 0.8, calibration_min_observed: float = 16.0,
                 ratio_range: tuple[float, float] = (0.25, 4.0), probe_every: int = 16, explore_rounds: int = 64,
                 overhead_window: int = 129, overhead_min_samples: int = 16, overhead_gate_s: float = 0.25):
        if len(costs) < 2 or not all(c > 0 for c in costs):
            raise ValueError(f"a cost table needs positive seconds for L = 0..K (K >= 1), got {list(costs)}")
        self.costs = [float(c) for c in costs]
        self.k = len(costs) - 1
        self.hysteresis, self.survival_decay = hysteresis, survival_decay
        self.calibration_decay, self.calibration_min_observed = calibration_decay, calibration_min_observed
        self.ratio_range, self.probe_every = ratio_range, probe_every
        self.overhead_window, self.overhead_min_samples, self.overhead_gate_s = (overhead_window, overhead_min_samples,
                                                                                  overhead_gate_s)
        self.survival: list[float] | None = None       # EMA of the predicted survival of candidate j
        self.calibration = [1.0] * self.k
        self.calibrated = [False] * self.k
        self.explore_rounds, self.rounds_seen = explore_rounds, 0
        self._seen = [[0.0] * self.k for _ in range(3)]    # hits, observed, predicted-observed: totals
        self._at_update = [[0.0] * self.k for _ in range(3)]
        self.overhead = (0.0, 0.0)                     # c0 (s per round), c1 (s per token)
        self._samples: list[tuple[float, float]] = []
        self.current: int | None = None
        self._zero_run = 0
        self.requests = 1.0                            # active requests per round at the last readout

    # -- what the rounds report ------------------------------------------------------------------------
    def observe(self, rows: Sequence[Sequence[float]], rounds: int, seconds: float, length: int) -> None:
        """One readout of `LengthStats` after `rounds` rounds at `length`, which took `seconds` of wall time."""
        if rounds < 1:
            return
        self.rounds_seen += rounds
        drafted = rows[REQUESTS][0]
        if drafted > 0:
            mean = [p / drafted for p in rows[PREDICTED]]
            if self.survival is None:
                self.survival = mean
            else:
                d = self.survival_decay ** rounds
                self.survival = [d * s + (1 - d) * m for s, m in zip(self.survival, mean)]
            self.requests = drafted / rounds
            self._calibrate(rows)
        if seconds > 0:
            tokens = self.requests * (1.0 + (sum(rows[HITS]) / max(drafted, 1.0) if length else 0.0))
            self._regress_overhead(tokens, seconds / rounds - self.costs[length])

    def _calibrate(self, rows) -> None:
        lo, hi = self.ratio_range
        for i, row in enumerate((HITS, OBSERVED, PREDICTED_OBSERVED)):
            self._seen[i] = [a + b for a, b in zip(self._seen[i], rows[row])]
        for j in range(self.k):
            hits, observed, predicted = (self._seen[i][j] - self._at_update[i][j] for i in range(3))
            if observed >= self.calibration_min_observed and predicted > 1e-3:
                ratio = min(max(hits / predicted, lo), hi)
                decay = self.calibration_decay if self.calibrated[j] else 0.0
                self.calibration[j] = decay * self.calibration[j] + (1 - decay) * ratio
                self.calibrated[j] = True
                for i in range(3):
                    self._at_update[i][j] = self._seen[i][j]

    def _regress_overhead(self, tokens: float, residual: float) -> None:
        """c0 + c1 x tokens over a window of (tokens, residual) samples, least squares; residuals outside
        [0, gate) (a stall, a table measured on a busier machine) are left out."""
        if not 0.0 <= residual < self.overhead_gate_s:
            return
        self._samples.append((tokens, residual))
        del self._samples[:-self.overhead_window]
        n = len(self._samples)
        if n < self.overhead_min_samples:
            return
        mx = sum(x for x, _ in self._samples) / n
        my = sum(y for _, y in self._samples) / n
        var = sum((x - mx) ** 2 for x, _ in self._samples)
        c1 = 0.0
        if var > 1e-9:
            c1 = max(0.0, sum((x - mx) * (y - my) for x, y in self._samples) / var)
        self.overhead = (max(0.0, my - c1 * mx), c1)

    # -- the choice --------------------------------------------------------------------------------------
    def expected_accepted(self) -> list[float]:
        """accept[L] for L = 0..K: expected accepted candidates of a request verified at L."""
        out, run = [0.0], 0.0
        for s, c in zip(self.survival or [1.0] * self.k, self.calibration):
            run += min(s * c, 1.0)
            out.append(run)
        return out

    def throughput(self) -> list[float]:
        """Expected tokens per second at each L (per request: the batch's count cancels but for c1)."""
        c0, c1 = self.overhead
        out = []
        for length, acc in enumerate(self.expected_accepted()):
            tokens = self.requests * (1.0 + acc)
            out.append(tokens / (self.costs[length] + c0 + c1 * tokens))
        return out

    def choose(self) -> int:
        """L for the next rounds: K until the signal is calibrated (module docstring); then the best expected
        tokens per second, with hysteresis; after `probe_every` choices of 0 in a row, the best L >= 1 once."""
        if self.survival is None or (not all(self.calibrated) and self.rounds_seen < self.explore_rounds):
            self.current = self.k
            return self.k
        tput = self.throughput()
        best = max(range(self.k + 1), key=lambda length: tput[length])
        if self.current is not None and tput[best] <= tput[self.current] * (1.0 + self.hysteresis):
            best = self.current
        if best == 0:
            self._zero_run += 1
            if self._zero_run > self.probe_every:
                self._zero_run = 0
                best = max(range(1, self.k + 1), key=lambda length: tput[length])
        else:
            self._zero_run = 0
        self.current = best
        return best


__all__ = ["LengthStats", "VerifyLengthPolicy"]
