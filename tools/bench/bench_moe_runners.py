"""Per-round verify cost on MoE targets: the exact recompute runner vs the static-cache runners.

    OMP_NUM_THREADS=1 python tools/bench/bench_moe_runners.py [--hidden 256 --layers 4 --contexts 128 512 2048 --reps 5]

Random-weight DeepSeek-V3-shaped (MLA + sigmoid group-limited MoE) and GLM-4-MoE-shaped (GQA with partial
rotary + the same MoE) models, first layer dense as in the releases. At each context length, one process
times, interleaved rep by rep (so a neighbour's load hits all columns alike), per request batch:

- recompute: `RecomputeTargetRunner.verify` of 8 rows (1 + 7 drafts): the whole history re-run;
- static:    the family's static-cache runner's `verify` of the same 8 rows (latent MLA cache / KV cache);
- AR step:   the static runner's `verify` of 1 row (the target-only baseline's round).

Nothing is committed between reps (rollback = not advancing), so every rep verifies at the same
positions. Weights are random: only timings matter (exactness: tests/test_deepseek_glm_runner.py).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from dmtp.families.catalogue import make_target_runner
from dmtp.models.target import TargetModel


def build(family: str, hidden: int, layers: int, vocab: int, max_pos: int) -> TargetModel:
    heads = max(2, hidden // 32)
    moe = dict(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
               intermediate_size=3 * hidden, moe_intermediate_size=hidden // 2, n_routed_experts=16,
               num_experts_per_tok=4, n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.5,
               norm_topk_prob=True, max_position_embeddings=max_pos, tie_word_embeddings=False)
    if family == "deepseek_v3":
        from transformers import DeepseekV3Config as Config, DeepseekV3ForCausalLM as Model

        cfg = Config(**moe, num_key_value_heads=heads, q_lora_rank=hidden // 2, kv_lora_rank=hidden // 4,
                     qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, n_group=4, topk_group=2)
    else:
        from transformers import Glm4MoeConfig as Config, Glm4MoeForCausalLM as Model

        cfg = Config(**moe, num_key_value_heads=max(1, heads // 4), head_dim=32, partial_rotary_factor=0.5,
                     use_qk_norm=True, attention_bias=True, n_group=1, topk_group=1)
    return TargetModel(Model(cfg).eval())


def interleaved(fns: dict, reps: int) -> dict:
    """Median ms of each no-argument function, called round-robin after one warm-up call each."""
    for fn in fns.values():
        fn()
    samples = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            samples[k].append(time.perf_counter() - t0)
    return {k: 1000 * statistics.median(v) for k, v in samples.items()}


@torch.no_grad()
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", nargs="+", default=["deepseek_v3", "glm4_moe"])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--contexts", type=int, nargs="+", default=[128, 512, 2048])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    max_len = max(args.contexts) + args.rows
    print(f"{torch.get_num_threads()} threads, batch {args.batch}, {args.rows} verify rows, median of {args.reps}\n")
    print("| model | context | recompute ms | static ms | AR step ms | recompute / static |")
    print("|---|---|---|---|---|---|")
    for family in args.families:
        torch.manual_seed(0)
        target = build(family, args.hidden, args.layers, args.vocab, max_len)
        params = sum(p.numel() for p in target.parameters()) / 1e6
        static = make_target_runner(target, kind="fast")
        recompute = make_target_runner(target, kind="recompute")
        label = f"{family} ({args.hidden}x{args.layers}, {params:.1f}M, {static.kind} runner)"
        for ctx in args.contexts:
            ids = torch.randint(0, args.vocab, (args.batch, ctx + args.rows))
            prompt, rows = ids[:, :ctx], ids[:, ctx:]
            lengths = torch.full((args.batch,), ctx)
            for runner in (static, recompute):
                runner.allocate(args.batch, max_len)
                runner.prefill(prompt, lengths, last_logits_only=True)
            ms = interleaved({"recompute": lambda: recompute.verify(rows), "static": lambda: static.verify(rows),
                              "ar": lambda: static.verify(rows[:, :1])}, args.reps)
            print(f"| {label} | {ctx} | {ms['recompute']:.1f} | {ms['static']:.1f} | {ms['ar']:.1f} | "
                  f"{ms['recompute'] / ms['static']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
