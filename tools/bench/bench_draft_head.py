"""The draft LM head's cost at a real shape (issue 64, item 3): one token's head over the whole vocabulary vs over a
draft vocabulary of V tokens (dmtp.models.draft_vocab: the V rows' GEMV, the -inf row and its scatter, the argmax),
at batch 1 (a GEMV: bound by the bytes it reads, so the ratio a CPU measures is the one a GPU's bandwidth gives).

    python tools/bench/bench_draft_head.py                                  # Qwen3-8B: 4096 x 151936, fp32 and bf16
    python tools/bench/bench_draft_head.py --hidden 64 --vocab 2048 --sizes 128 256 512 1024

Every (dtype, V) interleaved in one process, --reps times, the fastest kept; this process's CPU time on one thread
(other processes on the machine do not inflate it)."""
from __future__ import annotations

import argparse
import json
import time

import torch

from dmtp.models.draft_vocab import DraftVocab


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--sizes", type=int, nargs="+", default=[65536, 32768, 16384, 8192, 4096])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.threads == 1 else time.perf_counter
    gen = torch.Generator().manual_seed(0)
    cases = []
    for name in args.dtypes:
        dtype = getattr(torch, name)
        weight = (torch.randn(args.vocab, args.hidden, generator=gen) * 0.02).to(dtype)
        hidden = torch.randn(args.batch, args.hidden, generator=gen).to(dtype)
        cases.append((name, "full", lambda w=weight, h=hidden: torch.nn.functional.linear(h, w).argmax(-1)))
        for v in args.sizes:
            vocab = DraftVocab(torch.randperm(args.vocab, generator=gen)[:v], args.vocab)
            vocab.rows(weight)   # gathered once, as decoding does
            cases.append((name, v, lambda w=weight, h=hidden, dv=vocab: dv.logits(h, w).argmax(-1)))
    for _, _, fn in cases:
        fn()
    best = {(d, v): float("inf") for d, v, _ in cases}
    for _ in range(args.reps):
        for d, v, fn in cases:
            t0 = clock()
            fn()
            best[(d, v)] = min(best[(d, v)], (clock() - t0) * 1e3)
    rows = []
    for d, v, _ in cases:
        full = best[(d, "full")]
        size = args.vocab if v == "full" else v
        rows.append({"dtype": d, "V": size, "ms": round(best[(d, v)], 4), "x full": round(best[(d, v)] / full, 4),
                     "bytes x full": round(size / args.vocab, 4)})
        print(f"{d:9s} V={size:>7d}  {best[(d, v)]:8.3f} ms  x{best[(d, v)] / full:.3f} of the full head "
              f"(bytes x{size / args.vocab:.3f})")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"args": vars(args), "clock": "process CPU time" if clock is time.process_time else "wall",
                       "torch": torch.__version__, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
