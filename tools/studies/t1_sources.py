"""Where T1 should come from (issue 40, item 3): the first candidate of a DMTP drafter (its MTP, through its MTP
correction if it has one) against the first slot of a raw block drafter (DSpark's, with its Markov head from A),
and what choosing between them by their confidence would give, on the same positions.

    OMP_NUM_THREADS=1 python tools/studies/t1_sources.py --dmtp <DMTP drafter dir> --block <raw DSpark / DFlash drafter dir>

On the evaluation protocol's held-out prompts followed by the target's greedy continuation, at every continuation
position a (A = x_a): each source's greedy T1 against the target's token x_{a+1} (what greedy verification accepts),
the oracle (either right: the most any choice between them could accept) and the choice by confidence (the source
whose top-1 probability is higher). All positions, not only the rounds' anchors. Choosing needs both proposals
before the DMTP block is drafted, i.e. the raw drafter's forward in every round as well.
"""
from __future__ import annotations

import argparse

from dmtp.bench.args import add_machine_args, write_report
from dmtp.threads import apply_threads, claim_process

claim_process()   # before torch loads: OpenMP's idle threads sleep

import torch  # noqa: E402

from dmtp.decode import SamplingConfig  # noqa: E402
from dmtp.drafters.block_drafter import load_block_drafter  # noqa: E402
from dmtp.inference.prompt_choice import embedded_prompts  # noqa: E402
from dmtp.inference.setup import build_decoder, load_mtp, load_target, placement, target_config  # noqa: E402
from dmtp.reports.tables import format_table  # noqa: E402
from dmtp.training.blocks import draft_blocks, teacher_features  # noqa: E402


@torch.no_grad()
def first_candidates(target, mtp, dmtp, block, ids: torch.Tensor, start: int):
    """ids [1, T]: per position a in start..T-2 -> (truth x_{a+1}, DMTP's T1 and its probability, the raw drafter's
    first slot and its probability)."""
    t = ids.shape[1]
    anchors = torch.arange(start, t - 1)[None]
    feats = teacher_features(target, mtp, dmtp, ids)
    g = feats.mtp_hidden.gather(1, anchors[..., None].expand(-1, -1, feats.mtp_hidden.shape[-1]))
    p_mtp = torch.softmax(dmtp.proposing_mtp(mtp).logits(g).float(), -1)[0]
    raw_feats = teacher_features(target, None, block, ids)
    drafted = draft_blocks(block, target.embed_tokens.weight, raw_feats, anchors, torch.ones_like(anchors, dtype=bool),
                           None)
    prev = torch.cat([drafted.previous[..., None], drafted.previous[..., None].expand(-1, -1, drafted.hidden.shape[-2] - 1)],
                     -1)   # only the first slot is read: its predecessor is A
    logits = block.block_logits(drafted.hidden, target.lm_head.weight, prev)[0, :, 0].float()
    p_block = torch.softmax(logits, -1)
    truth = ids[0, start + 1:]
    return truth, p_mtp.max(-1), p_block.max(-1)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dmtp", required=True, help="a DMTP drafter (T1 from its MTP, corrected if it has a correction)")
    ap.add_argument("--block", required=True, help="a raw block drafter (injection raw_dflash: its first slot)")
    ap.add_argument("--domains", default="code,prose,math,code_tasks")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    add_machine_args(ap, device=None, dtype=None)
    args = ap.parse_args(argv)
    print(apply_threads(args.threads))
    device, dtype = placement()
    target = load_target(target_config(), device, dtype)
    mtp = load_mtp(target)
    dmtp, _ = load_block_drafter(args.dmtp, dtype=dtype)
    block, _ = load_block_drafter(args.block, dtype=dtype)
    if block.needs_mtp:
        raise SystemExit(f"--block {args.block}: a raw block drafter (injection raw_dflash) proposes its own first slot")
    dmtp, block = dmtp.to(device).eval(), block.to(device).eval()
    workloads = embedded_prompts(target.tokenizer, args.domains.split(","), args.num_prompts, args.prompt_tokens)
    ar = build_decoder(target.model, "ar", target.eos_token_id)
    rows, report = [], {}
    for domain, prompts in workloads.items():
        continued = ar.generate(prompts, max_new_tokens=args.new_tokens, sampling=SamplingConfig(), batch_size=8)
        counts = dict.fromkeys(("dmtp", "block", "oracle", "by_confidence"), 0)
        n = 0
        for prompt, tokens in zip(prompts, continued.tokens):
            ids = torch.tensor([prompt + tokens], device=device)
            truth, (pm, tm), (pb, tb) = first_candidates(target.model, mtp, dmtp, block, ids, len(prompt) - 1)
            ok_m, ok_b = tm == truth, tb == truth
            counts["dmtp"] += int(ok_m.sum())
            counts["block"] += int(ok_b.sum())
            counts["oracle"] += int((ok_m | ok_b).sum())
            counts["by_confidence"] += int(torch.where(pm >= pb, ok_m, ok_b).sum())
            n += len(truth)
        report[domain] = {k: v / n for k, v in counts.items()}
        rows.append({"domain": domain, "positions": n, **report[domain]})
    print(format_table(rows, list(rows[0]), title=f"T1 right (the target's greedy token) at every continuation position: "
                                                  f"dmtp = {dmtp.method_name}'s MTP, block = {block.method_name}'s first "
                                                  "slot, oracle = either, by_confidence = the more confident one"))
    write_report(args.out, report)
    return report


if __name__ == "__main__":
    main()
