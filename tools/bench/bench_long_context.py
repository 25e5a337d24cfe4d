"""A decoding round's cost against context length, the drafter's and the verify's apart (issue 41, item 3):
a drafter whose layers attend every context row against the same drafter with sliding-window layers, which
decodes from a ring bounded by its window (dmtp/drafters/window_cache.py), beside target-only AR.

    OMP_NUM_THREADS=1 python tools/bench/bench_long_context.py --drafter <run>/drafter --window 64 \
        --contexts 256 1024 4096 16384 32768 --batch-sizes 1
    python tools/bench/bench_long_context.py --target /dev/shm/qwen3-8b-random \
        --random-drafters raw_dflash,dual_anchor_zero_init \
        --random-drafter-preset dflash-qwen3-8b --window 2048 --dtype bfloat16 --cuda-graphs \
        --contexts 2048 8192 32768 65536 --batch-sizes 1

At each context C the batch's caches are allocated for C plus the rounds, a short prompt is prefilled and the
committed length set to C (cache rows below it hold zeros or the prompt's values: attention costs the same
whatever they hold; no prefill of C tokens is run, so contexts far past what a prompt's prefill fits in memory
are reachable). Then --rounds rounds are timed after --warmup (per stage: drafter = draft + context append,
mtp = the MTP's chain and catch-up, verify); greedy. Timings only: the drafts mean nothing at these contexts.
`--window W` adds, for every drafter, a copy whose layers are all sliding-window layers of W (decode-time; the
tau that costs is tools/studies/window_tau.py's).
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path


from dmtp.bench.args import add_machine_args, write_report
from dmtp.threads import apply_threads, claim_process  # noqa: E402

claim_process()   # before torch loads: OpenMP's idle threads sleep

import torch  # noqa: E402

from dmtp.bench.random_drafters import (add_random_drafter_size_args, random_drafter, random_drafter_mask_id,
                                        random_drafter_size, windowed)
from dmtp.decode import SamplingConfig  # noqa: E402
from dmtp.decode.execution.stage_timer import StageTimer  # noqa: E402
from dmtp.inference.setup import (build_decoder, load_drafter, load_mtp, load_target, placement,  # noqa: E402
                                  target_config)
from dmtp.reports.tables import format_table  # noqa: E402


@torch.no_grad()
def time_rounds(dec, batch: int, context: int, rounds: int, warmup: int, prompt: list[int]) -> dict:
    """ms per round and per stage of `rounds` rounds at committed length `context` (module docstring)."""
    sampling = SamplingConfig()
    width = dec.num_candidates + 1
    budget = (rounds + warmup + 2) * width
    st = dec._ensure_state(batch, context + budget + 2 * width, budget, sampling)
    st.generator = None
    st.request_ids = list(range(batch))
    dec._prefill(st, [prompt] * batch, budget)
    dec.runner.lengths.fill_(context)
    st.longest_bound = context
    timer = StageTimer(skip_rounds=warmup, device=dec.device, use_cuda_events=dec.use_graphs)
    run = dec._round_fn(st, timer, dec._graph_span(st, context + (rounds + warmup) * width), None)
    dec._sync()
    for _ in range(rounds + warmup):
        with timer.round():
            run()
    dec._sync()
    return timer.ms_per_round()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", help="a target directory (default: the embedded --preset)")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--drafter", action="append", default=[], help="a drafter directory (repeatable)")
    ap.add_argument("--random-drafters", default="", help="comma-separated variants of random drafters")
    add_random_drafter_size_args(ap)
    ap.add_argument("--window", type=int, default=None, help="also each drafter with every layer sliding, window W")
    ap.add_argument("--contexts", nargs="+", type=int, default=[256, 1024, 4096, 16384, 32768])
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[1])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=1, help="passes over every context and method, interleaved")
    ap.add_argument("--no-ar", action="store_true", help="leave target-only AR out")
    ap.add_argument("--cuda-graphs", action="store_true")
    add_machine_args(ap)
    args = ap.parse_args(argv)
    if args.window is not None and args.window < 1:
        ap.error(f"--window must be >= 1, got {args.window}")
    print(apply_threads(args.threads))
    device, dtype = placement(args.device, args.dtype)
    target = load_target(target_config(args.target, args.preset), device, dtype)
    mtp = load_mtp(target)
    engine = {"cuda_graphs": args.cuda_graphs, "warmup_rounds": 0}
    drafters = {}
    for path in args.drafter:
        d = load_drafter(target, path, device, dtype, native_mtp=mtp)
        drafters[f"{Path(path).parent.name}/{d.label}"] = (d.model, d.mtp)
    if args.random_drafters:
        size = random_drafter_size(args, ap, target.model.num_layers)
        mask_id = random_drafter_mask_id(target.tokenizer, target.model)
        for name in args.random_drafters.split(","):
            model, _ = random_drafter(target.model, name, mask_id, device, dtype, size=size)
            drafters[f"random {name}"] = (model, mtp if model.needs_mtp else None)
    decoders = {} if args.no_ar else {"ar": build_decoder(target.model, "ar", target.eos_token_id, **engine)}
    for name, (model, with_mtp) in drafters.items():
        decoders[name] = build_decoder(target.model, "drafter", target.eos_token_id, mtp=with_mtp, drafter=model,
                                       **engine)
        if args.window:
            decoders[f"{name} w={args.window}"] = build_decoder(
                target.model, "drafter", target.eos_token_id, mtp=with_mtp, drafter=windowed(model, args.window),
                **engine)
    prompt = target.tokenizer("def main():\n    return 0\n")["input_ids"][:16] or [1]
    samples: dict = {}
    for _ in range(args.reps):
        for batch in args.batch_sizes:
            for context in args.contexts:
                for name, dec in decoders.items():
                    ms = time_rounds(dec, batch, context, args.rounds, args.warmup, prompt)
                    samples.setdefault((batch, context, name), []).append(ms)
                    dec.st = None                 # the next context allocates its own caches
                    dec._graphs.clear()
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
    rows = []
    for (batch, context, name), got in samples.items():
        med = {k: statistics.median(m.get(k, 0.0) for m in got) for k in got[0]}
        drafter_ms = med.get("drafter", 0.0)
        rows.append({"batch": batch, "context": context, "method": name, "round ms": med.get("round"),
                     "verify ms": med.get("verify"), "drafter ms": drafter_ms if name != "ar" else None,
                     "mtp ms": (med.get("mtp", 0.0) + med.get("t1_fusion", 0.0)) or None})
    rows.sort(key=lambda r: (r["batch"], r["method"], r["context"]))
    print(format_table(rows, ["batch", "context", "method", "round ms", "verify ms", "drafter ms", "mtp ms"],
                       title="a round's cost against context (drafter: draft + context append; mtp: chain + catch-up)"))
    write_report(args.out, rows)


if __name__ == "__main__":
    main()
