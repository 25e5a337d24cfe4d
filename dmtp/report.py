"""Aggregate a sweep directory: `python -m dmtp.report <sweep_dir> [--out DIR]` writes results.csv,
results.md (the blog's table) and PNG plots (the work: dmtp.reports.sweep)."""
from __future__ import annotations

import argparse

from dmtp.reports.sweep import aggregate


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Aggregate a dmtp sweep directory into a table and plots.")
    parser.add_argument("sweep_dir")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    out = aggregate(args.sweep_dir, args.out)
    print((out / "results.md").read_text())
    print(f"[dmtp] wrote {out}/results.csv, results.md and plots")


if __name__ == "__main__":
    main()
