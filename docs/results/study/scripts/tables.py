import sys
from dmtp.reports.sweep import collect, protocol_samples
from dmtp.reports.intervals import bootstrap_interval, separated
rows = collect(sys.argv[1])
S = protocol_samples(rows)
SHORT = {"ar": "AR", "mtp415": "MTP415", "mtp:7": "MTP chain x7 (mtp:7)", "raw_dflash": "raw DFlash",
         "raw_dflash+dspark": "DSpark", "dual_anchor_zero_init": "DMTP",
         "dual_anchor_zero_init+dspark": "DMTP + DSpark heads",
         "dual_anchor_zero_init+dspark+mtp_correction": "**greedy production**: DMTP + DSpark heads + MTP correction"}
def short(m):
    if m in SHORT: return SHORT[m]
    if m.startswith("raw_dflash+dspark ["): return "DSpark, sampled recipe"
    if m.startswith("multi_mtp"): return "**sampled production** (experiment=sampled)"
    return m
order = ["ar", "mtp415", "mtp:7", "raw_dflash", "raw_dflash+dspark", "DSpark, sampled recipe", "dual_anchor_zero_init",
         "dual_anchor_zero_init+dspark", "dual_anchor_zero_init+dspark+mtp_correction", "sampled"]
def key(m):
    s = short(m)
    for i, o in enumerate(order):
        if m == o or s == o or (o == "sampled" and m.startswith("multi")):
            return i
    return 99
wls = ["code", "prose", "math", "code_tasks", "all"]
for mode, per in S.items():
    print(f"\n**{mode}** (tau per request [95% interval over 3 seeds x 32 prompts]; T1 = first-candidate acceptance)\n")
    print("| method | " + " | ".join(wls) + " | T1 (all) |")
    print("|---|" + "---|" * (len(wls) + 1))
    methods = sorted(per["code"], key=key)
    for m in methods:
        cells = []
        for wl in wls:
            ps = per[wl][m]
            groups = [s.get("tau_requests") or [] for s in ps.values()]
            ci = bootstrap_interval(groups)
            tau = sum(s["tau"] for s in ps.values()) / len(ps)
            cells.append(f"{tau:.3f} [{ci[0]:.2f}, {ci[1]:.2f}]")
        t1 = per["all"][m]
        t1v = [s["t1_accept"] for s in t1.values() if s.get("t1_accept") is not None]
        print(f"| {short(m)} | " + " | ".join(cells) + f" | {'' if not t1v else f'{sum(t1v)/len(t1v):.3f}'} |")
