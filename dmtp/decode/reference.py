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


def mtp_chain(mtp, ids: torch.Tensor, target_hidden: torch.Tensor, steps: int):
    """The MTP's greedy chain T1..T_steps after the last token of ids [1, T], teacher-forced on the
    target's hidden states [1, T, H]; where the target's hidden is not known (after A), the MTP reads
    its own previous hidden. -> tokens [1, S], the hiddens that predicted them [1, S, H], logits [1, S, V]."""
    hidden_in = target_hidden          # row t of forward_teacher consumes (ids[t], hidden_in[t - 1])
    tokens, hiddens, logits = [], [], []
    for _ in range(steps):
        g = mtp.forward_teacher(ids, hidden_in)[:, -1]             # the row of the last token: predicts the next
        scores = mtp.logits(g)
        tokens.append(scores.argmax(-1))
        hiddens.append(g)
        logits.append(scores)
        ids = torch.cat([ids, tokens[-1][:, None]], dim=1)
        hidden_in = torch.cat([hidden_in[:, :-1], g[:, None], torch.zeros_like(g[:, None])], dim=1)
    return torch.stack(tokens, 1), torch.stack(hiddens, 1), torch.stack(logits, 1)


def propose_mtp_chain(mtp, steps: int) -> Propose:
    def propose(target, ids):
        return mtp_chain(mtp, ids, target(ids).last_hidden, steps)[0][0].tolist()
    return propose


def propose_drafter(drafter, mtp=None) -> Propose:
    """Raw DFlash or any DMTP variant (a `BlockDrafter`): the MTP's T1..Tm (m from its injection), then
    one drafter forward over the block, its context the target's tapped layers at every position before A."""
    injection = drafter.injection

    def propose(target, ids):
        a = ids.shape[1] - 1                                       # A's position
        out = target(ids, layer_ids=drafter.layer_ids)
        g = mtp.forward_teacher(ids, out.last_hidden) if injection.needs_mtp else None
        tokens = hidden = None
        num = torch.zeros(1, dtype=torch.long)
        if injection.mtp_steps:
            tokens, hidden, logits = mtp_chain(mtp, ids, out.last_hidden, injection.mtp_steps)
            num = injection.choose_num_mtp(logits)
        context = drafter.context(out.layer_hidden, g)
        ctx_positions = torch.arange(a + 1)[None]
        embed = lambda x: drafter.embed(x, target.embed_tokens.weight)  # noqa: E731
        slots = injection.build_block(embed, ids[:, a], tokens, hidden, num)
        positions = injection.slot_positions(torch.tensor([a]))
        limit = torch.full_like(positions, a)                      # the context strictly before A
        h = drafter(slots, positions, drafter.context_kv(context, ctx_positions), ctx_positions, limit,
                    torch.zeros_like(positions))
        first_prev = tokens[:, 0] if injection.uses_mtp else ids[:, a]
        drafted, _ = drafter.propose(h[:, injection.first_predicted_slot:], target.lm_head.weight, first_prev)
        return injection.merge_candidates(tokens, drafted, num)[0].tolist()
    return propose


def reference_proposal(proposer: Proposer) -> Propose:
    """The reference proposal of one of the fast loop's proposers (the same models, no caches)."""
    if isinstance(proposer, DrafterProposer):
        mtp = proposer.mtp_state.mtp if proposer.mtp_state is not None else None
        return propose_drafter(proposer.dstate.drafter, mtp)
    if isinstance(proposer, MTPChainProposer):
        return propose_mtp_chain(proposer.mtp_state.mtp, proposer.num_candidates)
    if isinstance(proposer, ARProposer):
        return lambda target, ids: []                              # autoregressive: verify A alone
    raise TypeError(f"no reference proposal for {type(proposer).__name__}")


__all__ = ["reference_generate", "reference_proposal", "propose_drafter", "propose_mtp_chain", "mtp_chain"]
