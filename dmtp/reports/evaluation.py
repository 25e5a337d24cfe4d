"""The table a training run ends with when it decodes under the evaluation protocol (decode_eval; the quick
start's): per workload, in each decoding mode side by side, the drafter's tau and the target's own MTP415 chain's
on the same prompts, each with its 95% bootstrap interval over the prompts, and the paired change with the
verdict the intervals allow ("beats", "loses to", or "~" within noise).

From the "eval" record of metrics.json (dmtp.training.evaluate)."""
from __future__ import annotations

from dmtp.reports.intervals import bootstrap_interval, paired_ratio, separated
from dmtp.reports.tables import format_table

BASELINE = "mtp415"


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


def evaluation_table(record: dict, method: str, step: int | None = None) -> str | None:
    """None when the record decoded nothing."""
    modes = record.get("modes") or {}
    if not modes:
        return None
    workloads = list(next(iter(modes.values())))
    columns, rows = ["workload"], []
    for mode in modes:
        columns += [f"{mode} drafter", f"{mode} {BASELINE}", f"{mode} vs {BASELINE}"]
    for wl in workloads:
        row = {"workload": wl}
        for mode, per in modes.items():
            mine, theirs = per.get(wl, {}).get("drafter"), per.get(wl, {}).get(BASELINE)
            row[f"{mode} drafter"] = _cell(mine)
            row[f"{mode} {BASELINE}"] = _cell(theirs)
            row[f"{mode} vs {BASELINE}"] = _versus(mine, theirs)
        rows.append(row)
    protocol = record.get("protocol") or {}
    counts = ", ".join(f"{wl} {n}" for wl, n in (protocol.get("workloads") or {}).items())
    at = f" at step {step}" if step is not None else ""
    title = (f"held-out decoding, {method}{at}: tau per request [95% bootstrap interval over the prompts]; "
             f"{BASELINE}: the target's MTP chained alone on the same prompts; wins/loses: intervals apart, "
             f"~: within noise\ntarget {protocol.get('target')} (weights {protocol.get('target_digest') or 'not hashed'}); "
             f"prompts: {counts}; {protocol.get('max_new_tokens')} new tokens, batch {protocol.get('batch_size')}")
    return format_table(rows, columns, title=title)


__all__ = ["evaluation_table"]
