"""Tables of tau [95% interval over prompts] per workload and method for every decoded mode under a directory."""
import json, sys
from pathlib import Path
from dmtp.reports.decode_report import request_taus
import random

def ci(xs, n=2000, seed=0):
    rng = random.Random(seed); m = len(xs)
    boots = sorted(sum(rng.choice(xs) for _ in range(m)) / m for _ in range(n))
    return boots[int(0.025 * n)], boots[int(0.975 * n)]

root = Path(sys.argv[1])
for d in sorted(p for p in root.iterdir() if (p / "metrics.json").exists()):
    m = json.loads((d / "metrics.json").read_text())
    methods = [k for k in next(iter(m["workloads"].values())) if k != "ar"]
    print(f"\n### {d.name}\n")
    print("| workload | " + " | ".join(methods) + " | T1 " + " | T1 ".join(methods) + " |")
    print("|---" * (1 + 2 * len(methods)) + "|")
    for wl in list(m["workloads"]) + ["overall"]:
        row = m["overall"] if wl == "overall" else m["workloads"][wl]
        cells = []
        for meth in methods:
            s = row[meth]
            taus = request_taus(s) if wl != "overall" else None
            if taus:
                lo, hi = ci(taus)
                cells.append(f"{s['tau_per_request']:.3f} [{lo:.2f}, {hi:.2f}]")
            else:
                cells.append(f"{s['tau_per_request']:.3f}")
        t1 = [f"{row[meth]['t1_accept']:.3f}" for meth in methods]
        print(f"| {wl} | " + " | ".join(cells) + " | " + " | ".join(t1) + " |")
