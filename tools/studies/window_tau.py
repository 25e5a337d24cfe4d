"""The acceptance a sliding window costs (issue 41, item 3): tau of drafters decoded with every layer attending
the whole context against the same drafters with sliding-window layers, on the embedded target's longest
prompts (its pretraining sequences are 256 tokens: 192-token prompts and 64 new tokens fill them).

    OMP_NUM_THREADS=1 python tools/studies/window_tau.py --drafter <full run>/drafter --drafter <windowed run>/drafter \
        --windows 64 32 16 --prompt-tokens 192 --max-new-tokens 64 --out window_tau.json

Each drafter as trained (its own layer types), then for each --windows W a decode-time copy whose layers are
all sliding, window W (not retrained: what imposing the window costs a drafter trained without it). Greedy,
every output checked against target-only AR; tau per verify round per domain and over all of them.
"""
from __future__ import annotations

import argparse
from pathlib import Path


from dmtp.bench.args import add_machine_args, write_report
from dmtp.threads import apply_threads, claim_process  # noqa: E402

claim_process()

from dmtp.bench.random_drafters import windowed
from dmtp.decode import SamplingConfig  # noqa: E402
from dmtp.inference.prompt_choice import embedded_prompts  # noqa: E402
from dmtp.inference.setup import (build_decoder, load_drafter, load_mtp, load_target, placement,  # noqa: E402
                                  target_config)
from dmtp.inference.workloads import add_comparisons, decode_workloads  # noqa: E402
from dmtp.reports.tables import format_table  # noqa: E402

DOMAINS = ["code", "prose", "math"]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", help="a target directory (default: the embedded --preset)")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--drafter", action="append", required=True, help="a drafter directory (repeatable)")
    ap.add_argument("--windows", nargs="*", type=int, default=[], help="decode-time windows to impose")
    ap.add_argument("--num-prompts", type=int, default=8, help="per domain")
    ap.add_argument("--prompt-tokens", type=int, default=192)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=8)
    add_machine_args(ap, device=None, dtype=None, threads=None)
    args = ap.parse_args(argv)
    if any(w < 1 for w in args.windows):
        ap.error(f"--windows must be >= 1, got {args.windows}")
    print(apply_threads("auto"))
    device, dtype = placement()
    target = load_target(target_config(args.target, args.preset), device, dtype)
    mtp = load_mtp(target)
    workloads = embedded_prompts(target.tokenizer, DOMAINS, args.num_prompts, args.prompt_tokens)
    decoders = {"ar": build_decoder(target.model, "ar", target.eos_token_id)}
    for path in args.drafter:
        d = load_drafter(target, path, device, dtype, native_mtp=mtp)
        c = d.model.backbone.config
        own = "full" if c.sliding_window is None else f"trained w={c.sliding_window}"
        label = f"{Path(path).parent.name} ({own})"
        decoders[label] = build_decoder(target.model, "drafter", target.eos_token_id, mtp=d.mtp, drafter=d.model)
        for w in args.windows:
            decoders[f"{Path(path).parent.name} (decode w={w})"] = build_decoder(
                target.model, "drafter", target.eos_token_id, mtp=d.mtp, drafter=windowed(d.model, w))
    out = decode_workloads(decoders, workloads, max_new_tokens=args.max_new_tokens, sampling=SamplingConfig(),
                           batch_size=args.batch_size, warmup=False)
    add_comparisons(out)
    rows = []
    for name in decoders:
        if name == "ar":
            continue
        row = {"drafter": name, "all": out["overall"][name]["tau_per_verify"],
               "matches AR": out["overall"][name]["matches_ar"]}
        for domain in DOMAINS:
            row[domain] = out["workloads"][domain][name]["tau_per_verify"]
        rows.append(row)
    print(format_table(rows, ["drafter", "code", "prose", "math", "all", "matches AR"],
                       title=f"tau per verify, {args.prompt_tokens}-token prompts, {args.max_new_tokens} new tokens"))
    write_report(args.out, rows)


if __name__ == "__main__":
    main()
