"""Bootstrap intervals (dmtp.reports.intervals) and the protocol's tables in the sweep report: intervals over
prompts and seeds, "beats" only where they separate, baselines counted once per seed."""
import json

import numpy as np
import pytest

from dmtp.reports.intervals import bootstrap_interval, paired_ratio, separated
from dmtp.reports.sweep import collect, protocol_tables


def test_interval_covers_the_mean_and_narrows_with_more_prompts():
    rng = np.random.default_rng(0)
    few, many = rng.normal(3.0, 0.5, 8).tolist(), rng.normal(3.0, 0.5, 128).tolist()
    lo, hi = bootstrap_interval(few)
    assert lo < np.mean(few) < hi
    lo2, hi2 = bootstrap_interval(many)
    assert hi2 - lo2 < (hi - lo) / 2                 # ~1/sqrt(n)
    assert bootstrap_interval(few) == bootstrap_interval(few)   # a fixed generator: reproducible
    assert bootstrap_interval([]) is None and bootstrap_interval([2.0]) == (2.0, 2.0)


def test_seeds_widen_the_interval_when_they_disagree():
    same = [[3.0, 3.1, 2.9, 3.0] * 8] * 3
    apart = [[2.0, 2.1, 1.9, 2.0] * 8, [3.0, 3.1, 2.9, 3.0] * 8, [4.0, 4.1, 3.9, 4.0] * 8]
    w_same = np.diff(bootstrap_interval(same))[0]
    w_apart = np.diff(bootstrap_interval(apart))[0]
    assert w_apart > 5 * w_same                      # seed-to-seed spread counts, not just prompts


def test_paired_ratio_and_separation():
    a = [2.2, 3.3, 4.4, 5.5]
    b = [2.0, 3.0, 4.0, 5.0]
    change, lo, hi = paired_ratio(a, b)
    assert change == pytest.approx(0.1) and lo <= 0.1 <= hi
    assert paired_ratio(a, b[:3]) is None
    assert separated((3.0, 3.2), (2.0, 2.9)) and not separated((3.0, 3.2), (3.1, 3.5))


def test_paired_ratio_over_seeds_counts_the_seed_spread():
    """Per-seed lists: the change is the ratio of the seed means, and seeds that disagree widen the interval."""
    b = [[2.0, 3.0, 4.0, 5.0] * 4] * 3
    agree = [[x * 1.1 for x in b[0]]] * 3
    disagree = [[x * f for x in b[0]] for f in (0.9, 1.1, 1.3)]
    change, lo, hi = paired_ratio(agree, b)
    assert change == pytest.approx(0.1) and hi - lo < 1e-9
    change, lo, hi = paired_ratio(disagree, b)
    assert change == pytest.approx(0.1) and lo < 0.0 < 0.2 < hi    # one seed below B, one far above: not apart
    assert paired_ratio(agree, b[:2]) is None and paired_ratio([b[0][:3]] * 3, b) is None


def _job(path, method, seed, tau_drafter, tau_mtp):
    path.mkdir(parents=True)
    stats = lambda taus: {"tau": float(np.mean(taus)), "tau_requests": taus, "t1_accept": 0.7,  # noqa: E731
                          "p_len_ge": [0.7, 0.5, 0.3, 0.2], "speedup_vs_ar": 1.5}
    record = {"method": method, "seed": seed,
              "eval": {"modes": {"greedy": {"code": {"ar": stats([1.0] * 32), "mtp415": stats(tau_mtp),
                                                     "drafter": stats(tau_drafter)}}}}}
    (path / "metrics.json").write_text(json.dumps(record))


def test_protocol_tables_count_each_seeds_baselines_once_and_say_within_noise(tmp_path):
    rng = np.random.default_rng(1)
    mtp = {s: rng.normal(2.5, 0.3, 32).tolist() for s in range(2)}
    for s in range(2):
        _job(tmp_path / f"a{s}", "dual_anchor_zero_init+dspark", s, rng.normal(3.5, 0.3, 32).tolist(), mtp[s])
        _job(tmp_path / f"b{s}", "raw_dflash+dspark", s, rng.normal(3.48, 0.3, 32).tolist(), mtp[s])
    rows = collect(tmp_path)
    assert all("_eval" in r for r in rows) and not any(k.startswith("eval/") for r in rows for k in r)
    table = protocol_tables(rows)
    assert "| mtp415 | 2 |" in table and "| ar | 2 |" in table             # two seeds, not four jobs
    assert "- dual_anchor_zero_init+dspark beats mtp415" in table
    assert "- dual_anchor_zero_init+dspark within noise of raw_dflash+dspark" in table
    assert protocol_tables(collect(tmp_path / "a0")) and protocol_tables([]) == ""


def test_requests_without_rounds_are_left_out_pairwise():
    a = [2.0, None, 3.0, 4.0]
    b = [1.0, 2.0, None, 2.0]
    change, _, _ = paired_ratio(a, b)
    assert change == pytest.approx((2.0 + 4.0) / (1.0 + 2.0) - 1)       # only the prompts both decoded
    assert bootstrap_interval([None, 2.0]) == (2.0, 2.0)
