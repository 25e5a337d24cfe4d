"""Joint pretraining of the tiny target and its MTP layer (DeepSeek-V3 / Qwen3-Next style).

loss = CE(target next token) + w * CE(MTP next-next token), both over the same batch; the MTP
reads the target's post-norm hidden, as released MTP layers do, and gradients flow into the trunk.
"""
from __future__ import annotations

import math
import random
import time

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from dmtp.models.mtp import NativeMTP
from dmtp.tiny.presets import TinyPreset


class DomainStreams:
    """Token streams per domain; batches are random windows drawn by domain weight."""

    def __init__(self, streams: dict[str, torch.Tensor], weights: dict[str, float], seq_len: int, seed: int):
        self.streams = {d: s for d, s in streams.items() if len(s) > seq_len + 1}
        self.domains = list(self.streams)
        self.weights = [weights[d] for d in self.domains]
        self.seq_len = seq_len
        self.rng = random.Random(seed)

    def batch(self, batch_size: int) -> torch.Tensor:
        rows = []
        for _ in range(batch_size):
            stream = self.streams[self.rng.choices(self.domains, self.weights)[0]]
            start = self.rng.randrange(0, len(stream) - self.seq_len - 1)
            rows.append(stream[start:start + self.seq_len + 1])
        return torch.stack(rows)


def joint_losses(model, mtp: NativeMTP, ids: torch.Tensor, chain_depth: int = 1):
    """The causal LM's next-token loss and the MTP's, summed over `chain_depth` chained steps.

    Depth 1 is the MTP as pretrained by the Qwen3.5 recipe: g1[:, t] = MTP(x_t, h_{t-1}) predicts x_{t+1}. Depth d
    feeds the MTP its own previous output instead of the target's hidden, g_d[:, t] = MTP(x_t, g_{d-1}[:, t-1]), as
    the decoding chain does (step j+1 consumes T_j and the hidden that predicted it), so a chained step sees at
    training the inputs it sees when drafting; DeepSeek-V3's sequential MTP modules, one module shared."""
    out = model.model(input_ids=ids, use_cache=False)  # no cache: nothing is decoded from here
    hidden = out.last_hidden_state                      # post final norm
    logits = model.lm_head(hidden)
    main = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    side = logits.new_zeros(())
    g = hidden
    for depth in range(1, chain_depth + 1):
        g = mtp.forward_teacher(ids, g)                 # g[:, t] predicts x_{t+1}; rows t < depth lack an input
        mtp_logits = mtp.logits(g[:, depth:-1])
        side = side + F.cross_entropy(mtp_logits.flatten(0, 1), ids[:, depth + 1:].flatten())
    return main, side


def pretrain(model, mtp: NativeMTP, data: DomainStreams, preset: TinyPreset, progress: bool = True) -> dict:
    params = [p for p in list(model.parameters()) + list(mtp.parameters()) if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=preset.lr, betas=(0.9, 0.95))

    def lr_at(step):
        if step < preset.warmup_steps:
            return (step + 1) / preset.warmup_steps
        frac = (step - preset.warmup_steps) / max(1, preset.steps - preset.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    model.train(), mtp.train()
    bar = tqdm(range(preset.steps), desc=f"pretraining {preset.name} target + MTP", disable=not progress,
               dynamic_ncols=True, mininterval=2.0)
    start = time.perf_counter()
    main = side = torch.tensor(0.0)
    for _ in bar:
        ids = data.batch(preset.batch_size)
        main, side = joint_losses(model, mtp, ids, preset.mtp_chain_depth)
        loss = main + preset.mtp_loss_weight * side
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        # Not redrawn per step: the bar's 2 s interval keeps a log file's copy of it short.
        bar.set_postfix(loss=f"{main.item():.3f}", mtp=f"{side.item():.3f}", refresh=False)
    model.eval(), mtp.eval()
    seconds = time.perf_counter() - start
    tokens = preset.steps * preset.batch_size * preset.seq_len
    return {"train_seconds": round(seconds, 1), "train_tokens": tokens, "tokens_per_second": round(tokens / seconds),
            "final_loss": round(main.item(), 4), "final_mtp_loss": round(side.item(), 4)}


@torch.no_grad()
def evaluate(model, mtp: NativeMTP, streams: dict[str, torch.Tensor], seq_len: int, max_windows: int = 96) -> dict:
    """Held-out next-token top-1 of the target, next-next-token top-1 of the MTP, and how often the
    MTP's prediction equals the target's own greedy next token (what T1 acceptance depends on).

    Windows are spread evenly over the whole held-out stream: the first few windows would be one
    or two documents, and code files differ enough that such a figure says more about the file
    than about the model."""
    report = {}
    for domain, stream in streams.items():
        ids = spread_windows(stream, seq_len + 1, max_windows)
        if ids is None:
            continue
        hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
        pred = model.lm_head(hidden).argmax(-1)
        g = mtp.forward_teacher(ids, hidden)
        mtp_pred = mtp.logits(g).argmax(-1)
        report[domain] = {
            "target_top1": round((pred[:, :-1] == ids[:, 1:]).float().mean().item(), 4),
            "mtp_top1": round((mtp_pred[:, 1:-1] == ids[:, 2:]).float().mean().item(), 4),
            "mtp_agrees_with_target": round((mtp_pred[:, 1:] == pred[:, 1:]).float().mean().item(), 4),
            "unigram_top1": round(_unigram_top1(stream, ids), 4),
        }
    return report


def spread_windows(stream: torch.Tensor, length: int, max_windows: int) -> torch.Tensor | None:
    """Up to `max_windows` non-overlapping windows of `length` tokens, evenly spaced from the stream's
    start to its end (None when the stream is shorter than one window)."""
    n = min(max_windows, len(stream) // length)
    if n == 0:
        return None
    starts = torch.linspace(0, len(stream) - length, n).round().long().tolist()
    return torch.stack([stream[s: s + length] for s in starts])


def _unigram_top1(stream: torch.Tensor, ids: torch.Tensor) -> float:
    most = torch.bincount(stream).argmax()
    return (ids[:, 2:] == most).float().mean().item()
