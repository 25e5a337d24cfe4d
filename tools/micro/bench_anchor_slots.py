"""What the dual anchor costs a round: the drafter's forward over one block per request with the single anchor's
7 slots ([T1, MASK x6]) against the dual anchor's 8 ([A, T1, MASK x6], raw DFlash's [A, MASK x7] too), interleaved
in one process, the fastest of --reps kept. Everything else a round runs is the same for both (the target verifies
the same 8 rows, the MTP runs the same step), so this is the whole difference in a round's cost.

Qwen3-8B's widths by default (hidden 4096, 32 query / 8 K/V heads x 128, intermediate 12288), per drafter layer;
each request attends --context slots of context as decoding does (`CachedContext`, the block written in place).

    python tools/micro/bench_anchor_slots.py --dtype bfloat16 --batch-sizes 1 32 --threads 1
"""
from __future__ import annotations

import argparse
import time

import torch

from dmtp.bench.args import add_attention_head_args, add_machine_args, check_attention_heads, write_report
from dmtp.drafters.dflash import CachedContext, DFlashConfig, DFlashDrafter
from dmtp.models.qwen3 import KVCache

SLOTS = {"single anchor (7 slots)": 7, "dual anchor (8 slots)": 8}


def make_drafter(args, dtype, device) -> DFlashDrafter:
    config = DFlashConfig(hidden_size=args.hidden, intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                          num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, head_dim=args.head_dim,
                          vocab_size=16, num_target_layers=args.layers, target_layer_ids=list(range(args.layers)),
                          mask_token_id=0, block_size=8, max_position_embeddings=args.context + 64)
    torch.manual_seed(0)
    return DFlashDrafter(config).to(device=device, dtype=dtype).eval()


def one_batch(d: DFlashDrafter, b: int, context: int, dtype, device, reps: int) -> dict:
    c = d.config
    width = context + 8 + 1
    gen = torch.Generator(device=device).manual_seed(0)
    caches = [KVCache(b, c.num_key_value_heads, width, c.head_dim, dtype, device) for _ in range(c.num_hidden_layers)]
    for cache in caches:
        cache.k.normal_(generator=gen)
        cache.v.normal_(generator=gen)
    runs = {}
    for name, rows in SLOTS.items():
        noise = torch.randn(b, rows, c.hidden_size, generator=gen, dtype=dtype, device=device)
        first = context + 8 - rows          # the single anchor's first slot is T1, one position after A's
        positions = first + torch.arange(rows, device=device).expand(b, -1)
        limit = torch.full_like(positions, context)
        runs[name] = (lambda n=noise, p=positions, lim=limit:
                      d(n, p, CachedContext(caches, width), None, lim, torch.zeros_like(p)))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {name: [] for name in runs}
    with torch.no_grad():
        for rep in range(reps + 1):          # the first pass warms both up
            for name, run in runs.items():
                sync()
                t0 = time.perf_counter()
                run()
                sync()
                if rep:
                    times[name].append((time.perf_counter() - t0) * 1e3)
    out = {"batch": b, "context": context, **{f"{name} ms": min(t) for name, t in times.items()}}
    single, dual = (out[f"{name} ms"] for name in SLOTS)
    out["dual / single"] = dual / single
    return out


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--context", type=int, default=512, help="context slots per request")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--intermediate", type=int, default=12288)
    add_attention_head_args(ap)
    ap.add_argument("--reps", type=int, default=9)
    add_machine_args(ap, device="cpu", dtype="bfloat16", threads=0)
    args = ap.parse_args(argv)
    check_attention_heads(ap, args)
    if min(args.reps, args.layers, args.hidden, args.context, *args.batch_sizes) < 1:
        ap.error("--reps, --layers, --hidden, --context and --batch-sizes must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    drafter = make_drafter(args, dtype, device)
    rows = [one_batch(drafter, b, args.context, dtype, device, args.reps) for b in args.batch_sizes]
    for r in rows:
        print(f"batch {r['batch']:>3}, context {r['context']}: " + ", ".join(
            f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items() if k not in ("batch", "context")))
    write_report(args.out, {"rows": rows, "args": vars(args)})
    return rows


if __name__ == "__main__":
    main()
