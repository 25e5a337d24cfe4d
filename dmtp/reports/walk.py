"""The table a training run ends with: per validation domain, the final exact greedy walk (SPEC §6) of
the trained drafter and, beside it, of the MTP chain alone on the same sequences (the mtp415 baseline),
from the flat record written to metrics.json (`walk/<domain>/<metric>`, `walk/<domain>/mtp415_<metric>`)."""
from __future__ import annotations

import re

from dmtp.reports.tables import format_table

SHOWN_LENGTHS = (2, 4)      # P(L>=k): accepted-run lengths worth a column (k=1 is t1_accept), and the whole block
CHAIN_LENGTHS = (2, 4)      # the chain proposes 4 tokens: P(L>=K) is 0 by construction


_CHAIN_TAU = re.compile(r"walk/[^/]+/(mtp[0-9]+(?:_tuned)?)_tau")
_DRAFTER_LENGTH = re.compile(r"walk/[^/]+/p_len_ge_([0-9]+)")


def shown_lengths(record: dict) -> tuple[int, ...]:
    """The P(L>=k) columns: SHOWN_LENGTHS and K, the drafter's whole block (its largest k in the record)."""
    ks = [int(m.group(1)) for m in map(_DRAFTER_LENGTH.fullmatch, record) if m]
    return tuple(sorted(set(SHOWN_LENGTHS) | ({max(ks)} if ks else set())))


def _chain_prefix(record: dict) -> str | None:
    """The MTP chain's metric prefix in the record (e.g. "mtp415"), if the walk ran one."""
    names = {m.group(1) for m in map(_CHAIN_TAU.fullmatch, record) if m}
    return min(names) if names else None


def walk_rows(record: dict) -> list[dict]:
    domains = sorted({key.split("/")[1] for key in record if key.startswith("walk/") and key.endswith("/tau")})
    chain = _chain_prefix(record)
    rows = []
    for domain in domains:
        metric = lambda name: record.get(f"walk/{domain}/{name}")  # noqa: E731
        row = {"domain": domain, "tau": metric("tau"), "t1_accept": metric("t1_accept")}
        for k in shown_lengths(record):
            row[f"P(L>={k})"] = metric(f"p_len_ge_{k}")
        if chain is not None:
            row[f"{chain} tau"] = metric(f"{chain}_tau")
            row[f"{chain} t1_accept"] = metric(f"{chain}_t1_accept")
            for k in CHAIN_LENGTHS:
                row[f"{chain} P(L>={k})"] = metric(f"{chain}_p_len_ge_{k}")
        rows.append(row)
    return rows


def walk_table(record: dict) -> str | None:
    """None when the run has no walk figures (model.val_walk=false, or no validation ran)."""
    rows = walk_rows(record)
    if not rows:
        return None
    chain = _chain_prefix(record)
    columns = ["domain", "tau", "t1_accept", *(f"P(L>={k})" for k in shown_lengths(record))]
    beside = ""
    if chain is not None:
        columns += [f"{chain} tau", f"{chain} t1_accept", *(f"{chain} P(L>={k})" for k in CHAIN_LENGTHS)]
        whose = "the jointly trained MTP" if chain.endswith("_tuned") else "the target's MTP"
        beside = f"; {chain}: {whose} chained alone on the same sequences"
    title = (f"final validation walk, {record['method']} at step {record['global_step']} (exact greedy acceptance "
             f"on held-out prompts; t1_accept = P(L>=1){beside})")
    return format_table(rows, columns, title=title)
