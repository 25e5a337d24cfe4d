"""95% bootstrap intervals for acceptance lengths, over prompts and, where there are several, over seeds.

The unit is a request (a prompt): its tau is the mean acceptance length of its rounds, and a method's tau on a
workload is the mean over its requests (`tau_per_request`, SPEC §6). With several seeds (independently trained
drafters, or decoding seeds), the interval is a two-level bootstrap: seeds drawn with replacement, then each
drawn seed's requests with replacement; the statistic is the mean over the drawn seeds of their request means.
With one seed it is the plain bootstrap over requests. Percentile intervals, a fixed generator: the same inputs
always give the same interval.

"A beats B" is claimed only when the two intervals do not overlap (`separated`); otherwise the tables say
"within noise". The paired ratio (`paired_ratio`) compares two methods on the same prompts (the same requests in
the same order) and is printed beside, as the tighter summary of how far apart they are.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

LEVEL = 0.95
RESAMPLES = 2000


def _present(values) -> np.ndarray:
    return np.asarray([v for v in values if v is not None], dtype=float)


def _groups(values) -> list[np.ndarray]:
    """A flat list of request values (one seed) or a list of per-seed lists -> per-seed arrays (requests without a
    value, None, and then empty seeds dropped)."""
    values = list(values)
    if values and not isinstance(values[0], (list, tuple, np.ndarray)):
        values = [values]
    return [g for g in (_present(v) for v in values) if len(g)]


def bootstrap_interval(values, level: float = LEVEL, resamples: int = RESAMPLES, seed: int = 0
                       ) -> tuple[float, float] | None:
    """values: request taus [..] (one seed) or [[..], [..], ...] (per seed) -> (low, high) percentile interval
    of the mean, or None without data.

    A single request has a zero-width interval."""
    groups = _groups(values)
    if not groups:
        return None
    rng = np.random.default_rng(seed)
    # Each seed's request means under `resamples` draws of its requests: [seeds, resamples]; then the seeds drawn.
    per_seed = np.stack([g[rng.integers(0, len(g), (resamples, len(g)))].mean(1) for g in groups])
    n_seeds = len(groups)
    picked = rng.integers(0, n_seeds, (resamples, n_seeds)) if n_seeds > 1 else np.zeros((resamples, 1), dtype=int)
    stats = per_seed[picked, np.arange(resamples)[:, None]].mean(1)
    tail = (1 - level) / 2
    low, high = np.quantile(stats, [tail, 1 - tail])
    return float(low), float(high)


def paired_ratio(a: Sequence, b: Sequence, level: float = LEVEL, resamples: int = RESAMPLES,
                 seed: int = 0) -> tuple[float, float, float] | None:
    """mean(a) / mean(b) - 1 over the same requests (paired: a request without a value in either list, None, is
    left out of both), with its bootstrap interval: (change, low, high); None when the lists differ in length or
    share no request.

    a and b: request taus of one seed each, or per-seed lists of them ([[..], [..]], the same seeds in the same
    order: drafters trained with seed s decoded on the same prompts). With several seeds the bootstrap draws seeds,
    then each drawn seed's request pairs (the two levels of `bootstrap_interval`), and the change is the ratio of
    the means over seeds of the request means."""
    a_groups, b_groups = list(a), list(b)
    if a_groups and not isinstance(a_groups[0], (list, tuple, np.ndarray)):
        a_groups, b_groups = [a_groups], [b_groups]
    if len(a_groups) != len(b_groups) or any(len(x) != len(y) for x, y in zip(a_groups, b_groups)):
        return None
    pairs = []
    for x, y in zip(a_groups, b_groups):
        kept = [(u, v) for u, v in zip(x, y) if u is not None and v is not None]
        if kept:
            pairs.append(np.asarray(kept, dtype=float))
    if not pairs or np.mean([p[:, 1].mean() for p in pairs]) == 0:
        return None
    rng = np.random.default_rng(seed)
    means = np.stack([p[rng.integers(0, len(p), (resamples, len(p)))].mean(1) for p in pairs])   # [seeds, R, 2]
    n_seeds = len(pairs)
    picked = rng.integers(0, n_seeds, (resamples, n_seeds)) if n_seeds > 1 else np.zeros((resamples, 1), dtype=int)
    drawn = means[picked, np.arange(resamples)[:, None]].mean(1)                                     # [R, 2]
    ratios = drawn[:, 0] / drawn[:, 1] - 1
    tail = (1 - level) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    point = np.mean([p[:, 0].mean() for p in pairs]) / np.mean([p[:, 1].mean() for p in pairs]) - 1
    return float(point), float(low), float(high)


def separated(x: tuple[float, float] | None, y: tuple[float, float] | None) -> bool:
    """Whether two intervals do not overlap (the rule for saying one method beats another)."""
    return x is not None and y is not None and (x[0] > y[1] or y[0] > x[1])


def format_interval(ci: tuple[float, float] | None, digits: int = 3) -> str:
    return "" if ci is None else f"[{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"


__all__ = ["LEVEL", "RESAMPLES", "bootstrap_interval", "format_interval", "paired_ratio", "separated"]
