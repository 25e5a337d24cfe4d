"""The options every benchmark script takes, declared once: where it runs, in what dtype, on how many
threads, and where its JSON report goes (written by `write_report`).

Each script keeps its own defaults (a micro-benchmark times one kernel on an explicit device in float32; a decoding
bench follows the target's placement)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

DTYPES = ["float32", "bfloat16", "float16"]


def add_machine_args(ap: argparse.ArgumentParser, *, device: str | None = "auto", dtype: str | None = "auto",
                     threads: int | str | None = "auto", seed: bool = False, dtype_help: str | None = None) -> None:
    """--device, --dtype, --threads, --out (and --seed); `dtype="auto"` follows the target's config.

    An option given as None is not offered (a script that only writes a report takes --out alone)."""
    if device is not None:
        ap.add_argument("--device", default=device)
    if dtype is not None:
        ap.add_argument("--dtype", default=dtype, choices=None if dtype == "auto" else DTYPES, help=dtype_help)
    if isinstance(threads, int):
        ap.add_argument("--threads", type=int, default=threads, help="torch CPU threads (0: leave as is)")
    elif threads is not None:
        ap.add_argument("--threads", default=threads, help="torch CPU threads, or auto (dmtp.threads' policy)")
    if seed:
        ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write the JSON report here")


def add_attention_head_args(ap: argparse.ArgumentParser) -> None:
    """--heads, --kv-heads, --head-dim at Qwen3-8B's widths (32 query / 8 K/V heads x 128); `check_attention_heads`
    after parsing."""
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)


def check_attention_heads(ap: argparse.ArgumentParser, args) -> None:
    """Grouped-query attention's rule: whole query heads per K/V head, every width >= 1 (argparse's one-line error)."""
    if min(args.heads, args.kv_heads, args.head_dim) < 1:
        ap.error("--heads, --kv-heads and --head-dim must be >= 1")
    if args.heads % args.kv_heads:
        ap.error(f"--heads ({args.heads}) must be a multiple of --kv-heads ({args.kv_heads})")


def write_report(path: str | None, report) -> None:
    """The JSON report every script ends with (--out), and one line saying where it went; nothing without --out."""
    if not path:
        return
    Path(path).write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"report written to {path}")
