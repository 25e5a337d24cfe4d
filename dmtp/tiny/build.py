"""Build (once) and cache an embedded target, or re-measure a built one (library: dmtp.tiny.targets).

    python -m dmtp.tiny.build --preset tiny          # default target (Qwen3), ~9.5 minutes on 2 CPU cores
    python -m dmtp.tiny.build --preset micro         # test target, seconds
    python -m dmtp.tiny.build --preset tiny_hybrid   # Qwen3.5 hybrid (gated DeltaNet + attention)
    python -m dmtp.tiny.build --preset micro_hybrid  # its test target
    python -m dmtp.tiny.build --evaluate --out <dir> # recompute a built target's held-out figures
    python -m dmtp.tiny.build --unpack --preset tiny # replace the cached target by the build the package ships

A build says whether it reproduced the weights the package ships (dmtp.tiny.shipped): another machine or torch
build trains other weights from the same recipe, which is why the quick start unpacks the shipped ones instead.
    DMTP_THREADS=1 python -m dmtp.tiny.build ...     # or --threads 1: the CPU threads (default: auto, dmtp.threads)

The library (and torch) is imported after the thread policy is applied: OpenMP's wait policy must be in
the environment before torch loads its runtime.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

from dmtp.cli import one_line_errors
from dmtp.threads import claim_process
from dmtp.tiny.presets import PRESETS

PROG = "dmtp.tiny.build"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny", help=" | ".join(PRESETS))
    parser.add_argument("--out", default=None, help="target directory (default: $DMTP_HOME/targets/<preset>-<hash>)")
    parser.add_argument("--force", action="store_true", help="rebuild even if a cached target exists")
    parser.add_argument("--unpack", action="store_true",
                        help="replace the cached target by the build the package ships for this preset")
    parser.add_argument("--evaluate", action="store_true",
                        help="only recompute the held-out figures of an already built target")
    parser.add_argument("--threads", default=os.environ.get("DMTP_THREADS", "auto"),
                        help="CPU threads: auto (default; dmtp.threads) or N; default from $DMTP_THREADS")
    args = parser.parse_args(argv)
    with one_line_errors(PROG):
        from dmtp.threads import apply_threads

        print(apply_threads(args.threads))
        from dmtp.tiny.shipped import compare_with_shipped, shipped_copy, unpack_shipped
        from dmtp.tiny.targets import build_tiny_target, default_target_dir, reevaluate_target

        path = Path(args.out) if args.out else default_target_dir(args.preset)
        if args.evaluate:
            print(json.dumps(reevaluate_target(path), indent=2))
            return
        if args.unpack:
            if args.out:
                raise ValueError("--unpack writes the preset's cache directory; drop --out")
            if shipped_copy(path.name) is None:
                raise ValueError(f"the package ships no build of {path.name}: build it (without --unpack)")
            if path.exists():
                shutil.rmtree(path)
            unpack_shipped(path)
            return
        if args.force or not (path / "build_report.json").exists():
            build_tiny_target(args.preset, path)
        else:
            print(f"[dmtp] {args.preset} target already built at {path}")
        print(compare_with_shipped(path))


if __name__ == "__main__":
    claim_process()
    main()
