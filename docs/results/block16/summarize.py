"""Tables of docs/results.md section 7 from the `dmtp.infer` reports beside this file (<name>.metrics.json).

    python docs/results/block16/summarize.py > docs/results/block16/tables.md
"""
import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
RUNS = [   # report name, label
    ("raw_b8", "raw DFlash, trained 8, verified 8"),
    ("dmtp_b8", "DMTP zero-init, trained 8, verified 8 (default)"),
    ("raw_b16", "raw DFlash, trained 16, verified 16"),
    ("dmtp_b16", "DMTP zero-init, trained 16, verified 16"),
    ("raw_b16_v8", "raw DFlash, trained 16, verified 8"),
    ("dmtp_b16_v8", "DMTP zero-init, trained 16, verified 8"),
]
DOMAINS = ["code", "math", "prose"]


def drafter_row(metrics):
    method = metrics["run"]["injection"]
    return {d: metrics["workloads"][d][method] for d in DOMAINS} | {"all": metrics["overall"][method]}


def main():
    found = [(n, lab, json.loads((HERE / f"{n}.metrics.json").read_text()))
             for n, lab in RUNS if (HERE / f"{n}.metrics.json").exists()]
    if not found:
        sys.exit("summarize: no <name>.metrics.json beside this script")
    first = found[0][2]
    mtp = {d: first["workloads"][d]["mtp415"] for d in DOMAINS} | {"all": first["overall"]["mtp415"]}
    print("| drafter | tau code | tau math | tau prose (held out) | tau all | T1 accept | prose vs MTP415 |")
    print("|---|---|---|---|---|---|---|")
    print("| MTP415 chain (reference) | " + " | ".join(f"{mtp[d]['tau_per_request']:.3f}" for d in DOMAINS + ["all"])
          + f" | {mtp['all']['t1_accept']:.3f} | |")
    rows = {}
    for name, label, m in found:
        r = rows[name] = drafter_row(m)
        gap = r["prose"]["tau_per_request"] / mtp["prose"]["tau_per_request"] - 1
        print(f"| {label} | " + " | ".join(f"{r[d]['tau_per_request']:.3f}" for d in DOMAINS + ["all"])
              + f" | {r['all']['t1_accept']:.3f} | {gap:+.1%} |")
    print()
    print("P(L>=k), all domains (k = 1..15; - = beyond the verified block)")
    print()
    print("| drafter | " + " | ".join(f"k={k}" for k in range(1, 16)) + " |")
    print("|---|" + "---|" * 15)
    for name, label, _ in found:
        p = rows[name]["all"]["p_len_ge"]
        print(f"| {label} | " + " | ".join(f"{p[k]:.3f}" if k < len(p) else "-" for k in range(15)) + " |")
    p = mtp["all"]["p_len_ge"]
    print("| MTP415 chain | " + " | ".join(f"{p[k]:.3f}" if k < len(p) else "-" for k in range(15)) + " |")
    for d in DOMAINS:
        print(f"\nP(L>=k), {d}\n")
        print("| drafter | " + " | ".join(f"k={k}" for k in range(1, 16)) + " |")
        print("|---|" + "---|" * 15)
        for name, label, _ in found:
            p = rows[name][d]["p_len_ge"]
            print(f"| {label} | " + " | ".join(f"{p[k]:.3f}" if k < len(p) else "-" for k in range(15)) + " |")


if __name__ == "__main__":
    main()
