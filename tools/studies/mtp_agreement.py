"""How close the MTP's proposals are to the target, native and through drafters' MTP corrections (issue 40).

    OMP_NUM_THREADS=1 python tools/studies/mtp_agreement.py --drafter <run>/drafter [--drafter ...] [--temperatures 1 0.6]

On the held-out prompts of each domain (the evaluation protocol's: test split, 32 x 64 tokens) followed by the
target's own greedy continuation (128 tokens), at every continuation position: the MTP's greedy agreement with the
target's greedy token (what greedy verification accepts as T1) and, at each temperature T, the overlap
sum_v min(p_T, q_T) of the MTP's tempered distribution with the target's (what one rejection-sampling step accepts;
here on the greedy continuation, a proxy for sampled text). All positions, not only the rounds' anchors: the rounds
start after rejections, where tokens are harder (a drafter's per-round T1 is lower than these).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from dmtp.bench.args import add_machine_args, write_report
from dmtp.threads import apply_threads, claim_process

claim_process()   # before torch loads: OpenMP's idle threads sleep

import torch  # noqa: E402

from dmtp.decode import SamplingConfig  # noqa: E402
from dmtp.drafters.block_drafter import load_block_drafter  # noqa: E402
from dmtp.inference.prompt_choice import embedded_prompts  # noqa: E402
from dmtp.inference.setup import build_decoder, load_mtp, load_target, placement, target_config  # noqa: E402
from dmtp.reports.tables import format_table  # noqa: E402


@torch.no_grad()
def agreement(target_model, mtp, sequences: torch.Tensor, prompt_len: int, temperatures) -> dict:
    """sequences [N, T] (prompt + greedy continuation) -> {"agree": .., "overlap@T": ..} over continuation positions."""
    out = target_model(sequences, layer_ids=[], logits=True)
    g = mtp.forward_teacher(sequences, out.last_hidden)          # g[:, t] predicts x_{t+1}, like the target at t
    target_logits, mtp_logits = out.logits[:, prompt_len - 1:-1].float(), mtp.logits(g[:, prompt_len - 1:-1]).float()
    result = {"agree": (mtp_logits.argmax(-1) == target_logits.argmax(-1)).float().mean().item()}
    for t in temperatures:
        p, q = torch.softmax(target_logits / t, -1), torch.softmax(mtp_logits / t, -1)
        result[f"overlap@{t:g}"] = torch.minimum(p, q).sum(-1).mean().item()
    return result


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", action="append", default=[], help="a drafter with an MTP correction (repeatable)")
    ap.add_argument("--temperatures", nargs="+", type=float, default=[1.0, 0.6])
    ap.add_argument("--domains", default="code,prose,math,code_tasks")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--target", help="target directory (default: the embedded tiny target)")
    add_machine_args(ap, device=None, dtype=None)
    args = ap.parse_args(argv)
    print(apply_threads(args.threads))
    device, dtype = placement()
    target = load_target(target_config(path=args.target), device, dtype)
    native = load_mtp(target)
    proposers = {"native MTP": native}
    for path in args.drafter:
        drafter, _ = load_block_drafter(path, dtype=dtype)
        if not drafter.mtp_correction_rank:
            raise SystemExit(f"{path}: this drafter has no MTP correction (mtp_correction_rank 0)")
        proposers[f"{drafter.method_name} ({Path(path).parent.name})"] = drafter.to(device).proposing_mtp(native)
    workloads = embedded_prompts(target.tokenizer, args.domains.split(","), args.num_prompts, args.prompt_tokens)
    ar = build_decoder(target.model, "ar", target.eos_token_id)
    rows, report = [], {}
    for domain, prompts in workloads.items():
        continued = ar.generate(prompts, max_new_tokens=args.new_tokens, sampling=SamplingConfig(), batch_size=8)
        for name, mtp in proposers.items():
            stats = {k: 0.0 for k in ("agree", *(f"overlap@{t:g}" for t in args.temperatures))}
            for prompt, tokens in zip(prompts, continued.tokens):
                seq = torch.tensor([prompt + tokens], device=device)
                for k, v in agreement(target.model, mtp, seq, len(prompt), args.temperatures).items():
                    stats[k] += v / len(prompts)
            report.setdefault(domain, {})[name] = stats
            rows.append({"domain": domain, "proposer": name, **stats})
    print(format_table(rows, list(rows[0]), title="the MTP's proposals against the target on held-out continuations "
                                                  "(agree: greedy top-1; overlap@T: sum min(p_T, q_T))"))
    write_report(args.out, report)
    return report


if __name__ == "__main__":
    main()
