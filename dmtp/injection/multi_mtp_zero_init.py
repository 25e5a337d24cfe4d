"""Adaptive multi-step MTP before the block (the blog's "next steps"): the MTP proposes T1..Tm, the
drafter fills the rest of the block in one forward.

Dual-anchor zero-init slots for every m: [E(A), E(T1) + D1, ..., E(Tm) + Dm, MASK x (B - 1 - m)], D_j =
W[RMS_e(E(T_j)); RMS_m(sg(h_j))] with one shared zero-initialised W (h_j: the MTP hidden that predicted T_j along
its own chain).

One W for every j, not one per position: every D_j is the same job (fuse a token with the hidden
that predicted it), m = 1 is then exactly `dual_anchor_zero_init` (same tensors, same function), and
late positions, which training sees only for the blocks that sample a large m, share what the
frequent early ones learn.

- Training: m is drawn uniformly from 1..max_mtp_tokens per block, so one drafter serves every m.
- Decoding: the MTP chains `num_mtp_tokens` steps every round (default max_mtp_tokens; a fixed
  count keeps the graphs static), and m per request is all of them (`mtp_threshold` null or 0) or,
  adaptively, 1 + the number of leading steps j >= 2 whose top-1 probability (the MTP's own
  softmax) reaches `mtp_threshold` (T1 is always proposed: nothing is accepted without it).
The block keeps its B slots whatever m is; slots past m are plain MASKs, and the drafter's candidates
for positions <= m are replaced by the MTP's (`merge_candidates`)."""
from __future__ import annotations

import torch

from dmtp.injection.base import Injection, TokenHiddenFusion
from dmtp.injection.catalogue import register_variant


def _check_options(max_mtp_tokens, mtp_threshold, num_mtp_tokens, num_candidates: int) -> None:
    if type(max_mtp_tokens) is not int or not 1 <= max_mtp_tokens <= num_candidates:
        raise ValueError(f"max_mtp_tokens must be an integer in 1..{num_candidates} (the block's candidates, "
                         f"block_size - 1; injection.max_mtp_tokens=...), got {max_mtp_tokens!r}")
    if num_mtp_tokens is not None and (type(num_mtp_tokens) is not int or not 1 <= num_mtp_tokens <= max_mtp_tokens):
        raise ValueError(f"num_mtp_tokens must be an integer in 1..max_mtp_tokens={max_mtp_tokens} (null: "
                         f"{max_mtp_tokens}), got {num_mtp_tokens!r}")
    number = isinstance(mtp_threshold, (int, float)) and not isinstance(mtp_threshold, bool)
    if mtp_threshold is not None and mtp_threshold != 0 and (not number or not 0 < mtp_threshold < 1):
        raise ValueError(f"mtp_threshold must be in (0, 1) (null or 0: a fixed m), got {mtp_threshold!r}")


@register_variant(name="multi_mtp_zero_init",
                  slots="[E(A), E(T1)+D1, ..., E(Tm)+Dm, MASK x(7-m)]",
                  injected="the MTP proposes T1..Tm (m per request per round), the drafter the rest; "
                           "one shared zero-init W (m = 1 is `dual_anchor_zero_init`)",
                  label="[A, E(T1..Tm)+D, MASK x(7-m)]")
class MultiMTPZeroInit(Injection):
    first_slot_offset = 0
    decoding_options = ("num_mtp_tokens", "mtp_threshold")   # max_mtp_tokens (M) is what it was trained for

    def __init__(self, hidden_size, num_target_features, mask_token_id, block_size, max_mtp_tokens: int = 3,
                 mtp_threshold: float | None = None, num_mtp_tokens: int | None = None):
        super().__init__(hidden_size, num_target_features, mask_token_id, block_size)
        _check_options(max_mtp_tokens, mtp_threshold, num_mtp_tokens, self.num_candidates)
        self.fusion = TokenHiddenFusion(hidden_size, zero_init=True)
        self._max = max_mtp_tokens
        self.mtp_threshold = float(mtp_threshold) if mtp_threshold else None
        self._steps = num_mtp_tokens or max_mtp_tokens

    @property
    def max_mtp_tokens(self) -> int:
        return self._max

    @property
    def mtp_steps(self) -> int:
        return self._steps

    @property
    def mtp_fills_block(self) -> bool:
        return super().mtp_fills_block and self.mtp_threshold is None   # adaptive m hands slots to the drafter

    def sample_num_mtp(self, shape, draws=None, device=None):
        if draws is None:
            return torch.randint(1, self._max + 1, tuple(shape), device=device)
        return draws.integers(1, self._max + 1, shape, device)

    def choose_num_mtp(self, mtp_logits):
        steps = mtp_logits.shape[-2]
        if self.mtp_threshold is None or steps == 1:
            return super().choose_num_mtp(mtp_logits)
        confidence = torch.softmax(mtp_logits[..., 1:, :].float(), dim=-1).amax(-1)   # steps 2..S
        return 1 + (confidence >= self.mtp_threshold).long().cumprod(-1).sum(-1)

    def block_slots(self, embed, anchor, mtp_tokens, mtp_hidden, num_mtp):
        n, steps = mtp_tokens.shape
        if num_mtp is None:
            num_mtp = torch.full((n,), steps, dtype=torch.long, device=anchor.device)
        used = torch.arange(1, steps + 1, device=anchor.device) <= num_mtp[:, None]       # [N, S]: T_j in the block
        tokens = torch.where(used, mtp_tokens, self.mask_token_id)
        rest = self.mask_ids(n, self.num_candidates - steps, anchor.device)
        e = embed(torch.cat([anchor[:, None], tokens, rest], dim=1))                       # [N, B, H]
        e_tok = e[:, 1:steps + 1]
        fused = e_tok + self.fusion(e_tok, mtp_hidden).to(e.dtype)
        return torch.cat([e[:, :1], torch.where(used[..., None], fused, e_tok), e[:, steps + 1:]], dim=1)

    def build_slots(self, embed, anchor, t1, h_mtp):
        """[E(A), E(T1) + D1, MASK x (B-2)]: the block with m = 1."""
        return self.block_slots(embed, anchor, t1[:, None], h_mtp[:, None], None)
