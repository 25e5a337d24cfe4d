"""The closing table of a sweep of a few drafters (the quick start's: the seed's DMTP beside raw DFlash): per decoding
mode, each workload's tau for every drafter and for the target's own MTP chains (MTP415, mtp:7), decoded on the same
prompts, and the first drafter's paired change against each of the others, with the verdict the 95% intervals allow.

Reads the jobs' metrics.json ("eval" records, dmtp.training.evaluate), as every report reads files."""
from __future__ import annotations

import json
from pathlib import Path

from dmtp.configs import override
from dmtp.reports.evaluation import BASELINES, _cell, _versus
from dmtp.reports.tables import format_table


def side_by_side_table(records: dict[str, dict]) -> str | None:
    """records: {drafter label: a job's metrics.json record}, the first the one compared with the others.

    None when no record decoded under the protocol. The baselines are read from the first record that decoded them
    (every job of one sweep decodes them on the same prompts)."""
    evals = {label: r["eval"] for label, r in records.items() if r.get("eval", {}).get("modes")}
    if not evals:
        return None
    first = next(iter(evals))
    modes = list(evals[first]["modes"])
    held_out = set((evals[first].get("protocol") or {}).get("held_out") or ())
    blocks = []
    for mode in modes:
        per_label = {label: e["modes"].get(mode, {}) for label, e in evals.items()}
        workloads = list(per_label[first])
        baselines = [b for b in BASELINES if any(b in per.get(wl, {}) for per in per_label.values() for wl in workloads)]
        rivals = [label for label in evals if label != first] + baselines
        columns = ["workload", *evals, *baselines, *(f"{first} vs {r}" for r in rivals)]
        rows = []
        for wl in workloads:
            mine = per_label[first].get(wl, {}).get("drafter")
            row = {"workload": f"{wl} (held out)" if wl in held_out else wl}
            stats = {label: per.get(wl, {}).get("drafter") for label, per in per_label.items()}
            for b in baselines:
                stats[b] = next((per[wl][b] for per in per_label.values() if b in per.get(wl, {})), None)
            for label in [*evals, *baselines]:
                row[label] = _cell(stats[label])
            for r in rivals:
                row[f"{first} vs {r}"] = _versus(mine, stats[r])
            rows.append(row)
        blocks.append(format_table(rows, columns, title=f"{mode}: tau per request [95% bootstrap interval over the prompts]"))
    protocol = evals[first].get("protocol") or {}
    head = (f"The drafters side by side, held-out decoding on the same prompts (target {protocol.get('target')}; "
            f"{protocol.get('max_new_tokens')} new tokens, batch {protocol.get('batch_size')}); wins/loses: intervals "
            f"apart, ~: within noise; (held out): a prompt set the drafters' data lacks")
    return "\n\n".join([head, *blocks])


def side_by_side_of(job_dirs: list[Path], labels: dict[str, str] | None = None) -> str | None:
    """The table of several run directories' metrics.json, labelled by their method (or `labels[method]`)."""
    records = {}
    for job in job_dirs:
        path = Path(job) / "metrics.json"
        if path.exists():
            record = json.loads(path.read_text())
            method = record.get("method", Path(job).name)
            records[(labels or {}).get(method, method)] = record
    return side_by_side_table(records)


class SideBySideOnMultirunEnd:
    """Hydra callback (hydra.callbacks): when the multirun ends, print its jobs side by side, in the sweep's job order
    (sweeps/quickstart.yaml: the seed's DMTP first, then raw DFlash)."""

    def __init__(self, labels: dict | None = None) -> None:
        self.labels = dict(labels or {})

    def on_multirun_end(self, config, **kwargs) -> None:
        root = Path(config.hydra.sweep.dir)
        jobs = sorted((p.parent for p in root.glob("*/metrics.json")), key=lambda p: int(p.name.split("_")[0])
                      if p.name.split("_")[0].isdigit() else 0)
        table = side_by_side_of(jobs, self.labels)
        if table:
            print(table)
            (root / "side_by_side.txt").write_text(table + "\n")
            print(f"[dmtp] this table: {root / 'side_by_side.txt'}")
            for job in jobs:
                print(f"[dmtp] decode with it: python -m dmtp.infer {override('drafter', job / 'drafter')}")

    def __getattr__(self, name):  # the other Hydra callback hooks are no-ops
        if name.startswith("on_"):
            return lambda *a, **k: None
        raise AttributeError(name)


__all__ = ["SideBySideOnMultirunEnd", "side_by_side_of", "side_by_side_table"]
