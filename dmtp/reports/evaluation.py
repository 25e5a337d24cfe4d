"""The table a training run ends with when it decodes under the evaluation protocol (decode_eval; the quick
start's): per workload, in each decoding mode side by side, the drafter's tau and that of the target's own MTP
chained alone on the same prompts (MTP415, and mtp:7 over the whole block where it was decoded), each with its 95%
bootstrap interval over the prompts, and the paired change with the verdict the intervals allow ("wins", "loses",
or "~" within noise); below it, what each is worth in tokens per second where users serve: the projected speed-up
over AR at the record's speed profile (dmtp.speed: tau x AR step / the method's round, priced from its own stages;
batch 1 and 32), with one line per method and batch the profile cannot price.

From the "eval" record of metrics.json (dmtp.training.evaluate)."""
from __future__ import annotations

from dmtp.reports.intervals import bootstrap_interval, paired_ratio, separated
from dmtp.reports.tables import format_table
from dmtp.speed.projection import profile_header, projections, why_lines

BASELINES = ("mtp415", "mtp:7")   # the first always; the second where the record decoded it


def _cell(stats: dict | None) -> str:
    if not stats or stats.get("tau") is None:
        return "-"
    ci = bootstrap_interval(stats["tau_requests"])
    return f"{stats['tau']:.3f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


def _versus(mine: dict | None, theirs: dict | None) -> str:
    if not mine or not theirs:
        return "-"
    change = paired_ratio(mine["tau_requests"], theirs["tau_requests"])
    if change is None:
        return "-"
    ci_a, ci_b = bootstrap_interval(mine["tau_requests"]), bootstrap_interval(theirs["tau_requests"])
    mark = ("wins" if change[0] > 0 else "loses") if separated(ci_a, ci_b) else "~"
    return f"{100 * change[0]:+.1f}% {mark}"


def _baselines(modes: dict) -> list[str]:
    decoded = {m for per in modes.values() for methods in per.values() for m in methods}
    return [BASELINES[0]] + [b for b in BASELINES[1:] if b in decoded]


def evaluation_table(record: dict, method: str, step: int | None = None) -> str | None:
    """None when the record decoded nothing."""
    modes = record.get("modes") or {}
    if not modes:
        return None
    workloads, baselines = list(next(iter(modes.values()))), _baselines(modes)
    columns, rows = ["workload"], []
    for mode in modes:
        columns += [f"{mode} drafter"] + [f"{mode} {b}" for b in baselines] + [f"{mode} vs {b}" for b in baselines]
    held_out = set((record.get("protocol") or {}).get("held_out") or ())
    for wl in workloads:
        row = {"workload": f"{wl} (held out)" if wl in held_out else wl}
        for mode, per in modes.items():
            mine = per.get(wl, {}).get("drafter")
            row[f"{mode} drafter"] = _cell(mine)
            for b in baselines:
                theirs = per.get(wl, {}).get(b)
                row[f"{mode} {b}"], row[f"{mode} vs {b}"] = _cell(theirs), _versus(mine, theirs)
        rows.append(row)
    protocol = record.get("protocol") or {}
    counts = ", ".join(f"{wl} {n}" for wl, n in (protocol.get("workloads") or {}).items())
    at = f" at step {step}" if step is not None else ""
    title = (f"held-out decoding, {method}{at}: tau per request [95% bootstrap interval over the prompts]; "
             f"{' / '.join(baselines)}: the target's MTP chained alone on the same prompts; wins/loses: intervals "
             f"apart, ~: within noise; (held out): a prompt set or domain the drafter's data lacks\ntarget {protocol.get('target')} (weights "
             f"{protocol.get('target_digest') or 'not hashed'}); "
             f"prompts: {counts}; {protocol.get('max_new_tokens')} new tokens, batch {protocol.get('batch_size')}")
    table = format_table(rows, columns, title=title)
    projected = projection_table(record)
    return table if projected is None else table + "\n\n" + projected


def projection_table(record: dict) -> str | None:
    """Per workload (the pooled rows included) and mode: each method's projected speed-up over AR at the record's
    speed profile ("b1 / b32"), then each method's round in ms and a line per method and batch without a figure.

    None when the record holds no speed section (decoded before dmtp.speed, or decode_eval.speed_profile=null)."""
    speed = record.get("speed") or {}
    modes = record.get("modes") or {}
    if not speed.get("profile") or not speed.get("recipes") or not modes:
        return None
    batches = list(speed.get("batches") or ())
    held_out = set((record.get("protocol") or {}).get("held_out") or ())
    columns, rows, found_all = ["workload"], [], []
    methods = {mode: [m for m in (speed["recipes"].get(mode) or {})] for mode in modes}
    for mode in modes:
        columns += [f"{mode} {m}" for m in methods[mode]]
    for wl in next(iter(modes.values())):
        row = {"workload": f"{wl} (held out)" if wl in held_out else wl}
        for mode, per in modes.items():
            stats = per.get(wl, {})
            taus = {m: (stats.get(m) or {}).get("tau_verify") for m in methods[mode]}
            found = projections(speed["recipes"][mode], taus, speed["profile"], batches)
            found_all += [p for ps in found.values() for p in ps.values()]
            for m in methods[mode]:
                row[f"{mode} {m}"] = " / ".join(p.cell() for p in found.get(m, {}).values()) or "-"
        rows.append(row)
    title = (profile_header(speed["profile"], batches) + f"; cells: {' / '.join(f'x b{b}' for b in batches)}"
             + (f"; drafting heads over a draft vocabulary of {speed['draft_vocab']} tokens"
                if speed.get("draft_vocab") else ""))
    notes = []
    for b in batches:
        priced = {}
        for p in found_all:
            if p.batch == b and p.round_ms is not None:
                priced.setdefault(p.method, p)
        if priced:
            derived = sorted({k for p in priced.values() for k in p.derived})
            notes.append(f"round at {next(iter(priced.values())).profile}: "
                         + ", ".join(f"{m} {p.round_ms:.2f} ms" for m, p in priced.items())
                         + (f" (derived stages used: {', '.join(derived)})" if derived else " (all measured)"))
    return "\n".join([format_table(rows, columns, title=title), *notes, *why_lines(found_all)])


__all__ = ["evaluation_table", "projection_table"]
