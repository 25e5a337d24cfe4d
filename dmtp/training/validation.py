"""Exact greedy acceptance from one teacher-forced pass (SPEC §6).

On the target's own greedy continuation of a prompt, greedy verification at anchor a accepts exactly
the leading candidates that equal the continuation x_{a+1}, x_{a+2}, ... (the target's argmax there
IS the continuation). One teacher-forced pass of target, MTP and drafter over the whole sequence
therefore gives, for every anchor, the number of candidates decoding would accept. Walking the
anchors as decoding does (first anchor = end of the prompt; next = anchor + accepted + 1; the last
round clamped to the token budget) reproduces the decoding loop's greedy rounds.
"""
from __future__ import annotations

import torch

from dmtp.injection.base import BLOCK_CANDIDATES
from dmtp.training.blocks import MTPBlockInputs, draft_blocks, mtp_block_inputs, teacher_features

ANCHOR_CHUNK = 48


@torch.no_grad()
def candidate_matches(target, mtp, drafter, injection, layer_ids, input_ids: torch.Tensor) -> torch.Tensor:
    """[B, T] -> [B, T] number of leading candidates at each anchor that equal the sequence's next
    tokens (positions past the end never match)."""
    feats = teacher_features(target, mtp, injection, layer_ids, input_ids)
    b, t = input_ids.shape
    matches = torch.zeros(b, t, dtype=torch.long, device=input_ids.device)
    embed_w = target.embed_tokens.weight
    for start in range(0, t, ANCHOR_CHUNK):
        anchors = torch.arange(start, min(t, start + ANCHOR_CHUNK), device=input_ids.device).expand(b, -1)
        keep = torch.ones_like(anchors, dtype=torch.bool)
        mtp_inputs = tokens = num = None
        if injection.uses_mtp:
            # The MTP's own greedy chain from each anchor and the m decoding would choose from it.
            tokens, hidden, logits = mtp_block_inputs(mtp, injection, feats, anchors, injection.mtp_steps)
            num = injection.choose_num_mtp(logits)
            mtp_inputs = MTPBlockInputs(tokens, hidden, num)
        hidden = draft_blocks(drafter, injection, embed_w, feats, anchors, keep, mtp_inputs)
        first_prev = tokens[..., 0] if tokens is not None else input_ids.gather(1, anchors)
        drafted, _ = drafter.propose(hidden, target.lm_head.weight, first_prev)   # [B, n, n_pred], greedy
        cands = injection.merge_candidates(tokens, drafted, num)[..., :BLOCK_CANDIDATES]
        pos = anchors[..., None] + torch.arange(1, cands.shape[-1] + 1, device=input_ids.device)
        truth = input_ids.gather(1, pos.clamp(max=t - 1).flatten(1)).view_as(pos)
        eq = (cands == truth) & (pos < t)
        matches[:, anchors[0]] = eq.long().cumprod(-1).sum(-1)
    return matches


def walk(matches: torch.Tensor, prompt_len: int, budget: int) -> list[int]:
    """Accepted-candidate counts of the greedy rounds decoding would run: [a_1, a_2, ...]."""
    rounds, emitted, anchor = [], 0, prompt_len
    while emitted < budget:
        accepted = min(int(matches[anchor]), budget - emitted - 1)
        rounds.append(accepted)
        emitted += accepted + 1
        anchor += accepted + 1
    return rounds


@torch.no_grad()
def exact_acceptance(target, mtp, drafter, injection, layer_ids, input_ids, prompt_len, length) -> dict:
    """Walk and all-anchor acceptance for a batch of (prompt + greedy continuation) sequences.

    prompt_len/length [B]: the prompt's length and the sequence's valid length; the walk's budget is
    length - prompt_len - BLOCK_CANDIDATES, so every compared position lies inside the sequence."""
    matches = candidate_matches(target, mtp, drafter, injection, layer_ids, input_ids).cpu()
    hist = torch.zeros(BLOCK_CANDIDATES + 1, dtype=torch.long)
    walk_tokens = walk_rounds = anchor_tokens = anchor_count = 0
    per_request = []
    for i in range(input_ids.shape[0]):
        p, n = int(prompt_len[i]), int(length[i])
        budget = n - p - BLOCK_CANDIDATES
        if budget <= 0:
            continue
        rounds = walk(matches[i], p, budget)
        per_request.append(rounds)
        for a in rounds:
            hist[a] += 1
        walk_tokens += sum(a + 1 for a in rounds)
        walk_rounds += len(rounds)
        anchor_tokens += int((matches[i, p:p + budget] + 1).sum())
        anchor_count += budget
    return {"walk_tokens": walk_tokens, "walk_rounds": walk_rounds, "anchor_tokens": anchor_tokens,
            "anchor_count": anchor_count, "hist": hist, "per_request": per_request}
