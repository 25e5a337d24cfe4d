"""docs/results.md §12's tables: the seed's experiment in the seed's regime (drafters trained on code, prose and math;
held-out prompt sets), from a study directory filled by the commands of docs/results/12-seed-regime.md:

    <root>/regime/seed<N>/     python -m dmtp.train -m +sweep=regime_study seed=N ...   (§11's rows + DMTP(D2))
    <root>/ablation/seed<N>/   python -m dmtp.train -m +sweep=seed_ablation seed=N ...  (the seed's other variants)
    <root>/continued/seed<N>/  python -m dmtp.train -m +sweep=continuation seed=N init_from=<raw DFlash> ...
    <root>/scratch/seed<N>/    the same M steps from scratch

    python docs/results/seed/scripts/tables.py <root> > docs/results/seed/tables.md
    python docs/results/seed/scripts/tables.py <root> --summary     (the headline tables of §12's page)

Every tau is per request with its 95% interval over seeds x prompts; every change is paired (the same prompts, the
drafters of the same seed) with its two-level bootstrap interval (dmtp.reports.intervals.paired_ratio)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from dmtp.reports.intervals import bootstrap_interval, paired_ratio
from dmtp.reports.sweep import collect, protocol_recipes, protocol_samples
from dmtp.speed import projected_speedup

PROFILE = "qwen3-8b.h200.bf16"   # the shipped 8B profile (dmtp/speed/profiles/: measured and derived stages)

# The seed's code column (its §1 table and supplementary rows; SPEC §7), and the label of each variant here.
SEED_CODE = {"raw_dflash": 3.360, "token_only": 3.770, "hidden_residual_t1": 3.864, "six_mask_residual": 3.842,
             "context_fusion": 3.714, "mtp_context_only": 3.565, "fusion_t1": 3.963, "dual_anchor_fusion": 3.951}
VARIANTS = ["raw_dflash", "token_only", "hidden_residual_t1", "six_mask_residual", "context_fusion",
            "mtp_context_only", "fusion_t1", "zero_init_t1", "dual_anchor_fusion", "dual_anchor_zero_init"]
NAMES = {"ar": "AR", "mtp415": "MTP415", "mtp:7": "mtp:7", "raw_dflash": "raw DFlash", "raw_dflash+dflash2": "DFlash2",
         "raw_dflash+dspark": "DSpark", "dual_anchor_zero_init": "DMTP", "dual_anchor_zero_init+dflash2": "DMTP(D2)",
         "dual_anchor_zero_init+dspark": "DMTP + DSpark heads",
         "dual_anchor_zero_init+dspark+mtp_correction": "greedy stack (DMTP + DSpark + correction)"}
WORKLOADS = ["code", "prose", "math", "code_tasks", "prose_tasks", "in-distribution", "held out", "all"]
ABLATION_MODES = ["greedy", "T=1 rejection", "T=1 target_only"]


def name(method: str) -> str:
    if method in NAMES:
        return NAMES[method]
    if method.startswith("raw_dflash+dspark ["):
        return "DSpark, sampled recipe"
    if method.startswith("multi_mtp"):
        return "sampled stack (corrected MTP chain, m = 7)"
    return method


def rows_of(*dirs: Path) -> list[dict]:
    return [r for d in dirs if d.exists() for r in collect(d)]


def samples(*dirs: Path) -> dict:
    """{mode: {workload: {method: {seed: stats}}}} over several sweep directories (missing ones skipped)."""
    return protocol_samples(rows_of(*dirs))


def _seeds(per_seed: dict, key: str = "tau_requests") -> tuple[list, list]:
    seeds = sorted(per_seed)
    return seeds, [per_seed[s].get(key) or [] for s in seeds]


def tau_cell(per_seed: dict | None) -> str:
    if not per_seed:
        return "-"
    seeds, groups = _seeds(per_seed)
    tau = float(np.mean([per_seed[s]["tau"] for s in seeds]))
    ci = bootstrap_interval(groups)
    return f"{tau:.3f} [{ci[0]:.2f}, {ci[1]:.2f}]" + ("" if len(seeds) == 3 else f" ({len(seeds)} seed{'s' * (len(seeds) > 1)})")


def tau_of(per_seed: dict | None) -> float | None:
    return float(np.mean([s["tau"] for s in per_seed.values()])) if per_seed else None


def t1_of(per_seed: dict | None) -> float | None:
    vals = [s.get("t1_accept") for s in (per_seed or {}).values() if s.get("t1_accept") is not None]
    return float(np.mean(vals)) if vals else None


def change(a: dict | None, b: dict | None) -> tuple[float, float, float] | None:
    """Paired change of a over b on the seeds both have."""
    if not a or not b:
        return None
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None
    return paired_ratio([a[s].get("tau_requests") or [] for s in seeds], [b[s].get("tau_requests") or [] for s in seeds])


def change_cell(c) -> str:
    if c is None:
        return "-"
    verdict = "" if c[1] <= 0 <= c[2] else (" **>**" if c[1] > 0 else " **<**")
    return f"{100 * c[0]:+.1f}% [{100 * c[1]:+.1f}, {100 * c[2]:+.1f}]{verdict}"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def ablation(S: dict) -> str:
    out = ["## The seed's ablation on the chat-model target\n",
           "Every variant of the seed's tables, the seed's recipe and one budget (3-layer DFlash backbone, 1200 steps), "
           "3 seeds. Change: paired, against token-only (the seed's reference row); the seed's column is its code "
           "ablation (8 prompts, one drafter) as the same ratio.\n"]
    for mode in [m for m in ABLATION_MODES if m in S]:
        per = S[mode]
        ref = per.get("code", {}).get("token_only")
        out.append(f"\n**{mode}** (tau per request [95% interval over seeds x prompts]; T1 = first-candidate acceptance)\n")
        rows = []
        for v in VARIANTS:
            code = per.get("code", {}).get(v)
            seed_ratio = f"{100 * (SEED_CODE[v] / SEED_CODE['token_only'] - 1):+.1f}%" if v in SEED_CODE else "-"
            t1 = t1_of(per.get("all", {}).get(v))
            rows.append([v, tau_cell(code), change_cell(change(code, ref)) if v != "token_only" else "0 (reference)",
                         seed_ratio, tau_cell(per.get("in-distribution", {}).get(v)),
                         tau_cell(per.get("held out", {}).get(v)), "-" if t1 is None else f"{t1:.3f}"])
        for b in ("mtp415", "mtp:7"):
            rows.append([name(b), tau_cell(per.get("code", {}).get(b)), change_cell(change(per.get("code", {}).get(b), ref)),
                         "-", tau_cell(per.get("in-distribution", {}).get(b)), tau_cell(per.get("held out", {}).get(b)),
                         "-"])
        out.append(table(["variant", "code", "code vs token-only", "seed: code vs token-only", "in-distribution",
                          "held out", "T1 (all)"], rows))
    return "\n".join(out)


def continuation(C: dict, F: dict) -> str:
    out = ["\n\n## The continuation study behind the seed's two updates\n",
           "From the raw DFlash drafter of the regime study (1200 steps, same seed), each variant continues 400 steps "
           "(init_from); the same 400 steps from scratch beside. Change: paired, continued over raw DFlash continued "
           "alone for the same 400 steps.\n"]
    cells = ["raw_dflash", "fusion_t1", "zero_init_t1", "dual_anchor_fusion", "dual_anchor_zero_init"]
    labels = {"raw_dflash": "raw DFlash (continued alone)", "fusion_t1": "single anchor, direct fusion",
              "zero_init_t1": "single anchor, zero-init residual", "dual_anchor_fusion": "dual anchor, direct fusion",
              "dual_anchor_zero_init": "dual anchor, zero-init residual (main)"}
    for mode in [m for m in ABLATION_MODES if m in C]:
        rows = []
        for wl in ("in-distribution", "held out", "all"):
            base = C[mode].get(wl, {}).get("raw_dflash")
            for v in cells:
                cont, scratch = C[mode].get(wl, {}).get(v), F.get(mode, {}).get(wl, {}).get(v)
                t1c, t1s = t1_of(cont), t1_of(scratch)
                rows.append([wl, labels[v], tau_cell(cont), "-" if t1c is None else f"{t1c:.3f}",
                             change_cell(change(cont, base)) if v != "raw_dflash" else "reference",
                             tau_cell(scratch), "-" if t1s is None else f"{t1s:.3f}"])
        out.append(f"\n**{mode}**\n")
        out.append(table(["workloads", "variant", "continued: tau", "continued: T1", "continued vs raw DFlash continued",
                          "from scratch: tau", "from scratch: T1"], rows))
    out.append("\n\n**The seed's two updates as contrasts** (paired change of the first over the second, all workloads; "
               "the seed: zero-init ~ direct fusion from scratch, better continued; dual ~ single from scratch, better "
               "continued)\n")
    contrasts = [("zero-init vs direct fusion, single anchor", "zero_init_t1", "fusion_t1"),
                 ("zero-init vs direct fusion, dual anchor", "dual_anchor_zero_init", "dual_anchor_fusion"),
                 ("dual vs single anchor, direct fusion", "dual_anchor_fusion", "fusion_t1"),
                 ("dual vs single anchor, zero-init", "dual_anchor_zero_init", "zero_init_t1")]
    rows = []
    for mode in [m for m in ABLATION_MODES if m in C]:
        for label, a, b in contrasts:
            cont = C[mode].get("all", {})
            scratch = F.get(mode, {}).get("all", {})
            rows.append([mode, label, change_cell(change(cont.get(a), cont.get(b))),
                         change_cell(change(scratch.get(a), scratch.get(b)))])
    out.append(table(["mode", "contrast", "continued", "from scratch"], rows))
    return "\n".join(out)


def pairs(S: dict) -> str:
    out = ["\n\n## DMTP(D) vs DFlash and DMTP(D2) vs DFlash2 (the seed's §8), MTP415 and mtp:7 in the same table\n",
           "Paired change per workload; T1 gap in points (DMTP's T1 minus the backbone's).\n"]
    for mode in [m for m in S if m in ("greedy", "T=1 rejection", "T=1 block", "T=1 target_only")]:
        per = S[mode]
        rows = []
        for wl in WORKLOADS:
            p = per.get(wl, {})
            row = [wl]
            for dmtp, base in (("dual_anchor_zero_init", "raw_dflash"), ("dual_anchor_zero_init+dflash2", "raw_dflash+dflash2")):
                t1d, t1b = t1_of(p.get(dmtp)), t1_of(p.get(base))
                row += [tau_cell(p.get(dmtp)), tau_cell(p.get(base)), change_cell(change(p.get(dmtp), p.get(base))),
                        "-" if t1d is None or t1b is None else f"{100 * (t1d - t1b):+.1f}"]
            row += [tau_cell(p.get("mtp415")), tau_cell(p.get("mtp:7"))]
            rows.append(row)
        out.append(f"\n**{mode}**\n")
        out.append(table(["workload", "DMTP", "DFlash", "DMTP vs DFlash", "T1 gap", "DMTP(D2)", "DFlash2",
                          "DMTP(D2) vs DFlash2", "T1 gap", "MTP415", "mtp:7"], rows))
    return "\n".join(out)


def conditional(S: dict) -> str:
    """The seed's per-position table: P(L >= k | L >= k-1), k = 1..7 (k = 1: T1), pooled over seeds."""
    out = ["\n\n## Per-position conditional acceptance (the seed's §7 table): P(L >= k | L >= k-1), k = 1 is T1\n"]
    for mode in [m for m in ("greedy", "T=1 target_only", "T=1 rejection") if m in S]:
        rows = []
        for wl in WORKLOADS[:5]:
            for m in ("raw_dflash", "dual_anchor_zero_init", "raw_dflash+dflash2", "dual_anchor_zero_init+dflash2"):
                per_seed = S[mode].get(wl, {}).get(m)
                if not per_seed:
                    continue
                cum = np.mean([s["p_len_ge"] for s in per_seed.values()], axis=0)
                cond = [cum[0]] + [cum[k] / cum[k - 1] if cum[k - 1] else float("nan") for k in range(1, len(cum))]
                verify = np.mean([s.get("tau_verify") or np.nan for s in per_seed.values()])
                rows.append([wl, name(m), f"{tau_of(per_seed):.3f}", f"{verify:.3f}"]
                            + [f"{100 * c:.1f}%" for c in cond])
        out.append(f"\n**{mode}**\n")
        out.append(table(["workload", "method", "tau per request", "tau per verify"] + [f"k={k}" for k in range(1, 8)], rows))
    return "\n".join(out)


def study(S: dict) -> str:
    out = ["\n\n## §11's rows on the new data (all rows, every mode)\n",
           "In-distribution (code, prose, math test prompts) and held out (code_tasks, prose_tasks); tau per request "
           "[95% interval over seeds x prompts]; ratio: tau / MTP415's on the same split.\n"]
    methods = sorted({m for per in S.values() for m in per.get("all", {})},
                     key=lambda m: list(NAMES).index(m) if m in NAMES else 99)
    for split in ("in-distribution", "held out", "all"):
        rows = []
        for m in methods:
            cells = []
            for mode in S:
                cur, ref = S[mode].get(split, {}).get(m), S[mode].get(split, {}).get("mtp415")
                ratio = f" ({tau_of(cur) / tau_of(ref):.2f}x)" if cur and ref else ""
                cells.append(tau_cell(cur) + ratio)
            rows.append([name(m)] + cells)
        out.append(f"\n**{split}**\n")
        out.append(table(["method"] + list(S), rows))
    out.append("\n\n**per workload, greedy and T=1 rejection** (tau; T1)\n")
    for mode in [m for m in ("greedy", "T=1 rejection") if m in S]:
        rows = []
        for m in methods:
            rows.append([name(m)] + [f"{tau_of(S[mode][wl].get(m)):.3f}; {t1_of(S[mode][wl].get(m)) or 0:.2f}"
                                     if S[mode].get(wl, {}).get(m) else "-" for wl in WORKLOADS[:5]])
        out.append(f"\n{mode}\n")
        out.append(table(["method"] + WORKLOADS[:5], rows))
    return "\n".join(out)


def speed(S: dict, recipes: dict) -> str:
    """The verdict by speed as well as tau: tau per verify (the tokens a round commits) x AR step / the method's round,
    priced at the 8B profile (dmtp.speed), at batch 1 and 32; a batch the profile cannot price names what it lacks."""
    out = ["\n\n## Projected speed-up over AR at 8B shapes (tau per verify x AR step / the method's round)\n",
           f"Profile `{PROFILE}` (H200 figures of 2026-12-04, measured and derived stages: BENCHMARKS.md, "
           "`dmtp/speed/profiles/`); the round from each method's own config (`dmtp.speed.recipe`).\n"]
    missing: set[str] = set()
    for mode in [m for m in ("greedy", "T=1 rejection", "T=1 target_only") if m in S]:
        methods = sorted({m for m in S[mode].get("all", {}) if m in recipes.get(mode, {})},
                         key=lambda m: list(NAMES).index(m) if m in NAMES else 99)
        rows = []
        for m in methods:
            row = [name(m)]
            for split in ("in-distribution", "held out", "all"):
                per_seed = S[mode].get(split, {}).get(m)
                verify = float(np.mean([s.get("tau_verify") or np.nan for s in per_seed.values()])) if per_seed else None
                cells = []
                for batch in (1, 32):
                    p = projected_speedup(recipes[mode][m], verify, PROFILE, batch)
                    cells.append(p.cell())
                    if not p.ok and p.why():
                        missing.add(f"b{batch}: " + ", ".join(p.missing))
                rounds = projected_speedup(recipes[mode][m], verify, PROFILE, 1).round_ms
                row += ["-" if verify is None else f"{verify:.3f}", cells[0], cells[1]]
            row.append("-" if rounds is None else f"{rounds:.2f}")
            rows.append(row)
        out.append(f"\n**{mode}**\n")
        out.append(table(["method", "in-dist tau/verify", "x b1", "x b32", "held-out tau/verify", "x b1", "x b32",
                          "all tau/verify", "x b1", "x b32", "round ms b1"], rows))
    if missing:
        out.append("\nNot projected (the profile lacks the stage): " + "; ".join(sorted(missing)))
    return "\n".join(out)


BASELINES = ("ar", "mtp415", "mtp:7")
BAR = 0.75   # issue 63's bars: the seed's lowest drafter/MTP ratio (Alpaca 0.78) and its held-out floor (0.88-0.90)


def bars(S: dict) -> str:
    """The regime's bars (greedy): no trained block drafter below 0.75 x MTP415 on an in-distribution workload; raw
    DFlash >= 0.75 x MTP415 on the held-out sets. Then the seed's orderings: DMTP > DFlash and DMTP(D2) > DFlash2 on
    every workload and mode (paired interval above zero), DMTP's T1 >= DFlash's + 5 points."""
    out = ["\n\n## The regime's bars and the seed's orderings\n",
           f"Greedy tau / MTP415's greedy tau on the same prompts (the bar: >= {BAR}); then, per mode, on how many of the "
           "five workloads each ordering holds (paired interval above zero; T1 gap >= 5 points).\n"]
    greedy = S.get("greedy", {})
    rows = []
    drafters = sorted({m for wl in ("code", "prose", "math") for m in greedy.get(wl, {}) if m not in BASELINES},
                      key=lambda m: list(NAMES).index(m) if m in NAMES else 99)
    for m in drafters:
        ratios = {wl: tau_of(greedy[wl].get(m)) / tau_of(greedy[wl]["mtp415"])
                  for wl in ("code", "prose", "math") if greedy.get(wl, {}).get(m) and greedy[wl].get("mtp415")}
        low = min(ratios.values())
        rows.append([name(m)] + [f"{ratios[wl]:.2f}" for wl in ("code", "prose", "math")]
                    + [f"{low:.2f} {'holds' if low >= BAR else 'fails'}"])
    out.append("\n**In-distribution: each trained drafter's greedy tau / MTP415's**\n")
    out.append(table(["drafter", "code", "prose", "math", f"lowest (bar {BAR})"], rows))
    rows = []
    for wl in ("code_tasks", "prose_tasks", "held out"):
        p = greedy.get(wl, {})
        if p.get("raw_dflash") and p.get("mtp415"):
            r = tau_of(p["raw_dflash"]) / tau_of(p["mtp415"])
            rows.append([wl, f"{tau_of(p['raw_dflash']):.3f}", f"{tau_of(p['mtp415']):.3f}",
                         f"{r:.2f} {'holds' if r >= BAR else 'fails'}"])
    out.append("\n**Held out: raw DFlash's greedy tau / MTP415's** (the seed's DFlash on MT-Bench: 0.88-0.90)\n")
    out.append(table(["held-out set", "raw DFlash", "MTP415", f"ratio (bar {BAR})"], rows))
    rows = []
    for mode in [m for m in ("greedy", "T=1 rejection", "T=1 block", "T=1 target_only") if m in S]:
        row = [mode]
        for dmtp, base in (("dual_anchor_zero_init", "raw_dflash"),
                           ("dual_anchor_zero_init+dflash2", "raw_dflash+dflash2")):
            wins = gaps = n = 0
            for wl in WORKLOADS[:5]:
                p = S[mode].get(wl, {})
                c = change(p.get(dmtp), p.get(base))
                if c is None:
                    continue
                n += 1
                wins += c[1] > 0
                t1d, t1b = t1_of(p.get(dmtp)), t1_of(p.get(base))
                gaps += t1d is not None and t1b is not None and 100 * (t1d - t1b) >= 5
            row += [f"{wins} of {n}", f"{gaps} of {n}"]
        rows.append(row)
    out.append("\n**The seed's orderings, workload by workload**\n")
    out.append(table(["mode", "DMTP > DFlash", "T1 gap >= 5 pts", "DMTP(D2) > DFlash2", "T1 gap >= 5 pts"], rows))
    return "\n".join(out)


COMMANDS = {"mtp415": "(none: the target's MTP)", "mtp:7": "(none: the target's MTP)",
            "raw_dflash": "`injection=raw_dflash`", "raw_dflash+dflash2": "`injection=raw_dflash drafter=dflash2`",
            "raw_dflash+dspark": "`injection=raw_dflash drafter=dspark`",
            "dual_anchor_zero_init": "`python -m dmtp.train` (the default)",
            "dual_anchor_zero_init+dflash2": "`drafter=dflash2`", "dual_anchor_zero_init+dspark": "`drafter=dspark`",
            "dual_anchor_zero_init+dspark+mtp_correction": "`experiment=greedy`"}
# The seed's readings of its ablation as pairs (first over second); the last two are the toolkit's zero-init rows.
SEED_CONTRASTS = [("fusion_t1", "hidden_residual_t1"), ("six_mask_residual", "hidden_residual_t1"),
                  ("dual_anchor_fusion", "fusion_t1"), ("zero_init_t1", "fusion_t1"),
                  ("dual_anchor_zero_init", "zero_init_t1"), ("dual_anchor_zero_init", "mtp415"),
                  ("dual_anchor_zero_init", "mtp:7")]
SHIP_ORDER = ["mtp415", "mtp:7", "raw_dflash", "raw_dflash+dflash2", "raw_dflash+dspark", "dual_anchor_zero_init",
              "dual_anchor_zero_init+dflash2", "dual_anchor_zero_init+dspark",
              "dual_anchor_zero_init+dspark+mtp_correction"]


def _speedup(S: dict, recipes: dict, mode: str, method: str, split: str = "all", batch: int = 1) -> str:
    per_seed = S.get(mode, {}).get(split, {}).get(method)
    if not per_seed or method not in recipes.get(mode, {}):
        return "-"
    verify = float(np.mean([s.get("tau_verify") or np.nan for s in per_seed.values()]))
    return projected_speedup(recipes[mode][method], verify, PROFILE, batch).cell()


def summary(S: dict, recipes: dict, A: dict) -> str:
    """The page's headline tables: which drafter to ship (tau and projected speed-up at 8B b1, all workloads), the
    ablation as paired changes over token-only, DMTP over its backbone."""
    methods = [m for m in SHIP_ORDER if m in S.get("greedy", {}).get("all", {})]
    methods += sorted(m for m in S.get("greedy", {}).get("all", {}) if m.startswith("multi_mtp"))
    rows = []
    for m in methods:
        rows.append([name(m), COMMANDS.get(m, "`experiment=sampled`"),
                     tau_cell(S["greedy"]["all"].get(m)), _speedup(S, recipes, "greedy", m),
                     tau_cell(S.get("T=1 rejection", {}).get("all", {}).get(m)),
                     _speedup(S, recipes, "T=1 rejection", m), _speedup(S, recipes, "T=1 target_only", m)])
    out = ["**Which drafter to ship** (all workloads; tau per request [95% interval over seeds x prompts]; x b1: "
           f"projected speed-up over AR at Qwen3-8B / H200 batch 1, profile `{PROFILE}`)\n",
           table(["method", "train it with", "greedy tau", "greedy x b1", "T=1 rejection tau", "T=1 rej. x b1",
                  "T=1 target-only x b1"], rows)]
    rows = []
    for v in VARIANTS:
        if v == "token_only":
            continue
        seed_ratio = f"{100 * (SEED_CODE[v] / SEED_CODE['token_only'] - 1):+.1f}%" if v in SEED_CODE else "-"
        row = [v, change_cell(change(A.get("greedy", {}).get("code", {}).get(v),
                                     A.get("greedy", {}).get("code", {}).get("token_only"))), seed_ratio]
        for mode in ABLATION_MODES:
            allw = A.get(mode, {}).get("all", {})
            row.append(change_cell(change(allw.get(v), allw.get("token_only"))))
        rows.append(row)
    out += ["\n**The ablation** (paired change over token-only, the seed's reference row)\n",
            table(["variant", "greedy, code", "the seed's code column", "greedy, all", "T=1 rejection, all",
                   "T=1 target-only, all"], rows)]
    rows = []
    for a, b in SEED_CONTRASTS:
        seed = f"{100 * (SEED_CODE[a] / SEED_CODE[b] - 1):+.1f}%" if a in SEED_CODE and b in SEED_CODE else "-"
        row = [f"{a} vs {b}", change_cell(change(A.get("greedy", {}).get("code", {}).get(a),
                                                  A.get("greedy", {}).get("code", {}).get(b))), seed]
        for mode in ABLATION_MODES:
            allw = A.get(mode, {}).get("all", {})
            row.append(change_cell(change(allw.get(a), allw.get(b))))
        rows.append(row)
    out += ["\n**The seed's pairwise readings of its ablation** (paired change of the first over the second)\n",
            table(["contrast", "greedy, code", "the seed's code column", "greedy, all", "T=1 rejection, all",
                   "T=1 target-only, all"], rows)]
    rows = []
    for mode in [m for m in ("greedy", "T=1 rejection", "T=1 block", "T=1 target_only") if m in S]:
        row = [mode]
        for dmtp, base in (("dual_anchor_zero_init", "raw_dflash"),
                           ("dual_anchor_zero_init+dflash2", "raw_dflash+dflash2")):
            for split in ("in-distribution", "held out", "all"):
                p = S[mode].get(split, {})
                row.append(change_cell(change(p.get(dmtp), p.get(base))))
            t1d, t1b = t1_of(S[mode]["all"].get(dmtp)), t1_of(S[mode]["all"].get(base))
            row.append("-" if t1d is None or t1b is None else f"{100 * (t1d - t1b):+.1f}")
        rows.append(row)
    out += ["\n**DMTP over its backbone** (paired change; T1 gap in points, all workloads)\n",
            table(["mode", "DMTP vs DFlash: in-dist.", "held out", "all", "T1 gap", "DMTP(D2) vs DFlash2: in-dist.",
                   "held out", "all", "T1 gap"], rows)]
    return "\n".join(out)


def main(root: str, headline: bool = False) -> None:
    root = Path(root)
    seeds = sorted(root.glob("regime/seed*"))
    regime_rows = rows_of(*seeds)
    regime = protocol_samples(regime_rows)
    ablation_s = samples(*seeds, *sorted(root.glob("ablation/seed*")))
    if headline:
        print(summary(regime, protocol_recipes(regime_rows), ablation_s))
        return
    print("# The seed's experiment in the seed's regime (docs/results.md §12)\n")
    print(f"Sweeps under `{root.name}/`: regime {len(seeds)} seed(s), ablation "
          f"{len(list(root.glob('ablation/seed*')))}, continuation {len(list(root.glob('continued/seed*')))}.\n")
    print(ablation(ablation_s))
    print(continuation(samples(*sorted(root.glob("continued/seed*"))), samples(*sorted(root.glob("scratch/seed*")))))
    print(pairs(regime))
    print(bars(regime))
    print(conditional(regime))
    print(study(regime))
    print(speed(regime, protocol_recipes(regime_rows)))


if __name__ == "__main__":
    main(sys.argv[1], headline="--summary" in sys.argv[2:])
