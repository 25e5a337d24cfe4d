"""The native MTP's chain T1..TS (`chain_mtp`, the one chain rule every caller runs) and its teacher-forced
backend for many anchors at once (`TeacherChain`).

`chain_mtp` says what a chain is: T_j is picked from the hidden h_j that predicts it (h_1: the MTP row of
A, built from the target's states); h_{j+1} is the MTP row that consumes (T_j, h_j). How a row is
computed is the caller's `step`: the reference round reruns the MTP over the whole sequence, the
decoding loop writes scratch rows of its static cache, training and the validation walk use
`TeacherChain` below.

The native MTP chained from many anchors of teacher-forced sequences at once, as decoding chains it.

In decoding, chain step j from anchor a is the MTP row at position a + j that consumes (T_j, h_j)
(h_1 = g_a, the hidden that predicted T1; h_{j+1} the step's output) and attends over the MTP's
committed rows 1..a (built from the target's hidden states) plus the chain's own rows a+1..a+j.

`TeacherChain` gives every anchor of a batch exactly those keys in one call per step: one cache per
sequence holds the teacher-forced rows at slots 1..T-1 (the rows `NativeMTP.forward_teacher`
computes) and, after them, a private run of `steps` slots per anchor for its chain; a mask shows each
chain row the teacher slots 1..a and its own chain's slots up to itself (the MTP's analogue of the
drafter's `dflash_attention_mask`). Rows are RoPE'd at their true positions; only the slots they are
stored in differ from decoding's, which attention does not see. The block's own cache protocol
(`new_cache`, `write(positions, ...)`) is used, so every MTP family's block works unchanged.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dmtp.models.qwen3 import additive_mask, cache_mask


@dataclass
class MTPChain:
    """tokens [..., S] (T1..TS); hidden [..., S, H] (h_j, the hidden that predicted T_j); logits
    [..., S, V] when kept; q [..., S, V] when the picks were sampled (None when greedy or fed)."""
    tokens: torch.Tensor
    hidden: torch.Tensor
    logits: torch.Tensor | None = None
    q: torch.Tensor | None = None


def greedy_pick(scores: torch.Tensor):
    return scores.argmax(-1), None


def chain_mtp(mtp, first_hidden: torch.Tensor, steps: int,
              step: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor],
              pick: Callable = greedy_pick, tokens: torch.Tensor | None = None, keep_logits: bool = False) -> MTPChain:
    """The MTP's chain of `steps` tokens from `first_hidden` [..., H] (h_1). `step(j, T_j, h_j)` -> h_{j+1}
    (j = 1..steps-1) is the row that consumes the chain's j-th token; `pick(logits)` -> (token, q or
    None) chooses each token (greedy by default); `tokens` [..., steps] feeds given tokens instead
    (teacher forcing: no logits are computed)."""
    h = first_hidden
    toks, hiddens, logits, qs = [], [], [], []
    for j in range(steps):
        if j:
            h = step(j, toks[-1], h)
        hiddens.append(h)
        if tokens is None:
            scores = mtp.logits(h)
            tok, q = pick(scores)
            toks.append(tok)
            logits.append(scores)
            qs.append(q)
        else:
            toks.append(tokens[..., j])
    keep = keep_logits and tokens is None
    return MTPChain(torch.stack(toks, -1), torch.stack(hiddens, -2), torch.stack(logits, -2) if keep else None,
                    torch.stack(qs, -2) if qs and qs[0] is not None else None)


class _SlotCache:
    """A block's cache whose writes land at `slots` instead of at the rows' positions.

    Under autograd (a jointly trained MTP), each write goes to a fresh copy, so the tensors an earlier step's
    attention saved for backward are never modified in place."""

    def __init__(self, cache):
        self._cache = cache
        self.slots: torch.Tensor | None = None

    def write(self, positions, *tensors):
        if torch.is_grad_enabled():
            for name, value in vars(self._cache).items():
                if isinstance(value, torch.Tensor):
                    setattr(self._cache, name, value.clone())
        self._cache.write(self.slots, *tensors)

    def __getattr__(self, name):
        return getattr(self._cache, name)


class TeacherChain:
    """input_ids [B, T], target_hidden [B, T, H] (post final norm), anchors [B, N], steps >= 1:
    `step(j, tokens, prev_hidden)` for j = 1..steps gives the hidden after chain step j from every
    anchor (it predicts T_{j+1})."""

    def __init__(self, mtp, input_ids: torch.Tensor, target_hidden: torch.Tensor, anchors: torch.Tensor, steps: int):
        b, t = input_ids.shape
        n = anchors.shape[1]
        self.mtp, self.anchors, self.steps, self.t = mtp, anchors, steps, t
        dev = input_ids.device
        width = t + n * steps
        self.cache = _SlotCache(mtp.new_cache(b, width, device=dev))
        # The teacher-forced rows (row p consumes x_p and h_{p-1}; it sees slots 1..p): only their K/V
        # are needed, the chain starts from the given h_1.
        positions = torch.arange(1, t, device=dev).expand(b, -1)
        self.cache.slots = positions
        u = mtp.fuse(input_ids[:, 1:], target_hidden[:, :-1])
        mask = additive_mask(cache_mask(positions, width, first_valid=1), u.dtype)
        for layer in mtp.layers:
            layer(u, positions, mask, cache=self.cache)
        slot = torch.arange(width, device=dev)
        self.teacher_visible = (slot >= 1) & (slot < t) & (slot <= anchors[..., None])       # [B, N, W]: slots 1..a
        self.chain_start = t + torch.arange(n, device=dev) * steps                            # [N]
        self.slot = slot

    def step(self, j: int, tokens: torch.Tensor, prev_hidden: torch.Tensor) -> torch.Tensor:
        """Chain step j (1-based): tokens [B, N] (T_j), prev_hidden [B, N, H] (h_j) -> [B, N, H]."""
        if not 1 <= j <= self.steps:
            raise ValueError(f"chain step {j} outside 1..{self.steps}")
        start = self.chain_start[:, None]
        own = (self.slot >= start) & (self.slot < start + j)                                   # [N, W]
        u = self.mtp.fuse(tokens, prev_hidden)
        mask = additive_mask((self.teacher_visible | own)[:, None], u.dtype)
        self.cache.slots = (self.chain_start + (j - 1)).expand(tokens.shape[0], -1)
        positions = self.anchors + j
        for layer in self.mtp.layers:
            u = layer(u, positions, mask, cache=self.cache)
        return self.mtp.norm(u)
