"""The table a training run ends with: per validation domain, the final exact greedy walk (SPEC §6) of
the trained drafter, from the flat record written to metrics.json (`walk/<domain>/<metric>`)."""
from __future__ import annotations

from dmtp.decode.metrics import format_table

SHOWN_LENGTHS = (2, 4, 7)   # P(L>=k): accepted-run lengths worth a column (k=1 is t1_accept)


def walk_rows(record: dict) -> list[dict]:
    domains = sorted({key.split("/")[1] for key in record if key.startswith("walk/") and key.endswith("/tau")})
    rows = []
    for domain in domains:
        row = {"domain": domain, "tau": record[f"walk/{domain}/tau"], "t1_accept": record.get(f"walk/{domain}/t1_accept")}
        for k in SHOWN_LENGTHS:
            row[f"P(L>={k})"] = record.get(f"walk/{domain}/p_len_ge_{k}")
        rows.append(row)
    return rows


def walk_table(record: dict) -> str | None:
    """None when the run has no walk figures (model.val_walk=false, or no validation ran)."""
    rows = walk_rows(record)
    if not rows:
        return None
    title = (f"final validation walk, {record['method']} at step {record['global_step']} (exact greedy acceptance "
             "on held-out prompts; t1_accept = P(L>=1))")
    return format_table(rows, ["domain", "tau", "t1_accept", *(f"P(L>={k})" for k in SHOWN_LENGTHS)], title=title)
