"""The decode loop's device state: every tensor a round reads or writes, allocated once per (batch bucket,
cache length) from three small records (what it is sized for, the target's widths, what the proposer reads
back from verification)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dmtp.decode.runners import TargetRunner
from dmtp.decode.sampling import SamplingConfig
from dmtp.decode.verify_length.stats import LengthStats


@dataclass(frozen=True)
class StateSize:
    """What one allocation is for: the batch bucket, the cache slots, the candidates per round (K) and the
    output budget per request."""
    batch: int
    max_len: int
    num_candidates: int
    max_new: int


@dataclass(frozen=True)
class TargetWidths:
    """The target's widths and placement, which size the buffers verification fills."""
    vocab_size: int
    hidden_size: int
    feature_dim: int     # the drafter's concatenated taps (0: none)
    device: torch.device
    dtype: torch.dtype


@dataclass(frozen=True)
class ProposerReads:
    """What the proposer reads back from each verify forward: the last hidden states (an MTP proposes from
    them) and the tapped features (a drafter's context)."""
    last_hidden: bool
    features: bool


class DecodeState:
    """Every tensor a round reads or writes, allocated once per (batch bucket, max length)."""

    def __init__(self, size: StateSize, widths: TargetWidths, reads: ProposerReads, sampling: SamplingConfig,
                 runner: TargetRunner, eos_ids: Sequence[int]):
        batch, max_len, max_new = size.batch, size.max_len, size.max_new
        vocab_size, hidden_size, feature_dim = widths.vocab_size, widths.hidden_size, widths.feature_dim
        dtype = widths.dtype
        self.batch, self.max_len, self.device, self.dtype = batch, max_len, torch.device(widths.device), dtype
        self.num_candidates = k = size.num_candidates
        self.width = w = k + 1
        self.longest_bound = 0   # host-side: the longest prompt of the batch (set at prefill)
        self.vocab_size = vocab_size
        sampling.check_vocabulary(vocab_size)
        self.sampling = sampling
        self.runner = runner
        self.max_new_cap = max_new
        self.generator: torch.Generator | None = None
        self.request_ids: list[int] = []
        dev = self.device
        z = lambda *s, dt=torch.long: torch.zeros(*s, dtype=dt, device=dev)  # noqa: E731
        self.offsets = torch.arange(w, device=dev)
        self.eos = torch.tensor(list(eos_ids) or [-1], dtype=torch.long, device=dev)
        self.max_new = z(())
        self.anchor = z(batch)
        self.candidates = z(batch, k)
        self.q = torch.zeros(batch, k, vocab_size, dtype=torch.float32, device=dev) if sampling.uses_draft_probs else None
        # The round's outcome the proposer catches up from: the target's token at every verified row (its argmax
        # or sample; the committed ones are the accepted prefix and the token after it) and the candidates each
        # request kept (accepted, cut at EOS and at the budget).
        self.target_tokens = z(batch, w)
        self.kept = z(batch)
        # Candidates verified this round (confidence-scheduled verification; K when off) and their sum
        # over the rounds each request was active (what an engine that packs verify rows would run).
        self.verify_limit = torch.full((batch,), k, dtype=torch.long, device=dev)
        self.verified = z(batch)
        # verify_length=auto: the proposer's per-candidate confidence this round ([B, K], each candidate's
        # predicted acceptance given the one before it; 1 where it has none) and the rounds' record for the
        # length policy (`LengthStats`, read at the loop's polls).
        chooses = sampling.chooses_length and k > 0
        self.confidence = torch.ones(batch, k, dtype=torch.float32, device=dev) if chooses else None
        self.length_stats = LengthStats(batch, k, dev) if chooses else None
        self.round_start = z(batch)   # each request's committed length before the round: where A sits
        self.h_verify = torch.zeros(batch, w, hidden_size, dtype=dtype, device=dev) if reads.last_hidden else None
        self.f_verify = torch.zeros(batch, w, feature_dim, dtype=dtype, device=dev) if reads.features else None
        self.out_tokens = z(batch, max_new + w)
        self.out_len = z(batch)
        self.done = z(batch, dt=torch.bool)
        self.rounds_cap = max_new + 64
        self.acc_log = z(self.rounds_cap, batch)
        self.raw_log = z(self.rounds_cap, batch)
        self.round_idx = z(1)

    def target_lengths(self) -> torch.Tensor:
        return self.runner.lengths

    @property
    def span(self) -> int | None:
        """How many cache slots from 0 this round's stages attend to (target, MTP and drafter caches
        alike; None: all `max_len`): the runner's span, which only the eager loop sets."""
        return self.runner.span

    def reset(self) -> None:
        """Back to a harmless all-zero state (after graph warm-up; before a prefill)."""
        for t in (self.anchor, self.candidates, self.target_tokens, self.kept, self.round_start, self.out_tokens, self.out_len,
                  self.round_idx, self.runner.lengths, self.verified):
            t.zero_()
        self.verify_limit.fill_(self.num_candidates)
        if self.confidence is not None:
            self.confidence.fill_(1.0)
            self.length_stats.reset()
        self.acc_log.fill_(-1)
        self.raw_log.fill_(-1)
        self.done.zero_()
        if self.q is not None:
            self.q.zero_()


__all__ = ["DecodeState", "ProposerReads", "StateSize", "TargetWidths"]
