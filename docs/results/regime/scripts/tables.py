"""docs/results.md §11's tables of one target's regime study: per mode, tau per request [95% interval over seeds x
prompts] per workload and T1; then every row's all-workload tau in every mode side by side (paired changes:
docs/results/study/scripts/paired.py).

    python docs/results/regime/scripts/tables.py regime/assistant        (a directory holding seed*/ sweeps)
"""
import sys

from dmtp.reports.intervals import bootstrap_interval
from dmtp.reports.sweep import collect, protocol_samples

SHORT = {"ar": "AR", "mtp415": "MTP415", "mtp:7": "mtp:7", "raw_dflash": "raw DFlash", "raw_dflash+dflash2": "DFlash2",
         "raw_dflash+dspark": "DSpark", "dual_anchor_zero_init": "DMTP",
         "dual_anchor_zero_init+dspark": "DMTP + DSpark heads",
         "dual_anchor_zero_init+dspark+mtp_correction": "greedy production"}
ORDER = ["AR", "MTP415", "mtp:7", "raw DFlash", "DFlash2", "DSpark", "DSpark, sampled recipe", "DMTP",
         "DMTP + DSpark heads", "greedy production", "sampled production"]
WORKLOADS = ["code", "prose", "math", "code_tasks", "all"]


def short(method: str) -> str:
    if method in SHORT:
        return SHORT[method]
    if method.startswith("raw_dflash+dspark ["):
        return "DSpark, sampled recipe"
    if method.startswith("multi_mtp"):
        return "sampled production"
    return method


def cell(samples: dict) -> tuple[float, str]:
    tau = sum(s["tau"] for s in samples.values()) / len(samples)
    lo, hi = bootstrap_interval([s.get("tau_requests") or [] for s in samples.values()])
    return tau, f"{tau:.3f} [{lo:.2f}, {hi:.2f}]"


def ordered(methods):
    return sorted(methods, key=lambda m: ORDER.index(short(m)) if short(m) in ORDER else 99)


def label(method: str, seeds: int, most: int) -> str:
    return short(method) if seeds == most else f"{short(method)} ({seeds} seed{'s' if seeds > 1 else ''})"


def summary(per_mode: dict) -> None:
    modes = list(per_mode)
    print("\n**all workloads, every mode** (tau per request [95% interval over seeds x prompts])\n")
    print("| method | " + " | ".join(modes) + " |")
    print("|---|" + "---|" * len(modes))
    methods = ordered({m for per in per_mode.values() for m in per["all"]})
    for method in methods:
        cells = [cell(per["all"][method])[1] if method in per["all"] else "" for per in per_mode.values()]
        print(f"| {short(method)} | " + " | ".join(cells) + " |")


def main(root: str) -> None:
    per_mode = protocol_samples(collect(root))
    for mode, per in per_mode.items():
        seeds = max(len(v) for v in per["all"].values())
        print(f"\n**{mode}** (tau per request [95% interval over {seeds} seeds x 32 prompts]; T1 all workloads)\n")
        print("| method | " + " | ".join(WORKLOADS) + " | T1 |")
        print("|---|" + "---|" * (len(WORKLOADS) + 1))
        for method in ordered(per["all"]):
            taus = {wl: cell(per[wl][method]) for wl in WORKLOADS}
            best = {wl: max(cell(per[wl][m])[0] for m in per[wl]) for wl in WORKLOADS}
            cells = [f"**{taus[wl][1]}**" if taus[wl][0] == best[wl] else taus[wl][1] for wl in WORKLOADS]
            t1 = [s["t1_accept"] for s in per["all"][method].values() if s.get("t1_accept") is not None]
            t1_cell = f"{sum(t1) / len(t1):.3f}" if t1 else ""
            name = label(method, len(per["all"][method]), seeds)
            print(f"| {name} | " + " | ".join(cells) + f" | {t1_cell} |")
    summary(per_mode)


if __name__ == "__main__":
    main(sys.argv[1])
