"""The speculative round written to be read (batch 1, greedy): propose -> verify -> accept -> advance.

Every forward here runs over the whole sequence so far (the target through transformers, the MTP
teacher-forced, the drafter's context recomputed), with no cache, no batching and no host/device
tricks, so that it is plainly right. It is the oracle `SpecDecoder` (dmtp/decode/loop.py) is tested
against: the same tokens and the same accepted length in every round, for every method
(tests/test_decode_reference.py).

    propose = reference_proposal(proposer)       # from a SpecDecoder's proposer: ar, mtp415, any drafter
    tokens, accepted = reference_generate(target, propose, prompt, max_new_tokens=64, eos_ids=[eos])
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from dmtp.decode.proposers import ARProposer, DrafterProposer, MTPChainProposer, Proposer
from dmtp.drafters.block_drafter import MTPBlockInputs
from dmtp.models.mtp_chain import MTPChain, chain_mtp

# (target, ids [1, T] ending with the anchor A) -> the round's candidates c1..cK
Propose = Callable[[object, torch.Tensor], list[int]]


@torch.no_grad()
def reference_generate(target, propose: Propose, prompt: Sequence[int], max_new_tokens: int,
                       eos_ids: Sequence[int] = ()) -> tuple[list[int], list[int]]:
    """-> (output tokens, the first being the prompt's own next token; accepted candidates per round)."""
    first = int(target(torch.tensor([list(prompt)])).logits[0, -1].argmax())
    out, accepted = [first], []
    while out[-1] not in eos_ids and len(out) < max_new_tokens:
        seq = list(prompt) + out                                   # ends with the anchor A
        candidates = propose(target, torch.tensor([seq]))
        # Verify: the target's own next token after A, c1, ..., cK, from one forward over everything.
        logits = target(torch.tensor([seq + candidates])).logits[0, len(seq) - 1:]
        y = logits.argmax(-1).tolist()
        n = 0                                                      # accept the candidates the target agrees with
        while n < len(candidates) and candidates[n] == y[n]:
            n += 1
        new = y[:n + 1]                                            # ... and the target's token after them
        for i, token in enumerate(new):                            # advance: stop at EOS and at the budget
            if token in eos_ids:
                new = new[:i + 1]
                break
        new = new[:max_new_tokens - len(out)]
        out += new
        accepted.append(len(new) - 1)
    return out, accepted


def mtp_chain(mtp, ids: torch.Tensor, target_hidden: torch.Tensor, steps: int) -> MTPChain:
    """The MTP's greedy chain T1..T_steps after the last token of ids [1, T], teacher-forced on the
    target's hidden states [1, T, H]; where the target's hidden is not known (after A), the MTP reads
    its own previous hidden.

    Every row is recomputed over the whole sequence so far."""
    seq, hidden_in = ids, target_hidden   # row t of forward_teacher consumes (seq[t], hidden_in[t - 1])

    def step(j, token, hidden):           # the row of T_j, which reads h_j: it predicts T_{j+1}
        nonlocal seq, hidden_in
        seq = torch.cat([seq, token[:, None]], dim=1)
        hidden_in = torch.cat([hidden_in[:, :-1], hidden[:, None], torch.zeros_like(hidden[:, None])], dim=1)
        return mtp.forward_teacher(seq, hidden_in)[:, -1]

    first = mtp.forward_teacher(ids, target_hidden)[:, -1]     # the row of A: predicts T1
    return chain_mtp(mtp, first, steps, step, keep_logits=True)


def propose_mtp_chain(mtp, steps: int) -> Propose:
    def propose(target, ids):
        return mtp_chain(mtp, ids, target(ids).last_hidden, steps).tokens[0].tolist()
    return propose


def propose_drafter(drafter, mtp=None, confidence_threshold: float = 0.0, vocab=None) -> Propose:
    """Raw DFlash or any DMTP variant (a `BlockDrafter`): the MTP's T1..Tm (m from its injection), then
    one drafter forward over the block, its context the target's tapped layers at every position before A.
    `confidence_threshold` > 0 (a drafter with a confidence head): propose only the leading candidates
    whose predicted survival (the product of their confidences) reaches it: a shorter block. `vocab`: the
    drafter's slots propose from that draft vocabulary (dmtp.models.draft_vocab; the MTP's own is `mtp`'s)."""
    injection = drafter.injection

    def propose(target, ids):
        a = ids.shape[1] - 1                                       # A's position
        out = target(ids, layer_ids=drafter.layer_ids)
        g = mtp.forward_teacher(ids, out.last_hidden) if injection.needs_mtp else None
        proposal = None
        if injection.mtp_steps:                                    # T1..TS from the MTP, m of them in the block
            chain = mtp_chain(mtp, ids, out.last_hidden, injection.mtp_steps)
            num = injection.choose_num_mtp(chain.logits)
            proposal = MTPBlockInputs(chain.tokens[:, None], chain.hidden[:, None], num[:, None])
        ctx_positions = torch.arange(a + 1)[None]                  # the target features up to A; the block sees < A
        ctx_kv = drafter.context_kv(drafter.context(out.layer_hidden, g), ctx_positions)
        block = drafter.draft_block(target.embed_tokens.weight, ids[:, a:], torch.tensor([[a]]), ctx_kv,
                                    ctx_positions, proposal, lm_head_weight=target.lm_head.weight, vocab=vocab)
        candidates = block.candidates[0, 0].tolist()
        if confidence_threshold > 0:
            survival = block.confidence[0, 0].cumprod(0).tolist()
            candidates = candidates[:sum(s >= confidence_threshold for s in survival)]
        return candidates
    return propose


def reference_proposal(proposer: Proposer, confidence_threshold: float = 0.0) -> Propose:
    """The reference proposal of one of the fast loop's proposers (the same models, no caches)."""
    if isinstance(proposer, DrafterProposer):
        mtp = proposer.mtp_state.mtp if proposer.mtp_state is not None else None
        return propose_drafter(proposer.dstate.drafter, mtp, confidence_threshold, proposer.dstate.vocab)
    if isinstance(proposer, MTPChainProposer):
        return propose_mtp_chain(proposer.mtp_state.mtp, proposer.num_candidates)
    if isinstance(proposer, ARProposer):
        return lambda target, ids: []                              # autoregressive: verify A alone
    raise TypeError(f"no reference proposal for {type(proposer).__name__}")


__all__ = ["reference_generate", "reference_proposal", "propose_drafter", "propose_mtp_chain", "mtp_chain"]
