"""The aligned plain-text table every report prints (decoding comparison, validation walk, benchmarks)."""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor

__all__ = ["format_table"]


def _fmt_cell(value: Any, float_digits: int) -> str:
    if value is None:
        return "-"
    if isinstance(value, Tensor):
        value = value.tolist()
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.{float_digits}f}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_fmt_cell(v, min(float_digits, 2)) for v in value) + "]"
    return str(value)


def _is_numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def format_table(
    rows: list[dict[str, Any]],
    columns: list[str],
    float_digits: int = 3,
    title: str | None = None,
) -> str:
    """Aligned plain-text table.

    Numbers are right-aligned, other cells left-aligned; missing values and ``None`` print as ``-``."""
    header = [str(c) for c in columns]
    body = [[_fmt_cell(row.get(c), float_digits) for c in columns] for row in rows]
    numeric = [
        all(_is_numeric(row.get(c)) or row.get(c) is None for row in rows) and len(rows) > 0
        for c in columns
    ]
    widths = [
        max([len(header[j])] + [len(r[j]) for r in body]) for j in range(len(columns))
    ]

    def line(cells: list[str]) -> str:
        parts = [
            cell.rjust(widths[j]) if numeric[j] else cell.ljust(widths[j])
            for j, cell in enumerate(cells)
        ]
        return "  ".join(parts).rstrip()

    out = []
    if title:
        out.append(title)
    out.append(line(header))
    out.append("  ".join("-" * w for w in widths))
    out.extend(line(r) for r in body)
    return "\n".join(out)
