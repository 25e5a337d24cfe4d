"""Training step time per injection variant, relative to raw_dflash, on one fixed batch.

    python tools/bench/bench_train.py [--target tiny|micro] [--steps 10] [--batch 8] [--seq-len 256]

Every variant runs the same batch, anchors and drafter depth in one process, interleaved by round
so that machine noise hits all of them alike; the table reports median ms per optimizer step.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from dmtp.injection import VARIANTS
from dmtp.training.components import build_components
from dmtp.configs import compose_train


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="tiny")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--anchors", type=int, default=32)
    ap.add_argument("--drafter", default="dflash")
    args = ap.parse_args()
    torch.manual_seed(0)
    modules, batch = {}, None
    for name in VARIANTS:
        cfg = compose_train([f"injection={name}", f"target={args.target}", f"drafter={args.drafter}",
                             f"model.num_anchors={args.anchors}"], tiny=False)
        _, tok, _, module = build_components(cfg)
        modules[name] = module
        if batch is None:
            batch = torch.randint(10, tok.vocab_size - 10, (args.batch, args.seq_len))
    mask = torch.ones_like(batch)
    times = {n: [] for n in modules}
    for step in range(args.steps + 2):
        for name, module in modules.items():
            params = list(module.drafter.parameters())
            start = time.perf_counter()
            loss, _, _ = module.block_loss(batch, mask, generator=torch.Generator().manual_seed(step))
            loss.backward()
            for p in params:
                p.grad = None
            if step >= 2:
                times[name].append(1000 * (time.perf_counter() - start))
    base = statistics.median(times["raw_dflash"])
    print(f"| variant | ms / step (median of {args.steps}) | vs raw_dflash |")
    print("|---|---|---|")
    for name, t in times.items():
        med = statistics.median(t)
        print(f"| {name} | {med:.1f} | {med / base:.3f}x |")
    print(f"\n(target={args.target}, drafter={args.drafter}, batch={args.batch}x{args.seq_len}, "
          f"anchors={args.anchors}, threads={torch.get_num_threads()})")


if __name__ == "__main__":
    main()
