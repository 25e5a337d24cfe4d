"""What exact verification costs on a hybrid (gated-DeltaNet + full attention) target, per round.

    python tools/bench_hybrid.py [--hidden 256 --layers 8 --contexts 128 512 2048 --reps 5]

A random-weight Qwen3.5 text model (3 linear-attention layers to 1 full-attention layer, as the
released models) is timed three ways at several context lengths, with 8 verify rows (1 + 7 drafts):

- recompute: what `RecomputeTargetRunner` does, the whole history re-run every round (exact; ours);
- snapshot:  the alternative, a cached forward of the 8 rows after copying the cache (the copy is
             the snapshot; restoring after a rejection is one more cached forward of the accepted
             rows, counted here as a second 8-row forward, the worst case);
- AR step:   one cached token, the target-only baseline.

Weights are random: only timings matter here (exactness is tested in tests/test_real_targets.py).
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch


def build(hidden: int, layers: int, vocab: int):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
    heads = max(2, hidden // 64)
    cfg = Qwen3_5TextConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                            num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), head_dim=64,
                            layer_types=types, linear_num_key_heads=heads, linear_num_value_heads=2 * heads,
                            linear_key_head_dim=64, linear_value_head_dim=64, max_position_embeddings=8192,
                            tie_word_embeddings=False)
    return Qwen3_5ForCausalLM(cfg).eval()


def timed(fn, reps: int) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return 1000 * statistics.median(samples)


@torch.no_grad()
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--contexts", type=int, nargs="+", default=[128, 512, 2048])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    model = build(args.hidden, args.layers, args.vocab)
    print(f"hybrid Qwen3.5 text model: hidden {args.hidden}, {args.layers} layers (3 linear : 1 full), "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, {torch.get_num_threads()} threads, "
          f"{args.rows} verify rows\n")
    print("| context | recompute ms | snapshot: copy + 2 cached forwards ms | AR step ms | recompute / snapshot |")
    print("|---|---|---|---|---|")
    for ctx in args.contexts:
        ids = torch.randint(0, args.vocab, (1, ctx + args.rows))
        prefix, rows = ids[:, :ctx], ids[:, ctx:]
        cache = model(prefix, use_cache=True).past_key_values

        recompute = timed(lambda: model(ids, use_cache=False), args.reps)

        def snapshot_round():
            snap = copy.deepcopy(cache)
            model(rows, past_key_values=snap, use_cache=True)
            again = copy.deepcopy(cache)   # restore, then re-run the accepted rows (worst case: all rows)
            model(rows, past_key_values=again, use_cache=True)

        snapshot = timed(snapshot_round, args.reps)

        def ar_step():
            model(rows[:, :1], past_key_values=copy.deepcopy(cache), use_cache=True)

        ar = timed(ar_step, args.reps)
        print(f"| {ctx} | {recompute:.1f} | {snapshot:.1f} | {ar:.1f} | {recompute / snapshot:.2f} |", flush=True)


if __name__ == "__main__":
    main()
