"""Where a decoding round's time goes, against the memory floor, at a target's real shapes:

1. the floor: bytes of weights each stage must read once per round (target, drafter, MTP; the shared LM
   head counted where it is read) and of the KV cache at each context, divided by --bandwidth-tbs;
2. ms per round of each method (and each stage: mtp, t1_fusion or slots, drafter, verify) at every --batch-sizes x
   --contexts, with each --gqa-modes (grouped-query attention: repeat = the old copy of K/V, grouped /
   native = no copy), the modes and methods interleaved --reps times in one process, x floor beside;
3. per-kernel time of one AR step and one verify round of each drafter method (torch.profiler over
   --kernel-rounds replays of the round as decoding runs it: CUDA graphs on CUDA, eager on CPU), top
   --kernels by device time (CPU: by self CPU time).

    python tools/bench/profile_decode.py --target /dev/shm/qwen3-8b-random --methods ar,raw_dflash,dual_anchor_zero_init \
        --random-drafter-preset dflash-qwen3-8b --batch-sizes 1 32 --contexts 256 2048 8192 --gqa-modes repeat grouped
    python tools/bench/profile_decode.py --preset micro --batch-sizes 1 --contexts 64 --kernel-rounds 4   # CPU rehearsal

Random prompts (token ids below the tokenizer's vocabulary) of exactly each context length; greedy.
Random drafters: acceptance means nothing, the timings are real. The report (--out) keeps every figure.
"""
from __future__ import annotations

import argparse
import gc
import statistics

import torch


from dmtp.bench.args import add_machine_args, write_report
from dmtp.bench.random_drafters import (add_random_drafter_size_args, random_drafter, random_drafter_mask_id,
                                        random_drafter_size)
from dmtp.inference.setup import build_decoder, load_mtp, load_target, placement, target_config  # noqa: E402
from dmtp.models.qwen3 import GQA_MODES, gqa_mode, set_gqa_mode  # noqa: E402

BASELINES = ("ar", "mtp415")


# --------------------------------------------------------------------------------------------------
# the memory floor
# --------------------------------------------------------------------------------------------------

def _bytes(params) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def weight_bytes(target, drafter=None, mtp=None) -> dict:
    """Bytes each forward reads at least once: the target without its input embedding (a lookup reads B
    rows), the LM head, a drafter's / MTP's own weights plus the shared head they project through."""
    embed = target.embed_tokens.weight
    head = target.lm_head.weight
    shared = {id(embed), id(head)}
    total = _bytes(target.parameters())
    out = {"target": total, "target_no_embedding": total - (embed.numel() * embed.element_size()
                                                              if id(embed) != id(head) else 0),
           "lm_head": head.numel() * head.element_size()}
    if drafter is not None:
        own = _bytes(p for p in drafter.parameters() if id(p) not in shared)
        out["drafter_own"], out["drafter"] = own, own + out["lm_head"]
    if mtp is not None:
        own = _bytes(p for p in mtp.parameters() if id(p) not in shared)
        out["mtp_own"], out["mtp"] = own, own + out["lm_head"]
    return out


def kv_bytes(target, batch: int, context: int) -> int:
    """Bytes of K and V one forward reads over `context` committed slots of every attention layer."""
    cfg = target.config
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    types = getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers
    layers = sum(t == "full_attention" for t in types)
    return 2 * layers * heads * head_dim * context * batch * target.embed_tokens.weight.element_size()


def floor_ms(nbytes: float, tbs: float) -> float:
    return nbytes / (tbs * 1e12) * 1e3


def floor_table(wb: dict, target, batches, contexts, tbs: float) -> str:
    lines = [f"memory floor at {tbs:g} TB/s (weights read once per forward; KV at each context):",
             f"  target {wb['target'] / 1e9:.2f} GB -> {floor_ms(wb['target'], tbs):.2f} ms "
             f"({floor_ms(wb['target_no_embedding'], tbs):.2f} ms without the input embedding); "
             f"lm_head {wb['lm_head'] / 1e9:.2f} GB"]
    if "drafter" in wb:
        lines.append(f"  drafter {wb['drafter_own'] / 1e9:.3f} GB own + lm_head -> {floor_ms(wb['drafter'], tbs):.2f} ms")
    if "mtp" in wb:
        lines.append(f"  MTP {wb['mtp_own'] / 1e9:.3f} GB own + lm_head -> {floor_ms(wb['mtp'], tbs):.2f} ms per step")
    for b in batches:
        for c in contexts:
            kv = kv_bytes(target, b, c)
            lines.append(f"  batch {b}, context {c}: KV {kv / 1e9:.2f} GB -> AR step floor "
                         f"{floor_ms(wb['target_no_embedding'] + kv, tbs):.2f} ms")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# timing and kernels
# --------------------------------------------------------------------------------------------------

def random_prompts(batch: int, context: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(5, vocab, (batch, context), generator=gen).tolist()


def _free(device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


class _Annotate:
    """A stage 'timer' that names each stage in the profiler trace (record_function)."""

    @staticmethod
    def stage(name: str):
        return torch.profiler.record_function(f"stage:{name}")


def kernel_table(prof, rounds: int, top: int, cuda: bool) -> tuple[str, list[dict]]:
    """Top `top` kernels (CUDA) / ops (CPU) by time per round, and their share of the total."""
    rows = []
    for evt in prof.key_averages():
        if evt.key.startswith("stage:") or evt.key.startswith("ProfilerStep"):
            continue
        if cuda:
            us = getattr(evt, "self_device_time_total", None)
            if us is None:
                us = getattr(evt, "self_cuda_time_total", 0)
        else:
            us = evt.self_cpu_time_total
        if us > 0:
            rows.append({"name": evt.key, "calls_per_round": evt.count / rounds, "us_per_round": us / rounds})
    rows.sort(key=lambda r: -r["us_per_round"])
    total = sum(r["us_per_round"] for r in rows) or 1.0
    lines = [f"| kernel ({'device' if cuda else 'self CPU'} time) | calls/round | us/round | share |", "|---|---|---|---|"]
    for r in rows[:top]:
        r["share"] = r["us_per_round"] / total
        lines.append(f"| {r['name'][:90]} | {r['calls_per_round']:.1f} | {r['us_per_round']:.1f} | {100 * r['share']:.1f}% |")
    lines.append(f"| total ({len(rows)} kinds) | | {total:.1f} | 100% |")
    return "\n".join(lines), rows[:top] + [{"name": "total", "us_per_round": total}]


def profile_kernels(dec, prompts, new_tokens: int, rounds: int, top: int, device) -> tuple[str, list[dict]]:
    """Decode once (captures graphs on CUDA), then profile `rounds` more rounds of that batch."""
    from torch.profiler import ProfilerActivity, profile

    dec.generate(prompts, max_new_tokens=new_tokens, batch_size=len(prompts))
    run_round = dec.round_fn(_Annotate())
    run_round()
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        for _ in range(rounds):
            run_round()
        if cuda:
            torch.cuda.synchronize()
    return kernel_table(prof, rounds, top, cuda)


def time_config(make_decoder, prompts, new_tokens: int) -> dict:
    """ms per round of every stage (the loop's own timer: CUDA events with graphs, host clocks eager)."""
    dec = make_decoder()
    res = dec.generate(prompts, max_new_tokens=new_tokens, batch_size=len(prompts))
    s = res.summary()
    out = {k: round(v, 4) for k, v in s["stage_ms_per_round"].items()}
    out["tau"] = s["tau_per_request"]
    out["graphs"] = dec.use_graphs
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None, help="target checkpoint dir (default: the embedded --preset)")
    ap.add_argument("--preset", default="micro")
    ap.add_argument("--methods", default="ar,raw_dflash,dual_anchor_zero_init",
                    help="ar, mtp415 and injection variants (random drafters), comma-separated")
    add_random_drafter_size_args(ap)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1])
    ap.add_argument("--contexts", type=int, nargs="+", default=[256], help="prompt lengths (tokens)")
    ap.add_argument("--new-tokens", type=int, default=32, help="tokens decoded per timing (rounds: at least this / tau)")
    ap.add_argument("--gqa-modes", nargs="+", default=["auto"], choices=GQA_MODES,
                    help="grouped-query attention modes to compare (repeat = the old K/V copy)")
    ap.add_argument("--reps", type=int, default=1, help="interleaved repetitions (medians)")
    ap.add_argument("--kernels", type=int, default=25, help="top kernels to list (0: no kernel profile)")
    ap.add_argument("--kernel-rounds", type=int, default=8, help="rounds profiled per method")
    ap.add_argument("--bandwidth-tbs", type=float, default=4.8, help="memory bandwidth for the floor (H200: 4.8)")
    ap.add_argument("--no-cuda-graphs", action="store_true")
    add_machine_args(ap, threads=0, seed=True)
    args = ap.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    if not methods:
        ap.error("--methods is empty")
    for name, values in (("--batch-sizes", args.batch_sizes), ("--contexts", args.contexts)):
        if min(values) < 1:
            ap.error(f"{name} must be positive, got {values}")
    if args.reps < 1 or args.new_tokens < 2 or args.kernel_rounds < 1 or args.bandwidth_tbs <= 0:
        ap.error("--reps and --kernel-rounds must be >= 1, --new-tokens >= 2, --bandwidth-tbs > 0")
    if args.threads:
        torch.set_num_threads(args.threads)
    from dmtp.injection import VARIANTS

    unknown = [m for m in methods if m not in BASELINES and m not in VARIANTS]
    if unknown:
        ap.error(f"unknown method {unknown[0]!r}: ar, mtp415 or one of {', '.join(VARIANTS)}")

    device, dtype = placement(args.device, args.dtype)
    if device.type == "cuda" and args.kernels:
        try:   # CUPTI set up before any capture, so the profiler sees the kernels replayed inside graphs (gpt-fast does this)
            from torch.profiler._utils import _init_for_cuda_graphs

            _init_for_cuda_graphs()
        except Exception as e:  # pragma: no cover - private API, GPU only
            print(f"note: torch.profiler._utils._init_for_cuda_graphs unavailable ({e}); kernels in graphs may not show")
    loaded = load_target(target_config(args.target, args.preset), device, dtype)
    target, tok, eos = loaded.model, loaded.tokenizer, loaded.eos_token_id
    mtp = load_mtp(loaded)
    size = random_drafter_size(args, ap, target.config.num_hidden_layers)
    mask_id = random_drafter_mask_id(tok, target)
    drafters = {m: random_drafter(target, m, mask_id, device, dtype, size=size)[0] for m in methods if m not in BASELINES}
    graphs = not args.no_cuda_graphs
    vocab = min(len(tok), target.config.vocab_size)

    def maker(method):
        if method in BASELINES:
            return lambda: build_decoder(target, method, eos, mtp=mtp, cuda_graphs=graphs)
        return lambda: build_decoder(target, "drafter", eos, mtp=mtp, drafter=drafters[method], name=method,
                                     cuda_graphs=graphs)

    wb = weight_bytes(target, next(iter(drafters.values()), None), mtp)
    print(f"profile_decode: {loaded.path} ({device}, {str(dtype).replace('torch.', '')}, graphs "
          f"{graphs and device.type == 'cuda'}), random drafters {size}; random weights: timings only")
    print(floor_table(wb, target, args.batch_sizes, args.contexts, args.bandwidth_tbs))

    # ms per round: every (mode, batch, context, method), interleaved over reps; one decoder at a time
    # (each owns caches of batch x context: at 8B shapes, 8k x 32 is ~40 GB).
    timings: dict[tuple, list[dict]] = {}
    before = set_gqa_mode("auto")
    try:
        for _ in range(args.reps):
            for b in args.batch_sizes:
                for c in args.contexts:
                    prompts = random_prompts(b, c, vocab, args.seed)
                    for mode in args.gqa_modes:
                        set_gqa_mode(mode)   # read when attention runs: eagerly, or when graphs are captured
                        for m in methods:
                            timings.setdefault((mode, b, c, m), []).append(time_config(maker(m), prompts, args.new_tokens))
                            _free(device)
    finally:
        set_gqa_mode(before)   # the kernel profile below runs in the process's mode (auto: no copy of K/V)
    rows = []
    for (mode, b, c, m), reps in timings.items():
        keys = [k for k in reps[0] if k not in ("tau", "graphs")]
        med = {k: statistics.median(r.get(k, 0.0) for r in reps) for k in keys}
        ar = timings.get((mode, b, c, "ar"))
        ar_round = statistics.median(r["round"] for r in ar) if ar else None
        step_floor = floor_ms(wb["target_no_embedding"] + kv_bytes(target, b, c), args.bandwidth_tbs)
        rows.append({"gqa": mode, "batch": b, "context": c, "method": m, **{f"{k}_ms": v for k, v in med.items()},
                     "x_ar_step": med["round"] / ar_round if ar_round else None, "x_floor": med["round"] / step_floor,
                     "verify_x_ar_step": med.get("verify", 0) / ar_round if ar_round and m != "ar" else None,
                     "drafter_x_floor": (med["drafter"] / floor_ms(wb["drafter"], args.bandwidth_tbs)
                                         if med.get("drafter") and "drafter" in wb else None),
                     "tau": reps[0]["tau"]})
    print(f"\nms per round (median of {args.reps}), x AR step of the same mode/batch/context, x the AR step's floor, "
          "the drafter stage x the drafter's floor (its weights + the LM head; batch and context add K/V reads):")
    print("| gqa | batch | context | method | round ms | verify ms | drafter ms | mtp ms | x AR step | verify x AR | x floor "
          "| drafter x its floor |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    fmt = lambda v, f=".2f": "-" if v is None else format(v, f)  # noqa: E731
    for r in rows:
        print(f"| {r['gqa']} | {r['batch']} | {r['context']} | {r['method']} | {fmt(r['round_ms'])} | "
              f"{fmt(r.get('verify_ms'))} | {fmt(r.get('drafter_ms'))} | {fmt(r.get('mtp_ms'))} | {fmt(r['x_ar_step'])} | "
              f"{fmt(r['verify_x_ar_step'])} | {fmt(r['x_floor'])} | {fmt(r['drafter_x_floor'])} |")
    by_batch = {}
    for r in rows:
        if r["method"] == "ar":
            by_batch.setdefault((r["gqa"], r["context"]), {})[r["batch"]] = r["round_ms"]
    for (mode, c), per in by_batch.items():
        if len(per) > 1:
            b0 = min(per)
            print(f"AR round vs batch {b0} ({mode}, context {c}): "
                  + ", ".join(f"batch {b} x{per[b] / per[b0]:.2f}" for b in sorted(per)))

    kernels = {}
    if args.kernels:
        b, c = args.batch_sizes[0], args.contexts[0]
        prompts = random_prompts(b, c, vocab, args.seed)
        for m in methods:
            if m == "mtp415":
                continue
            what = "one AR step" if m == "ar" else f"one {m} round (MTP, drafter, verify)"
            table, top = profile_kernels(maker(m)(), prompts, args.new_tokens, args.kernel_rounds, args.kernels, device)
            print(f"\nkernels of {what}, batch {b}, context {c}, gqa {gqa_mode(device)}:\n{table}")
            kernels[m] = top
            _free(device)
    report = {"target": loaded.path, "device": str(device), "dtype": str(dtype), "graphs": graphs and device.type == "cuda",
              "random_drafter_size": size, "bandwidth_tbs": args.bandwidth_tbs, "weight_bytes": wb,
              "floor_ms": {k: floor_ms(v, args.bandwidth_tbs) for k, v in wb.items()}, "rows": rows,
              "kernels": kernels, "note": "random weights: acceptance means nothing, timings are real"}
    write_report(args.out, report)
    return report


if __name__ == "__main__":
    main()
