"""The one interface every injection variant implements (SPEC §3).

A variant decides three things and nothing else:
1. the drafter's input slots for one block (`build_slots`), given the anchor A, the MTP's first
   candidate T1 and the MTP hidden that predicted T1;
2. where slot 0 sits relative to A (`first_slot_offset`: 0 when A is a slot, 1 when T1 is first);
3. the drafter's context features per position (`context_features`), from the target's tapped
   layers and, for context variants, the per-position MTP hidden.

Conventions shared by training and decoding (they call the same methods):
- A sits at position a; the drafter's context is every position < a.
- slot s sits at position a + first_slot_offset + s and predicts the token at that position;
  the last `num_drafter_candidates` slots are the drafter's predictions.
- `h_mtp` is the MTP hidden that PREDICTS T1 (g_a in dmtp's row convention), never the one after
  consuming T1.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from dmtp.models.qwen3 import RMSNorm

Embed = Callable[[torch.Tensor], torch.Tensor]
BLOCK_CANDIDATES = 7  # candidates per round in every method (the target verifies [A, c1..c7])


class Injection(nn.Module):
    uses_mtp: bool = True             # T1 comes from the native MTP
    first_slot_offset: int = 1        # slot 0 position minus A's position
    needs_mtp_context: bool = False   # context features include the per-position MTP hidden

    def __init__(self, hidden_size: int, num_target_features: int, mask_token_id: int):
        super().__init__()
        self.hidden_size = hidden_size
        self.num_target_features = num_target_features
        self.mask_token_id = mask_token_id
        self.init_kwargs: dict = {}  # saved with the drafter so the variant rebuilds identically

    # -- layout ---------------------------------------------------------------------------------
    @property
    def num_slots(self) -> int:
        return BLOCK_CANDIDATES + 1 - self.first_slot_offset

    @property
    def num_drafter_candidates(self) -> int:
        return BLOCK_CANDIDATES - (1 if self.uses_mtp else 0)

    @property
    def first_predicted_slot(self) -> int:
        return self.num_slots - self.num_drafter_candidates

    def slot_positions(self, anchor_positions: torch.Tensor) -> torch.Tensor:
        """[N] positions of A -> [N, num_slots] positions of the drafter's slots."""
        offsets = torch.arange(self.num_slots, device=anchor_positions.device) + self.first_slot_offset
        return anchor_positions[:, None] + offsets

    # -- context ----------------------------------------------------------------------------------
    @property
    def context_dim(self) -> int:
        return self.num_target_features * self.hidden_size

    def context_features(self, target_features: torch.Tensor, mtp_hidden: torch.Tensor | None) -> torch.Tensor:
        """[..., n*H] tapped target layers (+ [..., H] per-position MTP hidden) -> drafter fc input."""
        return target_features

    # -- slots ------------------------------------------------------------------------------------
    def mask_ids(self, n: int, count: int, device) -> torch.Tensor:
        return torch.full((n, count), self.mask_token_id, dtype=torch.long, device=device)

    def build_slots(self, embed: Embed, anchor: torch.Tensor, t1: torch.Tensor | None,
                    h_mtp: torch.Tensor | None) -> torch.Tensor:
        """anchor [N], t1 [N], h_mtp [N, H] -> slot embeddings [N, num_slots, H]."""
        raise NotImplementedError

    def t1_and_masks(self, embed: Embed, t1: torch.Tensor) -> torch.Tensor:
        """Embeddings of [T1, MASK x6]."""
        ids = torch.cat([t1[:, None], self.mask_ids(t1.shape[0], BLOCK_CANDIDATES - 1, t1.device)], dim=1)
        return embed(ids)


class LowRankResidual(nn.Module):
    """r = up(silu(down(RMS(h)))): the MTP hidden squeezed through a low-rank bottleneck."""

    def __init__(self, hidden_size: int, rank: int):
        super().__init__()
        self.norm = RMSNorm(hidden_size)
        self.down = nn.Linear(hidden_size, rank, bias=False)
        self.up = nn.Linear(rank, hidden_size, bias=False)
        nn.init.normal_(self.down.weight, std=0.02)
        nn.init.normal_(self.up.weight, std=0.02)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.up(torch.nn.functional.silu(self.down(self.norm(h.detach()))))


class TokenHiddenFusion(nn.Module):
    """W [RMS_e(E(T1)); RMS_m(sg(h_mtp))]: MTP-style fusion of the candidate and its predicting hidden."""

    def __init__(self, hidden_size: int, zero_init: bool):
        super().__init__()
        self.norm_embedding = RMSNorm(hidden_size)
        self.norm_mtp = RMSNorm(hidden_size)
        self.proj = nn.Linear(2 * hidden_size, hidden_size, bias=False)
        if zero_init:
            nn.init.zeros_(self.proj.weight)
        else:
            nn.init.normal_(self.proj.weight, std=0.02)

    def forward(self, e_t1: torch.Tensor, h_mtp: torch.Tensor) -> torch.Tensor:
        fused = torch.cat([self.norm_embedding(e_t1), self.norm_mtp(h_mtp.detach().to(e_t1.dtype))], dim=-1)
        return self.proj(fused)
