"""Aggregate a sweep directory: `python -m dmtp.report <sweep_dir> [--out DIR]` writes results.csv,
results.md (the blog's table) and PNG plots (the work: dmtp.reports.sweep)."""
from __future__ import annotations

import argparse

from dmtp.reports.sweep import aggregate


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Aggregate a dmtp sweep directory into a table and plots.")
    parser.add_argument("sweep_dir")
    parser.add_argument("--out", default=None)
    parser.add_argument("--speed-profile", default=None,
                        help="the protocol tables' projected speed-up over AR at this stage-cost profile (dmtp.speed: "
                             "a shipped name, e.g. qwen3-8b.h200.bf16 or assistant.cpu.fp32, a directory or a file; "
                             "default: the records', else qwen3-8b.h200.bf16)")
    args = parser.parse_args(argv)
    out = aggregate(args.sweep_dir, args.out, args.speed_profile)
    print((out / "results.md").read_text())
    print(f"[dmtp] wrote {out}/results.csv, results.md and plots")


if __name__ == "__main__":
    main()
