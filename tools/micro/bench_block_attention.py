"""The training drafter's attention (every block of a row in one forward, over [context ; blocks]) forward and
backward, with blocks attended in groups of `--group-rows` rows each (`dmtp.drafters.dflash.block_groups`; 0: one
dense mask over every block's rows, as before), interleaved in one process: ms (median), the (query, key) pairs
computed, and the largest difference from the dense mask. Qwen3-8B's heads and the experiment's training shapes by
default (2 rows of 2048 tokens, 512 anchors, blocks of 16, sorted anchors as training draws them).

    python tools/micro/bench_block_attention.py --device cuda --dtype bfloat16                       # 8B shapes
    python tools/micro/bench_block_attention.py --heads 4 --kv-heads 1 --batch 1 --blocks 256        # a CPU-sized case
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


import dmtp.drafters.dflash as dflash  # noqa: E402
from dmtp.bench.args import add_attention_head_args, add_machine_args, check_attention_heads, write_report
from dmtp.drafters.dflash import attend_context_and_blocks, block_groups, dflash_attention_mask  # noqa: E402
from dmtp.models.qwen3 import additive_mask  # noqa: E402


def inputs(args, device, dtype):
    """q, block k/v, context k/v, and each query's position / anchor / block id, as `draft_blocks` makes them."""
    g = torch.Generator().manual_seed(0)
    b, n, s, c = args.batch, args.blocks, args.block, args.context
    anchors = torch.stack([torch.randperm(c - s, generator=g)[:n].sort().values for _ in range(b)]).to(device)
    rows = n * s

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(device, dtype).requires_grad_()

    q, k, v = rand(b, args.heads, rows, args.head_dim), rand(b, args.kv_heads, rows, args.head_dim), \
        rand(b, args.kv_heads, rows, args.head_dim)
    ctx_k, ctx_v = rand(b, args.kv_heads, c, args.head_dim), rand(b, args.kv_heads, c, args.head_dim)
    positions = (anchors[..., None] + torch.arange(s, device=device)).flatten(1)
    limit = anchors.repeat_interleave(s, dim=1)
    block_ids = torch.arange(n, device=device).repeat_interleave(s).expand(b, -1)
    return (q, k, v, ctx_k, ctx_v), (positions, limit, block_ids, torch.arange(c, device=device).expand(b, -1))


def one_pass(tensors, rows_info, group_rows: int, out_grad, dtype):
    """The mask (as DFlashDrafter.forward builds it) and the attention, forward and backward."""
    dflash.BLOCK_GROUP_ROWS = group_rows
    positions, limit, block_ids, ctx_pos = rows_info
    b, rows = positions.shape
    s = rows // int(block_ids[0, -1] + 1)
    groups = block_groups(rows // s, s)
    by_group = (lambda t: t.reshape(b * groups, rows // groups))
    mask = additive_mask(dflash_attention_mask(by_group(positions), ctx_pos.repeat_interleave(groups, dim=0),
                                               by_group(limit), by_group(block_ids)), dtype)
    for t in tensors:
        t.grad = None
    out = attend_context_and_blocks(*tensors, mask, groups)
    out.backward(out_grad)
    pairs = b * rows * (ctx_pos.shape[1] + rows // groups)
    return out.detach(), [t.grad for t in tensors], groups, pairs


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--group-rows", type=int, nargs="+", default=[0, 512, 1024, 2048],
                    help="rows per group of blocks (0: one dense mask)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--context", type=int, default=2048, help="sequence length: context slots")
    ap.add_argument("--blocks", type=int, default=512, help="anchors per row")
    ap.add_argument("--block", type=int, default=16, help="rows per block")
    add_attention_head_args(ap)
    ap.add_argument("--reps", type=int, default=3)
    add_machine_args(ap, device="cpu", dtype="float32", threads=0)
    args = ap.parse_args(argv)
    check_attention_heads(ap, args)
    if args.blocks + args.block > args.context:
        ap.error(f"--blocks ({args.blocks}) anchors need a --context longer than blocks + block")
    if args.reps < 1 or min(args.batch, args.blocks, args.block, args.heads, args.head_dim) < 1:
        ap.error("--reps, --batch, --blocks, --block, --heads and --head-dim must be positive")
    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    tensors, rows_info = inputs(args, device, dtype)
    out_grad = torch.randn(args.batch, args.heads, args.blocks * args.block, args.head_dim,
                           generator=torch.Generator().manual_seed(1)).to(device, dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    shipped = dflash.BLOCK_GROUP_ROWS
    times = {r: [] for r in args.group_rows}
    results = {}
    try:
        for rep in range(args.reps + 1):   # the first pass warms every setting up
            for r in args.group_rows:
                sync()
                t0 = time.perf_counter()
                results[r] = one_pass(tensors, rows_info, r, out_grad, dtype)
                sync()
                if rep:
                    times[r].append((time.perf_counter() - t0) * 1e3)
    finally:
        dflash.BLOCK_GROUP_ROWS = shipped
    dense = one_pass(tensors, rows_info, 0, out_grad, dtype) if 0 not in results else results[0]
    dflash.BLOCK_GROUP_ROWS = shipped
    print(f"training drafter attention, forward + backward: batch {args.batch} x {args.blocks} blocks of {args.block} "
          f"over {args.context} context slots, {args.heads} / {args.kv_heads} heads x {args.head_dim}, {args.dtype}, "
          f"{device}, median of {args.reps} (shipped: {shipped} rows per group)")
    print("| rows per group | groups | pairs (M) | ms | x dense | max abs diff (out, grads) |")
    print("|---|---|---|---|---|---|")
    rows = []
    base = statistics.median(times[0]) if 0 in times else None
    for r in args.group_rows:
        out, grads, groups, pairs = results[r]
        ms = statistics.median(times[r])
        diff = max([(out.float() - dense[0].float()).abs().max().item()]
                   + [(a.float() - b.float()).abs().max().item() for a, b in zip(grads, dense[1])])
        rows.append({"group_rows": r, "groups": groups, "pairs": pairs, "ms": ms, "max_abs_diff": diff})
        speed = f"x{base / ms:.2f}" if base else "-"
        print(f"| {r or 'dense'} | {groups} | {pairs / 1e6:.1f} | {ms:.1f} | {speed} | {diff:.1e} |", flush=True)
    write_report(args.out, {"args": vars(args), "results": rows})
    return rows


if __name__ == "__main__":
    main()
