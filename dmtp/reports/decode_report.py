"""The text report of a decoding comparison: per workload and method, tau with its 95% bootstrap interval over
the prompts (dmtp.reports.intervals), T1 acceptance, P(L>=k), throughput here, and the projected speed-up over AR at
a speed profile (dmtp.speed: tau x AR step / the method's round, priced from its stages, at batch 1 and 32: the
shipped Qwen3-8B/H200 profile by default); then, per workload, each drafter against the strongest baseline beside
it (the paired change over the same prompts, and whether the intervals separate: "A beats B" or "within noise");
then per-stage times."""
from __future__ import annotations

from dmtp.decode.metrics import nothing_verified
from dmtp.reports.intervals import bootstrap_interval, format_interval, paired_ratio, separated
from dmtp.reports.tables import format_table
from dmtp.speed.projection import profile_header, projections, why_lines

TABLE_COLUMNS = ["workload", "method", "tau", "95% CI", "t1_accept", "P(L>=2)", "P(L>=4)", "verified", "tok/s",
                 "speedup", "ms/round", "matches_ar"]


def request_taus(summary: dict) -> list[float | None]:
    """Each request's tau (mean acceptance length of its rounds), in request order; None for a request that ran
    no round (it ended at once, e.g. with EOS), so that two methods' lists stay aligned prompt by prompt."""
    return [r.get("tau") for r in summary.get("per_request") or ()]


def is_baseline(method: str) -> bool:
    return method == "ar" or (method.startswith("mtp") and "+" not in method)


def _p(summary: dict, k: int):
    p = summary.get("p_len_ge") or []
    return p[k - 1] if len(p) >= k else None


def _speed(metrics: dict) -> dict | None:
    """metrics.json's run.speed (the profile and each method's round), when it names a profile."""
    speed = (metrics.get("run") or {}).get("speed") or {}
    return speed if speed.get("profile") and speed.get("recipes") else None


def projected_columns(metrics: dict) -> list[str]:
    speed = _speed(metrics)
    return [f"x b{b}" for b in speed.get("batches") or ()] if speed else []


def _projected(metrics: dict, table: dict) -> dict:
    """{method: {batch: Projection}} of one scope's summaries (tau per verify: the tokens a round commits)."""
    speed = _speed(metrics)
    if speed is None:
        return {}
    taus = {name: s.get("tau_per_verify") for name, s in table.items()}
    return projections(speed["recipes"], taus, speed["profile"], speed.get("batches") or ())


def table_rows(metrics: dict) -> list[dict]:
    rows = []
    scopes = [(wl, t) for wl, t in metrics["workloads"].items()]
    if len(scopes) > 1:
        scopes.append(("all", metrics["overall"]))
    for wl, table in scopes:
        found = _projected(metrics, table)
        for name, s in table.items():
            rows.append({"workload": wl, "method": name, "tau": s["tau_per_request"],
                         **{f"x b{b}": p.cell() for b, p in found.get(name, {}).items()},
                         "95% CI": format_interval(bootstrap_interval(request_taus(s))),
                         "t1_accept": s["t1_accept"], "P(L>=2)": _p(s, 2), "P(L>=4)": _p(s, 4),
                         "verified": s.get("verified_per_round"),   # candidates verified per round
                         "tok/s": s["tokens_per_s"], "speedup": s.get("speedup_vs_ar"),
                         "ms/round": s["stage_ms_per_round"].get("round"), "matches_ar": s.get("matches_ar")})
    return rows


def comparisons(metrics: dict) -> list[str]:
    """Per workload: every drafter against the baseline with the highest tau there (MTP415 or another MTP chain;
    AR when there is none), the paired change over the same prompts with its interval, and the verdict."""
    lines = []
    for wl, table in metrics["workloads"].items():
        baselines = [m for m in table if is_baseline(m) and m != "ar"] or [m for m in table if m == "ar"]
        drafters = [m for m in table if not is_baseline(m)]
        if not baselines or not drafters:
            continue
        best = max(baselines, key=lambda m: table[m]["tau_per_request"] or 0)
        ref = request_taus(table[best])
        ref_ci = bootstrap_interval(ref)
        for m in drafters:
            mine = request_taus(table[m])
            change = paired_ratio(mine, ref)
            if change is None:
                continue
            ci = bootstrap_interval(mine)
            word = ("beats" if change[0] > 0 else "loses to") if separated(ci, ref_ci) else "within noise of"
            lines.append(f"{wl}: {m} {word} {best}: {100 * change[0]:+.1f}% tau "
                         f"(paired 95% CI {100 * change[1]:+.1f}%..{100 * change[2]:+.1f}%)")
    return lines


def stage_table(metrics: dict) -> str:
    stages = ["mtp", "t1_fusion", "slots", "drafter", "verify", "round"]
    rows = [{"method": name, **{k: s["stage_ms_per_round"].get(k) for k in stages}}
            for name, s in metrics["overall"].items()]
    stages = [k for k in stages if any(row[k] is not None for row in rows)]
    return format_table(rows, ["method", *stages], float_digits=3, title="per-stage ms per round (after warm-up rounds)")


def header(metrics: dict) -> str:
    """What was decoded: the target and its weights' digest, the prompts, the budget and the sampling."""
    run = metrics.get("run") or {}
    first = next(iter(metrics["overall"].values()), {})
    sampling = first.get("sampling") or {}
    prompts = ", ".join(f"{wl} {n}" for wl, n in (run.get("num_prompts") or {}).items())
    mode = ("greedy" if not sampling.get("temperature") else
            f"temperature {sampling['temperature']}, {sampling.get('verification')} verification")
    return (f"target {run.get('target')} (weights {run.get('target_digest') or 'not hashed'}); prompts: {prompts}; "
            f"{run.get('max_new_tokens')} new tokens, batch {run.get('batch_size')}; {mode}")


def projection_notes(metrics: dict) -> list[str]:
    """Below the table: each method's round at every projected batch (ms, the derived stages it used), and one line
    per method and batch the profile cannot price, naming the stages it lacks."""
    speed = _speed(metrics)
    if speed is None:
        return []
    found = _projected(metrics, metrics["overall"])
    lines = []
    for b in speed.get("batches") or ():
        priced = [(m, ps[b]) for m, ps in found.items() if b in ps and ps[b].round_ms is not None]
        if priced:
            derived = sorted({k for _, p in priced for k in p.derived})
            lines.append(f"round at {priced[0][1].profile}: " + ", ".join(f"{m} {p.round_ms:.2f} ms" for m, p in priced)
                         + (f" (derived stages used: {', '.join(derived)})" if derived else " (all measured)"))
    lines += why_lines(p for ps in found.values() for p in ps.values())
    return lines


def report(metrics: dict) -> str:
    columns = TABLE_COLUMNS[:10] + projected_columns(metrics) + TABLE_COLUMNS[10:]
    speed = _speed(metrics)
    title = "acceptance length (tau, per request; 95% bootstrap interval over the prompts) and throughput"
    if speed:
        title += (" here (tok/s, speedup), and the projected speed-up where users serve\n"
                  + profile_header(speed["profile"], speed.get("batches") or ()))
        if speed.get("draft_vocab"):
            title += f"; drafting heads over a draft vocabulary of {speed['draft_vocab']} tokens"
    parts = [header(metrics), "", format_table(table_rows(metrics), columns, title=title), *projection_notes(metrics)]
    versus = comparisons(metrics)
    if versus:
        parts += ["", "each drafter against the strongest baseline (intervals that overlap: within noise)", *versus]
    parts += ["", stage_table(metrics)]
    for name, s in metrics["overall"].items():
        if s.get("p_len_ge"):
            parts.append(f"{name}: P(L>=k) k=1..{len(s['p_len_ge'])} = "
                         + ", ".join("-" if v is None else f"{v:.3f}" for v in s["p_len_ge"]))
    parts += [line for name, s in metrics["overall"].items() if (line := nothing_verified(name, s))]
    if (metrics.get("run") or {}).get("target_mismatch"):   # the table's caveat, kept with it (table.txt, card)
        parts.append(metrics["run"]["target_mismatch"])
    return "\n".join(parts)


def jsonable(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k != "results"}
