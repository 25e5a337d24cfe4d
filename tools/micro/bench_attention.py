"""One attention call as the decoding loop makes it (verify rows over a static cache, additive mask), under each
grouped-query mode of `dmtp.models.qwen3.attend`, interleaved in one process: ms (median) and the largest
difference from `repeat` (the old K/V copy). Qwen3-8B's attention shapes by default (32 query / 8 K/V heads x 128).

    python tools/micro/bench_attention.py                                   # CPU, fp32
    python tools/micro/bench_attention.py --device cuda --dtype bfloat16 --batch-sizes 1 32 --slots 256 8192
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


from dmtp.bench.args import add_attention_head_args, add_machine_args, check_attention_heads, write_report
from dmtp.models.qwen3 import additive_mask, attend, set_gqa_mode  # noqa: E402

MODES = ("repeat", "grouped", "native")


def one_case(b: int, rows: int, slots: int, heads: int, kv_heads: int, head_dim: int, dtype, device, reps: int) -> dict:
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(b, heads, rows, head_dim, generator=gen, dtype=dtype, device=device)
    k = torch.randn(b, kv_heads, slots, head_dim, generator=gen, dtype=dtype, device=device)
    v = torch.randn(b, kv_heads, slots, head_dim, generator=gen, dtype=dtype, device=device)
    pos = torch.full((b, 1), max(0, slots - rows - 3), device=device) + torch.arange(rows, device=device)
    mask = additive_mask((torch.arange(slots, device=device)[None, None] <= pos[:, :, None])[:, None], dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = {m: [] for m in MODES}
    outs = {}
    for rep in range(reps + 1):   # the first pass warms every mode up (kernel selection, allocator)
        for m in MODES:
            set_gqa_mode(m)
            sync()
            t0 = time.perf_counter()
            outs[m] = attend(q, k, v, mask)
            sync()
            if rep:
                times[m].append((time.perf_counter() - t0) * 1e3)
    diff = max((outs[m].float() - outs["repeat"].float()).abs().max().item() for m in MODES)
    return {"batch": b, "rows": rows, "slots": slots, **{f"{m}_ms": statistics.median(times[m]) for m in MODES},
            "max_abs_diff": diff}


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16], help="query rows per request (1: AR, 16: a verify)")
    ap.add_argument("--slots", type=int, nargs="+", default=[256, 2048], help="cache slots attended")
    add_attention_head_args(ap)
    ap.add_argument("--reps", type=int, default=7)
    add_machine_args(ap, device="cpu", dtype="float32", threads=0)
    args = ap.parse_args(argv)
    check_attention_heads(ap, args)
    if args.kv_heads >= args.heads:   # the grouped path is what it times
        ap.error(f"--heads ({args.heads}) must be larger than --kv-heads ({args.kv_heads})")
    if args.reps < 1 or min(args.batch_sizes + args.rows + args.slots) < 1:
        ap.error("--reps, --batch-sizes, --rows and --slots must be positive")
    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    print(f"attention A/B: {args.heads} / {args.kv_heads} heads x {args.head_dim}, {args.dtype}, {device}, "
          f"median of {args.reps}")
    print("| batch | rows | slots | repeat ms | grouped ms | native ms | repeat / grouped | repeat / native | max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = []
    before = set_gqa_mode("auto")
    try:
        for b in args.batch_sizes:
            for s in args.slots:
                for r in args.rows:
                    c = one_case(b, r, s, args.heads, args.kv_heads, args.head_dim, dtype, device, args.reps)
                    rows.append(c)
                    print(f"| {b} | {r} | {s} | {c['repeat_ms']:.3f} | {c['grouped_ms']:.3f} | {c['native_ms']:.3f} | "
                          f"x{c['repeat_ms'] / c['grouped_ms']:.2f} | x{c['repeat_ms'] / c['native_ms']:.2f} | "
                          f"{c['max_abs_diff']:.1e} |", flush=True)
    finally:
        set_gqa_mode(before)
    write_report(args.out, rows)
    return rows


if __name__ == "__main__":
    main()
