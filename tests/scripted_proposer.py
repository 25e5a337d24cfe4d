"""A proposer for tests: proposes given continuations, optionally corrupting one candidate, so a test
knows exactly how many candidates greedy verification accepts (acceptance, rollback and runner tests)."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from dmtp.decode.proposers import Proposer
from dmtp.decode.stage import Stage, present


class ScriptedProposer(Proposer):
    """Proposes each request's given continuation (e.g. the target's own greedy output computed
    beforehand): candidate i of a round is continuation[out_len + i]. With `corrupt_at = j` (1-based)
    candidate j is replaced by a different token, so greedy verification accepts exactly j - 1
    candidates per round (fewer only where the budget or EOS cuts the round); a list gives each
    request its own j (None: nothing corrupted, all K accepted), so one round mixes lengths. With
    `reject_first_rounds = N` every candidate of the first N rounds is wrong (rollback tests)."""

    def __init__(self, continuations: Sequence[Sequence[int]], num_candidates: int,
                 corrupt_at: int | Sequence[int | None] | None = None, vocab_size: int | None = None,
                 name: str = "scripted", reject_first_rounds: int = 0):
        per_request = list(corrupt_at) if isinstance(corrupt_at, Sequence) else [corrupt_at] * len(continuations)
        if len(per_request) != len(continuations):
            raise ValueError(f"corrupt_at has {len(per_request)} entries for {len(continuations)} continuations")
        if any(j is not None and not 1 <= j <= num_candidates for j in per_request):
            raise ValueError(f"corrupt_at must be in 1..{num_candidates}")
        self.continuations = [list(c) for c in continuations]
        self.num_candidates = num_candidates
        self.corrupt_at = per_request
        self.reject_first_rounds = reject_first_rounds  # rounds whose candidates are all wrong
        self.vocab_size = vocab_size
        self.name = name

    def allocate(self, st) -> None:
        width = max(len(c) for c in self.continuations) + st.width + 1
        self.ref = torch.zeros(st.batch, width, dtype=torch.long, device=st.device)
        self.offsets = torch.arange(self.num_candidates, device=st.device)
        self.vocab = self.vocab_size or st.vocab_size
        self.corrupt = torch.zeros(st.batch, self.num_candidates, dtype=torch.bool, device=st.device)

    def prefill(self, st, ids, lengths, out) -> None:
        self.ref.zero_()
        self.corrupt.zero_()
        for row, rid in enumerate(st.request_ids):
            c = self.continuations[rid]
            if c:
                self.ref[row, :len(c)] = torch.tensor(c, device=self.ref.device)
            if self.corrupt_at[rid] is not None:
                self.corrupt[row, self.corrupt_at[rid] - 1] = True

    def propose_stages(self, st) -> list[Stage]:
        def propose():
            idx = (st.out_len[:, None] + self.offsets).clamp(max=self.ref.shape[1] - 1)
            cand = self.ref.gather(1, idx)
            cand = torch.where(self.corrupt, (cand + 1) % self.vocab, cand)
            if self.reject_first_rounds:
                cand = torch.where(st.round_idx < self.reject_first_rounds, (cand + 1) % self.vocab, cand)
            st.candidates.copy_(cand)
            if st.q is not None:  # a point mass on each proposal
                st.q.zero_().scatter_(2, cand[..., None], 1.0)

        return [Stage("drafter", propose, writes=present(st.candidates, st.q))]
