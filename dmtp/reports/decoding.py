"""The text report of a decoding comparison: acceptance and throughput per workload, per-stage times."""
from __future__ import annotations

from dmtp.decode.metrics import nothing_verified
from dmtp.reports.tables import format_table

TABLE_COLUMNS = ["workload", "method", "tau", "tau_verify", "t1_accept", "verified", "tok/s", "speedup", "ttft_ms",
                 "ms/round", "matches_ar"]


def table_rows(metrics: dict) -> list[dict]:
    rows = []
    scopes = [(wl, t) for wl, t in metrics["workloads"].items()]
    if len(scopes) > 1:
        scopes.append(("all", metrics["overall"]))
    for wl, table in scopes:
        for name, s in table.items():
            rows.append({"workload": wl, "method": name, "tau": s["tau_per_request"], "tau_verify": s["tau_per_verify"],
                         "t1_accept": s["t1_accept"], "verified": s.get("verified_per_round"),   # candidates per round
                         "tok/s": s["tokens_per_s"], "speedup": s.get("speedup_vs_ar"),
                         "ttft_ms": s["ttft_ms"], "ms/round": s["stage_ms_per_round"].get("round"),
                         "matches_ar": s.get("matches_ar")})
    return rows


def stage_table(metrics: dict) -> str:
    stages = ["mtp", "t1_fusion", "drafter", "verify", "round"]
    rows = [{"method": name, **{k: s["stage_ms_per_round"].get(k) for k in stages}}
            for name, s in metrics["overall"].items()]
    return format_table(rows, ["method", *stages], float_digits=3, title="per-stage ms per round (after warm-up rounds)")


def report(metrics: dict) -> str:
    parts = [format_table(table_rows(metrics), TABLE_COLUMNS, title="acceptance length (tau) and throughput"),
             "", stage_table(metrics)]
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
