"""The drafter's forward over one block per request as decoding runs it, with its context K/V reached two ways,
interleaved in one process:

  concat  each layer copies its cache's attended slots in front of the block's K/V (`torch.cat`: decoding's
          path before `CachedContext`, still training's layout, through the same `DFlashDrafter.forward`);
  cached  each layer writes the block's K/V into its own cache at the block's positions and attends the
          cache in place (`CachedContext`, what `DrafterState.draft` passes).

Per case: bytes allocated by one forward (CPU: the sum of torch.profiler's allocation events; CUDA: the
allocator's cumulative counter), the bytes of one copy of the attended K/V (every layer, K and V) for scale,
ms (median of interleaved repetitions) and the largest difference of the block's hidden states. Qwen3-8B's
published drafter by default (5 layers, 32 query / 8 K/V heads x 128, block 16), with a small hidden size so
that a CPU holds and runs it: the bytes that grow with the context are all K/V, whatever the hidden size.
Every request's context is --contexts long; the forward attends the loop's span (context + block + 1 slots).

    python tools/micro/bench_drafter_kv.py --threads 1                     # CPU, fp32, batch 8 x 1024 slots
    python tools/micro/bench_drafter_kv.py --device cuda --dtype bfloat16 --hidden 4096 --batch-sizes 1 32 --contexts 2048 8192
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile


from dmtp.bench.args import add_attention_head_args, add_machine_args, check_attention_heads, write_report
from dmtp.drafters.dflash import CachedContext, DFlashConfig, DFlashDrafter  # noqa: E402
from dmtp.models.qwen3 import KVCache  # noqa: E402

PATHS = ("concat", "cached")


def make_drafter(args, dtype, device) -> DFlashDrafter:
    config = DFlashConfig(hidden_size=args.hidden, intermediate_size=2 * args.hidden, num_hidden_layers=args.layers,
                          num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, head_dim=args.head_dim,
                          vocab_size=16, num_target_layers=args.layers, target_layer_ids=list(range(args.layers)),
                          mask_token_id=0, block_size=args.block, max_position_embeddings=max(args.contexts) + 64)
    torch.manual_seed(0)
    return DFlashDrafter(config).to(device=device, dtype=dtype).eval()


def allocated_bytes(fn, device) -> int:
    """Bytes allocated (not net of frees) while `fn` runs."""
    if device.type == "cuda":
        key = "allocated_bytes.all.allocated"
        torch.cuda.synchronize()
        before = torch.cuda.memory_stats(device)[key]
        fn()
        torch.cuda.synchronize()
        return torch.cuda.memory_stats(device)[key] - before
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return sum(e.nbytes() for e in prof.profiler.kineto_results.events() if e.name() == "[memory]" and e.nbytes() > 0)


def one_case(d: DFlashDrafter, b: int, context: int, dtype, device, reps: int) -> dict:
    c = d.config
    block = c.block_size
    width = context + block + 1                          # the loop's span: longest length + block width + 1
    gen = torch.Generator(device=device).manual_seed(0)
    caches = [KVCache(b, c.num_key_value_heads, width, c.head_dim, dtype, device) for _ in range(c.num_hidden_layers)]
    for cache in caches:
        cache.k.normal_(generator=gen)
        cache.v.normal_(generator=gen)
    noise = torch.randn(b, block, c.hidden_size, generator=gen, dtype=dtype, device=device)
    positions = context + torch.arange(block, device=device).expand(b, -1)   # raw DFlash's slots: A at the context's end
    limit = torch.full_like(positions, context)
    block_ids = torch.zeros_like(positions)
    ctx_positions = torch.arange(width, device=device).expand(b, -1)
    ctx_kv = [(cache.k[:, :, :width], cache.v[:, :, :width]) for cache in caches]   # views, as the old proposer's
    runs = {"concat": lambda: d(noise, positions, ctx_kv, ctx_positions, limit, block_ids),
            "cached": lambda: d(noise, positions, CachedContext(caches, width), None, limit, block_ids)}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = {p: [] for p in PATHS}
    outs = {}
    with torch.no_grad():
        for rep in range(reps + 1):   # the first pass warms both paths up (RoPE tables, kernel selection)
            for p in PATHS:
                sync()
                t0 = time.perf_counter()
                outs[p] = runs[p]()
                sync()
                if rep:
                    times[p].append((time.perf_counter() - t0) * 1e3)
        alloc = {p: allocated_bytes(runs[p], device) for p in PATHS}
    kv_copy = 2 * c.num_hidden_layers * b * c.num_key_value_heads * width * c.head_dim * noise.element_size()
    return {"batch": b, "context": context, "slots": width, "kv_copy_bytes": kv_copy,
            **{f"{p}_alloc_bytes": alloc[p] for p in PATHS}, **{f"{p}_ms": statistics.median(times[p]) for p in PATHS},
            "max_abs_diff": (outs["concat"].float() - outs["cached"].float()).abs().max().item()}


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[8])
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024], help="context slots per request (the anchor)")
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=256, help="Qwen3-8B's is 4096; K/V bytes do not depend on it")
    add_attention_head_args(ap)
    ap.add_argument("--reps", type=int, default=5)
    add_machine_args(ap, device="cpu", dtype="float32", threads=0)
    args = ap.parse_args(argv)
    check_attention_heads(ap, args)
    if min(args.reps, args.layers, args.hidden, *args.batch_sizes, *args.contexts) < 1:
        ap.error("--reps, --layers, --hidden, --batch-sizes and --contexts must be positive")
    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    d = make_drafter(args, dtype, device)
    print(f"drafter forward, one block per request: {args.layers} layers, {args.heads} / {args.kv_heads} heads x "
          f"{args.head_dim}, hidden {args.hidden}, block {args.block}, {args.dtype}, {device}, "
          f"{torch.get_num_threads()} threads, median of {args.reps}")
    print("| batch | context | one K/V copy MB | concat MB alloc | cached MB alloc | concat / cached | concat ms | "
          "cached ms | concat / cached | max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for b in args.batch_sizes:
        for context in args.contexts:
            r = one_case(d, b, context, dtype, device, args.reps)
            rows.append(r)
            mb = {k: r[k] / 2 ** 20 for k in ("kv_copy_bytes", "concat_alloc_bytes", "cached_alloc_bytes")}
            print(f"| {b} | {context} | {mb['kv_copy_bytes']:.1f} | {mb['concat_alloc_bytes']:.1f} | "
                  f"{mb['cached_alloc_bytes']:.1f} | x{r['concat_alloc_bytes'] / r['cached_alloc_bytes']:.1f} | "
                  f"{r['concat_ms']:.2f} | {r['cached_ms']:.2f} | x{r['concat_ms'] / r['cached_ms']:.2f} | "
                  f"{r['max_abs_diff']:.1e} |", flush=True)
    write_report(args.out, rows)
    return rows


if __name__ == "__main__":
    main()
