"""Exact greedy acceptance from one teacher-forced pass (SPEC §6).

On the target's own greedy continuation of a prompt, greedy verification at anchor a accepts exactly
the leading candidates that equal the continuation x_{a+1}, x_{a+2}, ... (the target's argmax there
IS the continuation). One teacher-forced pass of target, MTP and drafter over the whole sequence
therefore gives, for every anchor, the number of candidates decoding would accept. Walking the
anchors as decoding does (first anchor = end of the prompt; next = anchor + accepted + 1; the last
round clamped to the token budget) reproduces the decoding loop's greedy rounds. The same walk over the MTP's own chain
(`mtp_chain_matches`) gives the mtp415 baseline on the very same sequences.
"""
from __future__ import annotations

import torch

from dmtp.drafters.block_drafter import MTPBlockInputs
from dmtp.training.blocks import TeacherFeatures, draft_blocks, mtp_block_inputs, teacher_features
from dmtp.training.cached_features import cached_teacher_features

ANCHOR_CHUNK = 48


def _leading_matches(cands: torch.Tensor, anchors: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """cands [B, n, K] proposed after anchors [B, n] -> [B, n] how many lead the sequence's next tokens."""
    t = input_ids.shape[1]
    pos = anchors[..., None] + torch.arange(1, cands.shape[-1] + 1, device=input_ids.device)
    truth = input_ids.gather(1, pos.clamp(max=t - 1).flatten(1)).view_as(pos)
    eq = (cands == truth) & (pos < t)
    return eq.long().cumprod(-1).sum(-1)


def _anchor_chunks(input_ids: torch.Tensor):
    b, t = input_ids.shape
    for start in range(0, t, ANCHOR_CHUNK):
        yield torch.arange(start, min(t, start + ANCHOR_CHUNK), device=input_ids.device).expand(b, -1)


@torch.no_grad()
def candidate_matches(target, mtp, drafter, input_ids: torch.Tensor, feats: TeacherFeatures | None = None
                      ) -> torch.Tensor:
    """[B, T] -> [B, T] number of leading candidates at each anchor that equal the sequence's next
    tokens (positions past the end never match). `feats`: the sequence's teacher features, if computed."""
    injection = drafter.injection
    feats = feats if feats is not None else teacher_features(target, mtp, drafter, input_ids)
    matches = torch.zeros_like(input_ids, dtype=torch.long)
    embed_w = target.embed_tokens.weight
    for anchors in _anchor_chunks(input_ids):
        keep = torch.ones_like(anchors, dtype=torch.bool)
        mtp_inputs = None
        if injection.uses_mtp:
            # The MTP's own greedy chain from each anchor (through the drafter's MTP correction, if it has one)
            # and the m decoding would choose from it.
            chain = mtp_block_inputs(drafter.proposing_mtp(mtp), feats, anchors, injection.mtp_steps)
            mtp_inputs = MTPBlockInputs(chain.tokens, chain.hidden, injection.choose_num_mtp(chain.logits))
        block = draft_blocks(drafter, embed_w, feats, anchors, keep, mtp_inputs, lm_head_weight=target.lm_head.weight)
        matches[:, anchors[0]] = _leading_matches(block.candidates, anchors, input_ids)   # greedy, as decoding
    return matches


@torch.no_grad()
def mtp_chain_matches(mtp, feats: TeacherFeatures, steps: int) -> torch.Tensor:
    """The same count for the MTP chained `steps` times on its own (the mtp415 baseline for steps = 4),
    from the features the drafter's walk already computed (`feats.mtp_hidden` must be present)."""
    matches = torch.zeros_like(feats.input_ids, dtype=torch.long)
    for anchors in _anchor_chunks(feats.input_ids):
        chain = mtp_block_inputs(mtp, feats, anchors, steps)   # its own greedy chain, as decoding proposes
        matches[:, anchors[0]] = _leading_matches(chain.tokens, anchors, feats.input_ids)
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


def walk_statistics(matches: torch.Tensor, prompt_len, length, num_candidates: int) -> dict:
    """Walk and all-anchor acceptance of per-anchor match counts [B, T] over (prompt + greedy
    continuation) sequences, for blocks of K = `num_candidates` candidates (the histogram counts 0..K
    accepted). prompt_len/length [B]: the prompt's length and the sequence's valid length; the walk's
    budget is length - prompt_len - K, so every compared position lies inside the sequence (the same
    budget for every proposer compared on these sequences)."""
    matches = matches.cpu()
    hist = torch.zeros(num_candidates + 1, dtype=torch.long)
    walk_tokens = walk_rounds = anchor_tokens = anchor_count = 0
    per_request = []
    for i in range(matches.shape[0]):
        p, n = int(prompt_len[i]), int(length[i])
        budget = n - p - num_candidates
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


@torch.no_grad()
def exact_acceptance(target, mtp, drafter, input_ids, prompt_len, length, mtp_chain_steps: int = 0,
                     cached: dict | None = None) -> dict:
    """`walk_statistics` of the drafter for a batch of (prompt + greedy continuation) sequences; with
    `mtp_chain_steps` (and an MTP in use) also those of the MTP chain alone on the same sequences, under
    "mtp_chain". `cached`: the rows' features from the feature cache (else the target's forward)."""
    feats = (cached_teacher_features(drafter, mtp, input_ids, cached, drafter.config.vocab_size, logits=False)
             if cached is not None else teacher_features(target, mtp, drafter, input_ids))
    k = drafter.num_candidates
    out = walk_statistics(candidate_matches(target, mtp, drafter, input_ids, feats), prompt_len, length, k)
    if mtp_chain_steps and feats.mtp_hidden is not None:
        out["mtp_chain"] = walk_statistics(mtp_chain_matches(mtp, feats, mtp_chain_steps), prompt_len, length, k)
    return out


# -- the walk across data-parallel ranks --------------------------------------------------------------
WALK_COUNTS = ("walk_tokens", "walk_rounds", "anchor_tokens", "anchor_count")


def walk_share(rows: int, rank: int, world_size: int) -> tuple[torch.Tensor, bool]:
    """The rows of a validation batch one rank walks (every world_size-th, from its rank), and whether they
    count: a rank left without rows walks row 0 and drops the result, so that every rank runs the same
    forwards (a sharded target gathers its layers in them)."""
    share = torch.arange(rank, rows, world_size)
    return (share, True) if len(share) else (torch.zeros(1, dtype=torch.long), False)


def merged_walk(results: list[dict]) -> dict:
    """The walk statistics of several batches as one: summed counts and histogram."""
    merged = {k: sum(r[k] for r in results) for k in WALK_COUNTS}
    merged["hist"] = torch.stack([r["hist"] for r in results]).sum(0)
    return merged


def empty_walk(result: dict) -> dict:
    """A walk result that counts nothing, shaped like `result` (its MTP chain's too)."""
    out = {k: 0 for k in WALK_COUNTS} | {"hist": torch.zeros_like(result["hist"]), "per_request": []}
    if "mtp_chain" in result:
        out["mtp_chain"] = empty_walk(result["mtp_chain"])
    return out


def summed_over_ranks(merged: dict, world_size: int, device) -> dict:
    """One domain's merged walk summed over `world_size` data-parallel ranks (each walked its `walk_share`):
    the table of all rows, the same on every rank.

    Every rank calls it for the same domains in one order."""
    if world_size <= 1:
        return merged
    packed = torch.tensor([merged[k] for k in WALK_COUNTS] + merged["hist"].tolist(), dtype=torch.long,
                          device=device)
    torch.distributed.all_reduce(packed)
    counts = packed.tolist()
    return dict(zip(WALK_COUNTS, counts)) | {"hist": packed[len(WALK_COUNTS):].cpu()}
