import sys, numpy as np
from dmtp.reports.sweep import collect, protocol_samples
rows = collect(sys.argv[1]); S = protocol_samples(rows)
def paired(mode, wl, a, b, R=2000):
    pa, pb = S[mode][wl][a], S[mode][wl][b]
    seeds = sorted(set(pa) & set(pb))
    A = [np.array([x if x is not None else np.nan for x in pa[s]["tau_requests"]]) for s in seeds]
    B = [np.array([x if x is not None else np.nan for x in pb[s]["tau_requests"]]) for s in seeds]
    rng = np.random.default_rng(0); stats = []
    for _ in range(R):
        ss = rng.integers(0, len(seeds), len(seeds)); na = nb = 0.0
        for s in ss:
            ok = ~(np.isnan(A[s]) | np.isnan(B[s])); a_, b_ = A[s][ok], B[s][ok]
            idx = rng.integers(0, len(a_), len(a_)); na += a_[idx].mean(); nb += b_[idx].mean()
        stats.append(na / nb - 1)
    m = np.nanmean([np.nanmean(x) for x in A]) / np.nanmean([np.nanmean(x) for x in B]) - 1
    lo, hi = np.quantile(stats, [0.025, 0.975]); return m, lo, hi
pairs = [(a, b) for a, b in zip(sys.argv[2::2], sys.argv[3::2])]
for mode in S:
    for a, b in pairs:
        if a not in S[mode]["code"] or b not in S[mode]["code"]: continue
        print(mode, a[:40], "vs", b[:30], " ".join(f"{wl}: {100*m:+.1f}% [{100*lo:+.1f}, {100*hi:+.1f}]" for wl in ["code","prose","math","code_tasks","all"] for m, lo, hi in [paired(mode, wl, a, b)]))
