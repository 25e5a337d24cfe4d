# Tables of docs/results.md §3/§4 from the bench reports: acceptance from run 1 (greedy: identical in
# every run), round cost = the fastest of the runs per (workload, method), with its stage split.
import glob, json, statistics, sys
runs = [json.load(open(p)) for p in sorted(glob.glob("outputs/issue16/bench*.json"))]
label = {"ar": "target AR", "mtp415": "MTP415", "dual_anchor_zero_init": "DMTP (m = 1)",
         "dual_anchor_zero_init+tuned_mtp": "DMTP, joint MTP"}
def name(m):
    if m.startswith("multi_mtp_zero_init["):
        k, v = m[len("multi_mtp_zero_init["):-1].split("=")
        return f"multi, m = {v} fixed" if k == "num_mtp_tokens" else f"multi, adaptive {v}"
    return label.get(m, m)
wanted = [m for m in runs[0]["methods"] if m not in sys.argv[1:]]
scopes = [("all", lambda r: r["methods"])] + [(wl, lambda r, wl=wl: r["workloads"][wl]) for wl in runs[0]["workloads"]]
for scope, get in scopes:
    print(f"\n**{scope}**\n\n| method | tau | T1 | P(L>=k), k = 1..7 | ms/round (min of {len(runs)}) | median | MTP | T1/fusion | drafter | verify |\n|---|---|---|---|---|---|---|---|---|---|")
    for m in wanted:
        s = get(runs[0])[m]
        stages = [get(r)[m]["stage_ms_per_round"] for r in runs]
        best = min(stages, key=lambda x: x["round"])
        p = " ".join(f"{x:.2f}" for x in s["p_len_ge"])
        f = lambda k: f"{best[k]:.1f}" if k in best else "-"
        t1 = f"{s['t1_accept']:.3f}" if s["t1_accept"] is not None else "-"
        print(f"| {name(m)} | {s['tau_per_request']:.3f} | {t1} | {p} | {best['round']:.1f} | "
              f"{statistics.median(x['round'] for x in stages):.1f} | {f('mtp')} | {f('t1_fusion')} | {f('drafter')} | {f('verify')} |")
