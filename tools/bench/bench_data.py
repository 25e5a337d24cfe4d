"""Data at scale, measured: regeneration shared out over workers, feature capture, cache-fed training.

    python tools/bench/bench_data.py [--preset micro|tiny] [--prompts 256] [--steps 20] [--out bench_data.json]
    python tools/bench/bench_data.py --target DIR --device cuda --skip-regen [--rows 16 --seq-len 2048 --batch 2]
        # a real-shape target (dmtp.tiny.random_target): capture and cache-fed training at its shapes, bf16-mixed
        # with the experiments' drafter (5 layers, 5 taps, 512 anchors); tools/env/gpu_check.sh's realsize_train runs it

1. regeneration: the target's greedy responses to `--prompts` prompts (`--new-tokens` each, batches of 64) written
   by 1 worker process, then by 2 worker processes at once (dmtp.datagen.regenerate.write_share, each its own
   shards): tokens/s per worker and for the whole cache (tokens / the slowest worker's wall time).
2. capture: the feature cache of `--rows` packed rows of the embedded corpora (`--seq-len` tokens; the drafter's
   taps + the MTP hidden + greedy labels) in bf16 and fp8: bytes/s and rows/s of one worker.
3. training: steps/s of the same trainer fed by the target's forward (online) and by the bf16 cache, on the same
   rows, interleaved step by step; a step is the loader's batch (the cache's reads, checks and decoding included)
   + the loss + backward + the optimizer.

Every figure is wall time on this machine, shared with whatever else runs on it: the JSON records the load.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from dmtp.bench.args import add_machine_args, write_report

ROOT = Path(__file__).resolve().parents[2]


def _prompts(preset: str, n: int, length: int) -> tuple[str, list[list[int]]]:
    from dmtp.data.prompts import held_out_prompts
    from dmtp.models.target import load_tokenizer
    from dmtp.tiny.targets import ensure_tiny_target

    path = str(ensure_tiny_target(preset, progress=False))
    tok = load_tokenizer(path)
    return path, held_out_prompts(tok, "code", "train", n // 2, length) + held_out_prompts(tok, "math", "train",
                                                                                          n - n // 2, length)


def regen_worker(args) -> None:
    """One worker process (internal): its share of the cache, then {tokens, seconds} as a JSON line."""
    from dmtp.models.target import TargetModel
    from dmtp.datagen.regenerate import RegenSettings, write_share
    from dmtp.datagen.shards import Share

    path, prompts = _prompts(args.preset, args.prompts, 64)
    target = TargetModel.from_pretrained(path)
    settings = RegenSettings(new_tokens=args.new_tokens, batch_size=64, shard_size=max(1, args.prompts // 8))
    report = write_share(target, prompts, settings, Share(args.workers, args.regen_worker), cache_root=args.root,
                         progress=False)
    print(json.dumps({"tokens": report.tokens, "seconds": report.seconds, "shards": len(report.decoded)}))


def bench_regen(args) -> dict:
    out = {}
    for workers in (1, 2):
        root = tempfile.mkdtemp(prefix=f"bench-regen-{workers}-")
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        started = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, __file__, "--preset", args.preset, "--prompts", str(args.prompts),
                                   "--new-tokens", str(args.new_tokens), "--workers", str(workers),
                                   "--regen-worker", str(i), "--root", root], stdout=subprocess.PIPE, text=True,
                                  env=env) for i in range(workers)]
        reports = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
        wall = time.perf_counter() - started
        per_worker = [r["tokens"] / r["seconds"] for r in reports]
        out[f"{workers}_workers"] = {"tok_s_per_worker": per_worker,
                                     "tok_s_cache": sum(r["tokens"] for r in reports) / max(r["seconds"] for r in reports),
                                     "tokens": sum(r["tokens"] for r in reports), "wall_s_with_startup": wall}
    return out


def _options(args, home: Path) -> list[str]:
    target = [f"target={args.preset}"] if not args.target else [
        "target=local", f"target.path={args.target}", f"target.dtype={'bfloat16' if args.device == 'cuda' else 'float32'}",
        "drafter.num_layers=5", "drafter.num_target_features=5", "model.num_anchors=512"]
    device = ["trainer=gpu", "trainer.devices=1"] if args.device == "cuda" else []
    return target + device + ["data=embedded", f"data.max_examples={args.rows}", f"data.seq_len={args.seq_len}",
            "data.val_domains=[]", "logger=none", "callbacks=none", "trainer.max_steps=1000",
            f"data.batch_size={args.batch}", "data.feature_shard_rows=32", f"paths.output_dir={home / 'run'}"]


def bench_capture(args, home: Path) -> dict:
    from dmtp.configs import compose_config
    from dmtp.training.prepare import prepare

    out = {}
    for codec in ("bf16", "fp8"):
        done = prepare(compose_config("prepare", ["step=capture", f"data.feature_codec={codec}", *_options(args, home)],
                                      output_dir=home / f"capture-{codec}"))["capture"][0]
        out[codec] = {"bytes": done.bytes_written, "seconds": done.seconds, "MB_s": done.bytes_written / done.seconds / 1e6,
                      "tokens_s": done.tokens / done.seconds, "bytes_per_token": done.bytes_written / done.tokens,
                      "shards": len(done.captured)}
    return out


def bench_training(args, home: Path) -> dict:
    from dmtp.configs import compose_train
    from dmtp.training.draws import RowDraws
    from dmtp.training.components import build_components

    runs = {}
    for name, extra in (("online", []), ("cache_bf16", ["data.features=true", "data.feature_codec=bf16"])):
        torch.manual_seed(0)
        _, _, data, module = build_components(compose_train(_options(args, home) + extra, tiny=False))
        data.setup()
        module.train().to(args.device)
        loader = iter(_loader(data))
        optimizer = torch.optim.AdamW([p for p in module.drafter.parameters() if p.requires_grad], lr=1e-4)
        runs[name] = (module, loader, optimizer)
    times = {name: [] for name in runs}
    for step in range(args.steps + 3):
        for name, (module, loader, optimizer) in runs.items():
            started = _now()
            batch = _to(next(loader), args.device)
            with torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.device == "cuda"):
                loss, _, _ = module(batch["input_ids"], batch["loss_mask"], RowDraws(0, step, batch["index"]), step,
                                    batch.get("features"))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if step >= 3:
                times[name].append(_now() - started)
        if step == 0 and args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
    med = {name: statistics.median(t) for name, t in times.items()}
    return {name: {"ms_per_step": 1000 * m, "steps_s": 1 / m} for name, m in med.items()} | {
        "speedup": med["online"] / med["cache_bf16"]}


def _now() -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


def _to(batch, device):
    if isinstance(batch, dict):
        return {k: _to(v, device) for k, v in batch.items()}
    return batch.to(device) if isinstance(batch, torch.Tensor) else batch


def _loader(data):
    while True:
        yield from data.train_dataloader()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="micro")
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--rows", type=int, default=400, help="documents packed into training rows (captured, trained)")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--target", default=None, help="a target directory (real shapes) instead of --preset")
    add_machine_args(ap, device="cpu", dtype=None, threads=None)
    ap.add_argument("--skip-regen", action="store_true")
    ap.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--regen-worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--root", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.regen_worker is not None:
        regen_worker(args)
        return
    from dmtp.paths import targets_dir

    home = Path(tempfile.mkdtemp(prefix="bench-data-"))   # caches of its own; the built targets are shared
    (home / "targets").symlink_to(targets_dir(), target_is_directory=True)
    os.environ["DMTP_HOME"] = str(home)
    result = {"preset": args.target or args.preset, "device": args.device, "load_before": os.getloadavg(),
              "regen": None if args.skip_regen else bench_regen(args),
              "capture": bench_capture(args, home), "training": bench_training(args, home),
              "load_after": os.getloadavg(), "torch_threads": torch.get_num_threads()}
    print(json.dumps(result, indent=2))
    write_report(args.out, result)


if __name__ == "__main__":
    main()
