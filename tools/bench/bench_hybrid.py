"""What exact verification costs on a hybrid (gated-DeltaNet + full attention) target, per round.

    python tools/bench/bench_hybrid.py [--hidden 256 --layers 8 --contexts 128 512 2048 8192 --reps 5]

A random-weight Qwen3.5 text model (3 linear-attention layers to 1 full-attention layer, as the
released models) is timed at several context lengths, with 8 verify rows (1 + 7 drafts), one process,
the methods interleaved rep by rep, each reported as its fastest rep (other processes on the machine
only ever add time, so the minimum is the least disturbed figure):

- recompute: `RecomputeTargetRunner`, the whole history re-run every round (exact; the oracle);
- snapshot:  the alternative, a cached forward of the 8 rows after copying the cache (the copy is
             the snapshot; restoring after a rejection is one more cached forward of the accepted
             rows, counted here as a second 8-row forward, the worst case);
- hybrid:    `HybridTargetRunner`, a verify of the 8 rows over static caches plus `advance` (3 rows
             committed: each GDN layer takes the state after row 3 of its per-row buffer);
- hybrid AR: one token through the same runner (verify of 1 row + advance), the target-only baseline.

Targets: the hybrid round is flat in context (2048 vs 128 within 1.3x) and costs at most 2x an AR step.
Weights are random: only timings matter here (exactness is tested in tests/test_hybrid_runner.py).
"""
from __future__ import annotations

import argparse
import copy
import time

import torch

ROWS_COMMITTED = 3


def build(hidden: int, layers: int, vocab: int, max_positions: int):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
    heads = max(2, hidden // 64)
    cfg = Qwen3_5TextConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                            num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), head_dim=64,
                            layer_types=types, linear_num_key_heads=heads, linear_num_value_heads=2 * heads,
                            linear_key_head_dim=64, linear_value_head_dim=64, max_position_embeddings=max_positions,
                            tie_word_embeddings=False)
    return Qwen3_5ForCausalLM(cfg).eval()


def interleaved(fns: dict, reps: int) -> dict[str, float]:
    """Fastest ms per call of each function, after one warm-up call each; one call of each per rep."""
    for fn in fns.values():
        fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    return {k: 1000 * min(v) for k, v in samples.items()}


def runner_step(runner, rows: torch.Tensor, committed: int):
    """One round of a TargetRunner: verify `rows` at the committed lengths, then commit `committed`."""
    n = torch.full((rows.shape[0],), committed, dtype=torch.long)

    def step():
        runner.verify(rows)
        runner.advance(n)

    return step


@torch.no_grad()
def main(argv=None) -> None:
    from dmtp.decode.runners import RecomputeTargetRunner
    from dmtp.families.hybrid import HybridTargetRunner
    from dmtp.models.target import TargetModel

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--contexts", type=int, nargs="+", default=[128, 512, 2048, 8192])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    slack = (args.reps + 2) * (args.rows + 1) + 16     # every timed round commits a few rows
    model = build(args.hidden, args.layers, args.vocab, max(args.contexts) + slack)
    target = TargetModel(model)
    print(f"hybrid Qwen3.5 text model: hidden {args.hidden}, {args.layers} layers (3 linear : 1 full), "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, {torch.get_num_threads()} threads, "
          f"{args.rows} verify rows, fastest of {args.reps} interleaved reps\n")
    print("| context | recompute ms | snapshot: copy + 2 cached forwards ms | hybrid round ms | hybrid AR step ms "
          "| hybrid round / AR step | hybrid round / at first context | recompute / hybrid |")
    print("|---|---|---|---|---|---|---|---|")
    first = None
    for ctx in args.contexts:
        ids = torch.randint(0, args.vocab, (1, ctx + args.rows))
        prefix, rows = ids[:, :ctx], ids[:, ctx:]
        cache = model(prefix, use_cache=True).cache
        runners = {}
        for name, cls in (("recompute", RecomputeTargetRunner), ("hybrid", HybridTargetRunner),
                          ("hybrid_ar", HybridTargetRunner)):
            runner = cls(target)
            runner.allocate(1, ctx + slack)
            runner.prefill(prefix, torch.tensor([ctx]))
            runners[name] = runner

        def snapshot_round():
            snap = copy.deepcopy(cache)
            model(rows, cache=snap, use_cache=True)
            again = copy.deepcopy(cache)   # restore, then re-run the accepted rows (worst case: all rows)
            model(rows, cache=again, use_cache=True)

        ms = interleaved({"recompute": runner_step(runners["recompute"], rows, ROWS_COMMITTED),
                          "snapshot": snapshot_round,
                          "hybrid": runner_step(runners["hybrid"], rows, ROWS_COMMITTED),
                          "hybrid_ar": runner_step(runners["hybrid_ar"], rows[:, :1], 1)}, args.reps)
        first = first or ms["hybrid"]
        print(f"| {ctx} | {ms['recompute']:.1f} | {ms['snapshot']:.1f} | {ms['hybrid']:.1f} | {ms['hybrid_ar']:.1f} "
              f"| {ms['hybrid'] / ms['hybrid_ar']:.2f} | {ms['hybrid'] / first:.2f} "
              f"| {ms['recompute'] / ms['hybrid']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
