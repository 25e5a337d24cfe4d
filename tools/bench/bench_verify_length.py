"""A verify length per batch from measured costs (`verify_length=auto`, issue 41) against the fixed full length and
target-only AR, at several batch sizes, interleaved in one process (absolute times drift on a shared machine: read
the ratios of one run).

    OMP_NUM_THREADS=1 python tools/bench/bench_verify_length.py --drafter <DSpark run>/drafter [--drafter ...] \
        [--mtp415] --batch-sizes 1 8 32 --reps 3 --out verify_length.json
    python tools/bench/bench_verify_length.py --target /dev/shm/qwen3-8b-random --random-dspark --random-drafter-preset \
        dflash-qwen3-8b --dtype bfloat16 --cuda-graphs --tables-only --what-if 0.73 0.54 0.43 0.34 0.30 0.25 0.22

Per batch size and method: tok/s of the full block, of auto and of AR (median and best over --reps, interleaved;
on a CPU also tokens per second of the process's CPU time, which other processes on a shared machine do not
inflate: the policy's own clock there), tau
per verify, candidates verified per round, the share of rounds at each L and its mean, the cost table T(L)
measured for that batch (ms per round at L = 0..K), and the policy's survival / calibration at the end.
--tables-only: only the cost tables (random drafters at a real model's shapes: their acceptance means nothing);
--what-if s1..sK: the L the policy picks from each measured table for that predicted survival of candidates
1..K (e.g. a trained drafter's P(L>=k) from the CPU run), and its expected tokens per second against the full
block's. Greedy, the embedded held-out prompts of every domain (as dmtp.infer), all domains together.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path


from dmtp.bench.args import add_machine_args, write_report
from dmtp.threads import apply_threads, claim_process  # noqa: E402

claim_process()   # before torch loads: OpenMP's idle threads sleep

import torch  # noqa: E402

from dmtp.bench.random_drafters import add_random_drafter_size_args, random_drafter_mask_id, random_drafter_size
from dmtp.decode import SamplingConfig  # noqa: E402
from dmtp.decode.verify_length.policy import VerifyLengthPolicy  # noqa: E402
from dmtp.drafters.block_drafter import fresh_drafter_for  # noqa: E402
from dmtp.inference.prompt_choice import embedded_prompts  # noqa: E402
from dmtp.inference.setup import (build_decoder, load_drafter, load_mtp, load_target, placement,  # noqa: E402
                                  target_config)
from dmtp.reports.tables import format_table  # noqa: E402

FULL, AUTO = SamplingConfig(), SamplingConfig(verify_length="auto")


def what_if(costs: list[float], survival: list[float]) -> dict:
    """The policy's L from a measured table for a given predicted survival; expected tok/s vs the full block."""
    policy = VerifyLengthPolicy(costs)
    policy.survival = list(survival)
    tput = policy.throughput()
    length = max(range(len(tput)), key=lambda n: tput[n])
    return {"L": length, "gain_vs_full": tput[length] / tput[-1], "gain_vs_off": tput[length] / tput[0]}


def policy_record(dec) -> dict:
    """Per batch rows: the measured table (ms per round at each L), survival EMA and calibration at the end."""
    out = {}
    for (rows, _), policy in dec._length_policies.items():
        out[rows] = {"table_ms": [1e3 * c for c in policy.costs], "survival": policy.survival,
                     "calibration": policy.calibration, "overhead_ms": [1e3 * o for o in policy.overhead]}
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", help="a target directory (default: the embedded --preset)")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--drafter", action="append", default=[], help="a drafter with an acceptance signal (repeatable)")
    ap.add_argument("--mtp415", action="store_true", help="also the MTP chain (its signal: the MTP's top-1)")
    ap.add_argument("--random-dspark", action="store_true", help="a random raw DSpark drafter (timings only)")
    add_random_drafter_size_args(ap)
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--num-prompts", type=int, default=8, help="per domain (code, prose, math)")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--cuda-graphs", action="store_true")
    ap.add_argument("--tables-only", action="store_true", help="measure the cost tables only (no decoding runs)")
    ap.add_argument("--what-if", nargs="+", type=float, default=None, metavar="S",
                    help="predicted survival of candidates 1..K: the L each measured table gives it")
    add_machine_args(ap)
    args = ap.parse_args(argv)
    if not args.drafter and not args.mtp415 and not args.random_dspark:
        ap.error("give --drafter, --mtp415 or --random-dspark")
    print(apply_threads(args.threads))
    device, dtype = placement(args.device, args.dtype)
    target = load_target(target_config(args.target, args.preset), device, dtype)
    mtp = load_mtp(target)
    engine = {"cuda_graphs": args.cuda_graphs}
    prompts = [p for ps in embedded_prompts(target.tokenizer, ["code", "prose", "math"], args.num_prompts,
                                            args.prompt_tokens).values() for p in ps]
    if args.random_dspark and not prompts:
        raise SystemExit("bench_verify_length: error: no prompts")
    drafters = {}
    for path in args.drafter:
        d = load_drafter(target, path, device, dtype, native_mtp=mtp)
        if not (d.model.has_confidence or d.model.injection.mtp_steps):
            print(f"bench_verify_length: {path} predicts no acceptance (no confidence head, no MTP): left out")
            continue
        run = Path(path).parent.name if Path(path).name == "drafter" else Path(path).name   # <run>/drafter, or a dir
        drafters[f"{run}/{d.label}"] = ("drafter", d.model, d.mtp)
    if args.random_dspark:
        size = random_drafter_size(args, ap, target.model.num_layers)
        model = fresh_drafter_for(target.model, "raw_dflash", random_drafter_mask_id(target.tokenizer, target.model),
                                  backbone={"architecture": "dspark"}, **size).to(device, dtype)
        drafters["random_dspark"] = ("drafter", model, None)
    if args.mtp415:
        drafters["mtp415"] = ("mtp415", None, mtp)

    def decoder(method, model, with_mtp):
        return build_decoder(target.model, method, target.eos_token_id, mtp=with_mtp, drafter=model, **engine)

    runs = {"ar": (decoder("ar", None, None), FULL)}
    for name, (method, model, with_mtp) in drafters.items():
        if not args.tables_only:
            runs[f"{name} full"] = (decoder(method, model, with_mtp), FULL)
        runs[f"{name} auto"] = (decoder(method, model, with_mtp), AUTO)
    if args.tables_only:
        runs = {k: v for k, v in runs.items() if k != "ar"}
    for batch in args.batch_sizes:   # warm-up: captures, and the auto decoders' cost table for each batch
        # (tables only: exactly `batch` rows, the prompts repeated; else the rows the timed runs will have)
        warm = (prompts * batch)[:batch] if args.tables_only else prompts[:batch]
        for dec, sampling in runs.values():
            dec.generate(warm, max_new_tokens=8 if not args.tables_only else 4, sampling=sampling, batch_size=batch)
    samples: dict = {}
    if not args.tables_only:
        for _ in range(args.reps):
            for batch in args.batch_sizes:
                for name, (dec, sampling) in runs.items():
                    cpu0 = time.process_time()
                    res = dec.generate(prompts, max_new_tokens=args.max_new_tokens, sampling=sampling, batch_size=batch)
                    summary = res.summary()
                    summary["cpu_tokens_per_s"] = res.output_tokens / max(time.process_time() - cpu0, 1e-9)
                    samples.setdefault((batch, name), []).append(summary)
    rows, report = [], {"runs": {}, "tables": {}, "what_if": {}}
    for name, (dec, sampling) in runs.items():
        if sampling.chooses_length:
            report["tables"][name] = {str(k): v for k, v in policy_record(dec).items()}
    for batch in args.batch_sizes:
        ar_runs = samples.get((batch, "ar"), [{"tokens_per_s": 0, "cpu_tokens_per_s": 0}])
        ar = statistics.median(s["tokens_per_s"] for s in ar_runs)
        ar_cpu = statistics.median(s["cpu_tokens_per_s"] for s in ar_runs)
        for name, (dec, sampling) in runs.items():
            got = samples.get((batch, name))
            if not got:
                continue
            tps = statistics.median(s["tokens_per_s"] for s in got)
            best = max(s["tokens_per_s"] for s in got)
            full = samples.get((batch, name.replace(" auto", " full")))
            best_full = max(s["tokens_per_s"] for s in full) if full else None
            last = got[-1]
            rows.append({"batch": batch, "method": name, "tok/s": tps, "vs_ar": tps / ar if ar else None,
                         "vs_full": tps / statistics.median(s["tokens_per_s"] for s in full) if full else None,
                         "best tok/s": best, "best vs_full": best / best_full if full else None,
                         "cpu vs_ar": (statistics.median(s["cpu_tokens_per_s"] for s in got) / ar_cpu
                                       if ar_cpu else None),
                         "cpu vs_full": (statistics.median(s["cpu_tokens_per_s"] for s in got)
                                         / statistics.median(s["cpu_tokens_per_s"] for s in full)) if full else None,
                         "tau": last.get("tau_per_verify"), "verified": last["verified_per_round"],
                         "mean_L": last.get("verify_length_mean"),
                         "L share": " ".join(f"{k}:{v:.2f}" for k, v in last.get("verify_length_share", {}).items())})
            report["runs"][f"{batch}/{name}"] = got
    if rows:
        cols = ["batch", "method", "tok/s", "vs_ar", "vs_full", "best vs_full", "cpu vs_ar", "cpu vs_full", "tau",
                "mean_L", "L share"]
        print(format_table(rows, cols,
                           title="verify_length=auto vs the full block (greedy, all domains together)"))
    trows = []
    for name, per_rows in report["tables"].items():
        for batch_rows, rec in per_rows.items():
            row = {"method": name, "rows": int(batch_rows),
                   "T(L) ms, L = 0..K": " ".join(f"{t:.2f}" for t in rec["table_ms"])}
            if rec["survival"]:
                row["survival (EMA)"] = " ".join(f"{s:.2f}" for s in rec["survival"])
                row["calibration"] = " ".join(f"{c:.2f}" for c in rec["calibration"])
            if args.what_if:
                w = what_if([t / 1e3 for t in rec["table_ms"]], args.what_if[:len(rec["table_ms"]) - 1])
                report["what_if"][f"{name}/{batch_rows}"] = w
                row["what-if L"], row["vs full"], row["vs off"] = w["L"], w["gain_vs_full"], w["gain_vs_off"]
            trows.append(row)
    cols = ["method", "rows", "T(L) ms, L = 0..K", "survival (EMA)", "calibration"]
    if args.what_if:
        cols += ["what-if L", "vs full", "vs off"]
    print(format_table(trows, cols, title="cost tables T(L) measured per batch (fastest round, ms; CPU time on a CPU)"))
    write_report(args.out, report)


if __name__ == "__main__":
    main()
