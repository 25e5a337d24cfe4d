"""A zero-init low-rank correction of the frozen native MTP's logits, trained on the target's own outputs.

The MTP was pretrained with the target on the data distribution; verification compares against the
target. Where they disagree (the tiny target's MTP agrees with its target's greedy token 67-80% of the
time), every DMTP block is capped by a rejected T1. The correction moves the MTP's proposal toward the
target without touching its weights:

    g' = g + up(silu(down(RMS(g))))        up = 0 at init: exactly the native MTP at step 0
    logits = LMHead(g')                     the target's head, shared and frozen

It acts on the hidden that predicts each token (after the MTP's final norm), so it corrects T1 and, along
the MTP's own chain, every later token it proposes. Its parameters are the drafter's (trained, saved and
shipped with it); the MTP's pretrained layers stay frozen, so its pretrained skill stays where the target's
outputs teach nothing new. The hidden the drafter's injection reads (h_mtp) is the MTP's own, uncorrected.

`ProposingMTP` is the MTP as a drafter proposes with it: the native module's rows, caches and hiddens, its
logits through the correction. Every caller that picks the MTP's tokens (decoding, the reference round,
the validation walk) reads `.logits` from it; the native MTP is still what the baselines (mtp415) chain.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dmtp.models.qwen3 import RMSNorm


def require_correction_rank(rank) -> int:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"mtp_correction_rank must be an integer >= 0 (0: no correction), got {rank!r}")
    return rank


class MTPCorrection(nn.Module):
    """g [..., H] -> g + up(silu(down(RMS(g)))), `rank` wide; `up` starts at zero."""

    def __init__(self, hidden_size: int, rank: int):
        super().__init__()
        self.rank = require_correction_rank(rank)
        # Trained on the target's greedy token (hard labels, CE): it sharpens the MTP toward the argmax, which greedy
        # verification wants and sampling does not (the sampled overlap sum min(p, q) falls); decoding then proposes
        # sampled tokens with the native MTP (`BlockDrafter.proposing_mtp`). Set by training, saved with the drafter.
        self.greedy_only = False
        if rank < 1:
            raise ValueError("an MTP correction needs rank >= 1")
        self.norm = RMSNorm(hidden_size)
        self.down = nn.Linear(hidden_size, rank, bias=False)
        self.up = nn.Linear(rank, hidden_size, bias=False)
        if not self.up.weight.is_meta:
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        nn.init.normal_(self.down.weight, std=0.02)
        nn.init.zeros_(self.up.weight)

    def forward(self, g: torch.Tensor) -> torch.Tensor:
        x = g.to(self.down.weight.dtype)
        return g + self.up(F.silu(self.down(self.norm(x)))).to(g.dtype)


class ProposingMTP:
    """The native MTP (`mtp`) with its logits through `correction`; every other attribute is the MTP's own."""

    def __init__(self, mtp, correction: MTPCorrection):
        self.native = mtp
        self.correction = correction

    def logits(self, g: torch.Tensor, vocab=None) -> torch.Tensor:
        return self.native.logits(self.correction(g), vocab=vocab)

    def __getattr__(self, name):
        return getattr(self.native, name)


__all__ = ["MTPCorrection", "ProposingMTP", "require_correction_rank"]
