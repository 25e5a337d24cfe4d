"""Thread policy benchmark: training steps/s of the embedded target's architecture at each preset's size
(random weights; the target build's step: target + MTP joint loss, backward, AdamW), at 1 vs 2 threads,
with and without OMP_WAIT_POLICY=PASSIVE, on an idle machine and with one core kept busy by a busy-loop
process. Each configuration runs in a fresh subprocess (OpenMP reads its settings once, when torch
loads), for a few seconds, interleaved over rounds (a drift in the machine's state spreads over all).

    python tools/bench/bench_threads.py                                  # micro and tiny, 3 rounds of 4 s each
    python tools/bench/bench_threads.py --presets micro --rounds 1 --seconds 2 --json out.json

Prints a table (median steps/s over rounds per configuration, and busy / idle) and writes JSON. The rule
of `threads=auto` (dmtp/threads.py) is set from these figures; they mean something only on a machine that
is otherwise idle (the load average is recorded with them).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUSY_LOOP = "while True:\n    pass\n"   # one core kept busy, as another process would


def child(preset_name: str, seconds: float) -> dict:
    """One configuration (threads and wait policy come from the environment): steps/s of a training step."""
    import torch

    from dmtp.tiny.architectures import build_model
    from dmtp.tiny.presets import PRESETS
    from dmtp.tiny.pretrain import joint_losses

    preset = PRESETS[preset_name]
    torch.manual_seed(0)
    model, mtp = build_model(preset, preset.vocab_size, eos_id=0)
    params = [p for p in list(model.parameters()) + list(mtp.parameters()) if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3)
    ids = torch.randint(0, preset.vocab_size, (preset.batch_size, preset.seq_len))
    model.train(), mtp.train()

    def step():
        main, side = joint_losses(model, mtp, ids)
        opt.zero_grad(set_to_none=True)
        (main + preset.mtp_loss_weight * side).backward()
        opt.step()

    for _ in range(2):   # warm-up: allocator, OpenMP team
        step()
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        steps += 1
    elapsed = time.perf_counter() - start
    return {"steps": steps, "seconds": elapsed, "steps_per_s": steps / elapsed, "threads": torch.get_num_threads()}


def run_one(preset: str, threads: int, wait: str, load: str, seconds: float) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "DMTP_THREADS")}
    env["OMP_NUM_THREADS"] = str(threads)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    if wait == "PASSIVE":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    busy = subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) if load == "busy" else None
    try:
        done = subprocess.run([sys.executable, __file__, "--child", preset, "--seconds", str(seconds)], env=env,
                              capture_output=True, text=True, timeout=600)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    if done.returncode != 0:
        raise SystemExit(f"bench_threads: the {preset} child failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["micro", "tiny"])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0, help="timed seconds per configuration and round")
    parser.add_argument("--json", default="bench_threads.json")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.seconds)))
        return

    configs = list(itertools.product(args.presets, args.threads, ["default", "PASSIVE"], ["idle", "busy"]))
    load_before = os.getloadavg()
    runs: dict[tuple, list[float]] = {c: [] for c in configs}
    for r in range(args.rounds):
        order = configs[r % len(configs):] + configs[:r % len(configs)]   # rotate: no config always first
        for config in order:
            result = run_one(*config, seconds=args.seconds)
            runs[config].append(result["steps_per_s"])
            print(f"round {r + 1}/{args.rounds} {config}: {result['steps_per_s']:.2f} steps/s", file=sys.stderr)

    rows = []
    for preset, threads, wait, load in configs:
        median = statistics.median(runs[(preset, threads, wait, load)])
        rows.append({"preset": preset, "threads": threads, "wait_policy": wait, "load": load,
                     "steps_per_s": median, "all": runs[(preset, threads, wait, load)]})
    idle = {(r["preset"], r["threads"], r["wait_policy"]): r["steps_per_s"] for r in rows if r["load"] == "idle"}
    print(f"{'preset':8} {'threads':>7} {'wait policy':>12} {'idle':>8} {'1 busy':>8} {'busy/idle':>9}")
    for r in rows:
        if r["load"] == "busy":
            base = idle[(r["preset"], r["threads"], r["wait_policy"])]
            print(f"{r['preset']:8} {r['threads']:>7} {r['wait_policy']:>12} {base:>8.2f} {r['steps_per_s']:>8.2f} "
                  f"{r['steps_per_s'] / base:>9.2f}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    report = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "commit": commit.strip(),
              "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                          "load_average_before": load_before, "load_average_after": os.getloadavg()},
              "rounds": args.rounds, "seconds": args.seconds, "rows": rows}
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(f"[dmtp] written to {args.json}")


if __name__ == "__main__":
    main()
