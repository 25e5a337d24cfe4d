"""One verify length per batch from measured costs (`verify_length=auto`).

The loop verifies [A, c1..cL] with one L for the whole batch, one captured program per L (its shape is
L + 1 rows). Which L pays depends on the engine: where a round costs about the same whatever its rows
(a GPU at batch 1), the whole block; where the verify's cost grows with its rows (a CPU, a large batch),
fewer candidates, down to L = 0 (drafting off: the target alone, the proposer's state kept up to date).
As vLLM's DSpark scheduler does, `VerifyLengthPolicy` picks the L that maximizes expected tokens per second,
here of the batch until it ends: dmtp decodes static batches, where a finished request's row is computed
until the last one ends, so the batch's rate is its remaining tokens over the rounds its slowest request
still needs at L, max_i R_i / (1 + a_i(L)), times the round's cost (with refilled batches, vLLM's, it is the
active requests' tokens per round over the round's cost; one request: the two are the same). From:

* a cost table T(L), the seconds of one round at each L, measured once per batch shape (`length_costs.py`:
  the fastest of several interleaved runs; CPU time on a CPU, wall time on CUDA), plus a per-round overhead
  c0 + c1 x tokens regressed online on the same clock (what the table does not see: the host's polls, the
  context growing);
* the expected accepted candidates a_i(L) of request i at L, sum_{j <= L} min(s_ij x c_j, 1): s_ij the mean
  of the proposer's predicted survival of its candidate j over its n_i drafted rounds (the product of its
  confidences: DSpark's head, the MTP's top-1 probability), shrunk toward the batch's EMA s_j as if that
  were `prior_rounds` more rounds (one round's confidence is noisy, and a request turned to L = 0 on its
  first round drafts nothing more to correct it), then blended with its own realized survival of j as
  (hits + m p) / (verified + m), m = `request_prior` rounds of the prediction p (the slowest request, which
  sets a static batch's end, is told apart by what it accepted far better than by what was predicted for it:
  the DMTP + DSpark batch of 24 ran at 1.5 tokens per round for its slowest request against a predicted 2.8
  and more; the prior keeps a few unlucky rounds from turning a request's drafting off); R_i its remaining
  budget; c_j the calibration, realized / predicted survival over the candidates that were verified (clamped
  to 0.25..4; set when `calibration_min_observed` were first seen, an EMA after that);
  where `bin_min_observed` candidates j were verified with a predicted survival in the bin of s_ij
  (`SURVIVAL_BINS`), their realized survival instead: the signal is not proportional to acceptance (the
  MTP's top-1 probability of a prose request, 0.02-0.05, was accepted 3x the global ratio and more).
  Until every candidate is calibrated (or `explore_rounds` passed) the whole block is verified: a signal
  that under-predicts (the MTP's top-1 probability does, here) would otherwise turn drafting off before
  the realized acceptance could correct it;
* hysteresis: the current L stays unless another is more than 5% better; after `probe_every` readouts in a
  row below K, one readout verifies the whole block: rounds without drafts predict nothing, and candidates
  past L are never verified, so their calibration would keep what the first rounds' prompts set it to.

The policy only reads what earlier rounds left (`LengthStats`, read at the loop's `done` polls): L is fixed
before a round drafts, so the round verifies a fixed shorter block, exact by the shorter block's rules in
every verification mode. Host-only, pure Python: tests/test_verify_length.py drives it with given tables.
"""
from __future__ import annotations

from collections.abc import Sequence

import bisect

from dmtp.decode.verify_length.stats import (HITS, OBSERVED, PREDICTED, PREDICTED_OBSERVED, REQUESTS, SURVIVAL_BINS,
                                      Readout)


class VerifyLengthPolicy:
    """The length choice (module docstring). `costs[L]`: seconds of one round at L = 0..K."""

    def __init__(self, costs: Sequence[float], *, hysteresis: float = 0.05, survival_decay: float = 0.9,
                 calibration_decay: float = 0.8, calibration_min_observed: float = 16.0,
                 ratio_range: tuple[float, float] = (0.25, 4.0), probe_every: int = 8, explore_rounds: int = 64,
                 bin_min_observed: float = 8.0, prior_rounds: float = 4.0, request_prior: float = 8.0,
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
        self.bin_min_observed, self.prior_rounds = bin_min_observed, prior_rounds
        self.request_rounds: list[int] = []
        self.request_prior = request_prior
        self.request_observed: list[list[float]] = []
        self.request_hits: list[list[float]] = []
        bins = len(SURVIVAL_BINS) + 1
        self.binned = [[[0.0] * bins for _ in range(self.k)] for _ in range(2)]   # hits, observed: totals
        self._seen = [[0.0] * self.k for _ in range(3)]    # hits, observed, predicted-observed: totals
        self._at_update = [[0.0] * self.k for _ in range(3)]
        self.overhead = (0.0, 0.0)                     # c0 (s per round), c1 (s per token)
        self._samples: list[tuple[float, float]] = []
        self.current: int | None = None
        self._short_run = 0
        self.requests = 1.0                            # active requests per round at the last readout
        self.request_survival: list[list[float] | None] = []   # per request, at the last readout
        self.remaining: list[int] = []

    # -- what the rounds report ------------------------------------------------------------------------
    def observe(self, readout: Readout, rounds: int, seconds: float, length: int) -> None:
        """One readout of `LengthStats` after `rounds` rounds at `length`, which took `seconds` of wall time."""
        if rounds < 1:
            return
        rows = readout.rows
        self.request_survival, self.remaining = readout.request_survival, readout.remaining
        n = len(self.remaining)
        self.request_rounds = readout.request_rounds or [0] * n
        self.request_observed = readout.request_observed or [[0.0] * self.k for _ in range(n)]
        self.request_hits = readout.request_hits or [[0.0] * self.k for _ in range(n)]
        if readout.binned is not None:
            for total, new in zip(self.binned, readout.binned):
                for per_j, add in zip(total, new):
                    per_j[:] = [a + b for a, b in zip(per_j, add)]
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
    def expected_accepted(self, survival: Sequence[float] | None = None, realized=None) -> list[float]:
        """accept[L] for L = 0..K: expected accepted candidates of a request verified at L (`survival`: its
        own predicted survival, default the batch's EMA; `realized`: (observed, hits) per candidate, its own
        counts, blended with the prediction as `request_prior` rounds of it)."""
        out, run = [0.0], 0.0
        for j, (s, c) in enumerate(zip(survival or self.survival or [1.0] * self.k, self.calibration)):
            b = bisect.bisect_left(SURVIVAL_BINS, s)
            hits, observed = self.binned[0][j][b], self.binned[1][j][b]
            p = hits / observed if observed >= self.bin_min_observed else min(s * c, 1.0)
            if realized is not None:
                m = self.request_prior
                p = (realized[1][j] + m * p) / (realized[0][j] + m)
            run += p
            out.append(run)
        return out

    def throughput(self) -> list[float]:
        """Expected tokens per second of the batch at each L until it ends (module docstring); before any
        readout of requests, one request's rate."""
        c0, c1 = self.overhead
        live = [(r, self._shrunk(s, n), realized) for r, s, n, realized in
                zip(self.remaining, self.request_survival, self.request_rounds,
                    zip(self.request_observed, self.request_hits)) if r > 0]
        if not live:
            out = []
            for length, acc in enumerate(self.expected_accepted()):
                tokens = self.requests * (1.0 + acc)
                out.append(tokens / (self.costs[length] + c0 + c1 * tokens))
            return out
        accepts = [self.expected_accepted(s, realized) for _, s, realized in live]
        total = sum(r for r, _, _ in live)
        out = []
        for length in range(self.k + 1):
            rates = [1.0 + acc[length] for acc in accepts]
            rounds = max(r / rate for (r, _, _), rate in zip(live, rates))
            out.append(total / (rounds * (self.costs[length] + c0 + c1 * sum(rates))))
        return out

    def _shrunk(self, survival: list[float] | None, rounds: int) -> list[float] | None:
        """A request's mean survival over `rounds` rounds, pulled toward the batch's EMA (`prior_rounds`)."""
        if survival is None or self.survival is None:
            return survival or self.survival
        w = rounds / (rounds + self.prior_rounds)
        return [w * s + (1 - w) * b for s, b in zip(survival, self.survival)]

    def choose(self) -> int:
        """L for the next rounds: K until the signal is calibrated (module docstring); then the best expected
        tokens per second, with hysteresis; after `probe_every` choices below K in a row, K once."""
        if self.survival is None or (not all(self.calibrated) and self.rounds_seen < self.explore_rounds):
            self.current = self.k
            return self.k
        tput = self.throughput()
        best = max(range(self.k + 1), key=lambda length: tput[length])
        if self.current is not None and tput[best] <= tput[self.current] * (1.0 + self.hysteresis):
            best = self.current
        if best < self.k:
            self._short_run += 1
            if self._short_run > self.probe_every:
                self._short_run, best = 0, self.k
        else:
            self._short_run = 0
        self.current = best
        return best


__all__ = ["LengthStats", "VerifyLengthPolicy"]
