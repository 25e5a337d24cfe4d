"""Confidence-scheduled verification (issue 36): tau, candidates verified per round and tok/s of DSpark
drafters at several confidence thresholds and batch sizes, beside target-only AR, in one process.

    OMP_NUM_THREADS=1 python tools/studies/dspark_schedule.py --drafter <run>/drafter [--drafter ...] \
        --thresholds 0 0.3 0.5 0.7 --batch-sizes 1 8 32 --out schedule.json

Greedy, the embedded held-out prompts of every domain (as dmtp.infer), decoded together at each batch size.
The loop masks the unverified candidates and keeps the block's shapes, so on this loop the verify forward
costs the same whatever the threshold: what scheduling would save in an engine that packs only the verified
rows is the `verified` column (candidates per round), not tok/s here.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from dmtp.bench.args import add_machine_args, write_report
from dmtp.threads import apply_threads, claim_process

claim_process()   # before torch loads: OpenMP's idle threads sleep

from dmtp.decode import SamplingConfig  # noqa: E402
from dmtp.inference.prompt_choice import embedded_prompts  # noqa: E402
from dmtp.inference.setup import build_decoder, load_drafter, load_mtp, load_target, placement, target_config  # noqa: E402
from dmtp.inference.workloads import decode_workloads  # noqa: E402
from dmtp.reports.tables import format_table  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", action="append", required=True, help="a DSpark drafter directory (repeatable)")
    ap.add_argument("--thresholds", nargs="+", type=float, default=[0.0, 0.3, 0.5, 0.7])
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("--num-prompts", type=int, default=8, help="per domain (code, prose, math)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    add_machine_args(ap, device=None, dtype=None, threads=None)
    args = ap.parse_args(argv)
    print(apply_threads("auto"))
    device, dtype = placement()
    target = load_target(target_config(), device, dtype)
    mtp = load_mtp(target)
    prompts = {"all": [p for ps in embedded_prompts(target.tokenizer, ["code", "prose", "math"], args.num_prompts,
                                                    64).values() for p in ps]}
    decoders = {"ar": build_decoder(target.model, "ar", target.eos_token_id)}
    for path in args.drafter:
        d = load_drafter(target, path, device, dtype, native_mtp=mtp)
        if not d.model.has_confidence:
            raise SystemExit(f"dspark_schedule: error: {path} has no confidence head (train it with drafter=dspark)")
        decoders[f"{Path(path).parent.name}/{d.label}"] = build_decoder(target.model, "drafter", target.eos_token_id,
                                                                         mtp=d.mtp, drafter=d.model)
    rows = []
    for batch in args.batch_sizes:
        for threshold in args.thresholds:
            out = decode_workloads(decoders, prompts, max_new_tokens=args.max_new_tokens, batch_size=batch,
                                   sampling=SamplingConfig(confidence_threshold=threshold))["overall"]
            ar = out["ar"]["tokens_per_s"]
            for name, s in out.items():
                if name == "ar" and threshold != args.thresholds[0]:
                    continue
                rows.append({"batch": batch, "threshold": threshold if name != "ar" else None, "method": name,
                             "tau": s["tau_per_verify"], "verified": s["verified_per_round"],
                             "tok/s": s["tokens_per_s"], "vs_ar": s["tokens_per_s"] / ar})
    print(format_table(rows, ["batch", "threshold", "method", "tau", "verified", "tok/s", "vs_ar"],
                       title="confidence-scheduled verification (greedy, all domains together)"))
    write_report(args.out, rows)


if __name__ == "__main__":
    main()
