"""The one interface every injection variant implements (SPEC §3).

A variant decides these things and nothing else:
1. the drafter's input slots for one block (`build_slots`), given the anchor A, the MTP's first
   candidate T1 and the MTP hidden that predicted T1 (`build_block` is the general entry point:
   the MTP's tokens T1..TS, their hiddens and how many of them, m, each block uses);
2. where slot 0 sits relative to A (`first_slot_offset`: 0 when A is a slot, 1 when T1 is first);
3. the drafter's context features per position (`context_features`), from the target's tapped
   layers and, for context variants, the per-position MTP hidden;
4. how many MTP tokens a block holds: at most `max_mtp_tokens` (training samples m per block with
   `sample_num_mtp`), `mtp_steps` chained MTP steps per decoding round, m chosen per request from
   the chain's logits (`choose_num_mtp`). Every variant but the multi-step one has m = 1 (0 for
   raw DFlash), so these are constants for them.

Conventions shared by training and decoding (they call the same methods):
- A sits at position a; the drafter's context is every position < a.
- slot s sits at position a + first_slot_offset + s and predicts the token at that position;
  the last `num_drafter_candidates` slots are the drafter's predictions. With m MTP tokens in the
  block, the drafter's predictions for candidates 1..m are unused (`drafter_slot_mask`): the MTP's
  tokens replace them (`merge_candidates`), through `torch.where` on a per-request m, so every
  shape stays fixed.
- `h_mtp` is the MTP hidden that PREDICTS T1 (g_a in dmtp's row convention), never the one after
  consuming T1; h_j, likewise, is the hidden that predicted T_j along the MTP's own chain.
- The MTP hidden enters the slots through a stop-gradient (`build_block`), lifted only when the
  MTP trains with the drafter (`mtp_grad=True`, model.train_mtp).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from dmtp.models.block_size import require_block_size
from dmtp.models.qwen3 import RMSNorm

Embed = Callable[[torch.Tensor], torch.Tensor]


class Injection(nn.Module):
    uses_mtp: bool = True             # T1 comes from the native MTP
    first_slot_offset: int = 1        # slot 0 position minus A's position
    needs_mtp_context: bool = False   # context features include the per-position MTP hidden
    # Whether the target's MTP must be loaded for this variant: the one answer training, decoding and
    # the entry points ask for (derived per class from the two above, never set by hand).
    needs_mtp: bool = True
    # The options a saved drafter may be given at decoding time (dmtp.infer's drafter.injection_options);
    # every other option is what its tensors were trained with and is fixed on load.
    decoding_options: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.needs_mtp = cls.uses_mtp or cls.needs_mtp_context

    def __init__(self, hidden_size: int, num_target_features: int, mask_token_id: int, block_size: int):
        super().__init__()
        self.hidden_size = hidden_size
        self.num_target_features = num_target_features
        self.mask_token_id = mask_token_id
        # B, the verified width: the target verifies [A, c1..c_{B-1}] (the drafter's block_size, or a
        # shorter one chosen at decoding time; the drafter sets it, see dmtp.drafters.block_drafter).
        self.block_size = require_block_size(block_size)
        # The options it was built with, saved with the drafter so that it rebuilds identically; the
        # catalogue's `register_variant` records them from the constructor's call.
        self.variant_options: dict = {}

    # -- layout ---------------------------------------------------------------------------------
    @property
    def num_candidates(self) -> int:
        """K = B - 1 candidates per round in every method (the target verifies [A, c1..cK])."""
        return self.block_size - 1

    @property
    def num_slots(self) -> int:
        return self.block_size - self.first_slot_offset

    @property
    def num_drafter_candidates(self) -> int:
        return self.num_candidates - (1 if self.uses_mtp else 0)

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

    # -- MTP tokens per block ---------------------------------------------------------------------
    @property
    def max_mtp_tokens(self) -> int:
        """The most MTP tokens one block holds (M): 1 when T1 comes from the MTP, 0 for raw DFlash."""
        return 1 if self.uses_mtp else 0

    @property
    def mtp_steps(self) -> int:
        """Chained MTP steps per decoding round (S <= M): the proposals T1..TS every round computes."""
        return self.max_mtp_tokens

    @property
    def mtp_fills_block(self) -> bool:
        """Whether every candidate of every decoding round is the MTP's (its chain covers the block and m is always
        all of it): the drafter's forward then proposes nothing that is verified, and decoding runs the MTP's chain
        alone (`dmtp.decode.loop.build_proposer`).

        Fixed here: m = S, so whenever S = K."""
        return self.uses_mtp and self.mtp_steps == self.num_candidates

    def sample_num_mtp(self, shape, draws=None, device=None) -> torch.Tensor:
        """Training: m for each block [*shape] (long), from `draws` (dmtp.training.draws: `integers`).

        Fixed here: every block holds M tokens."""
        return torch.full(tuple(shape), self.max_mtp_tokens, dtype=torch.long, device=device)

    def choose_num_mtp(self, mtp_logits: torch.Tensor) -> torch.Tensor:
        """Decoding (and the exact validation walk): m per request from the chain's logits
        [..., S, V] -> [...] long in 1..S. Fixed here: all S."""
        return torch.full(mtp_logits.shape[:-2], mtp_logits.shape[-2], dtype=torch.long, device=mtp_logits.device)

    def drafter_slot_mask(self, num_mtp: torch.Tensor) -> torch.Tensor:
        """[...] m -> [..., num_drafter_candidates] bool: True where the predicted slot is a real
        prediction (its candidate comes after the block's m MTP tokens; earlier ones are inputs)."""
        first = self.first_slot_offset + self.first_predicted_slot   # candidate number of the first predicted slot
        number = torch.arange(self.num_drafter_candidates, device=num_mtp.device) + first
        return number > num_mtp[..., None]

    def merge_candidates(self, mtp_values: torch.Tensor | None, drafted: torch.Tensor,
                         num_mtp: torch.Tensor) -> torch.Tensor:
        """The block's K candidates (or any per-candidate values, e.g. q [..., K, V]): candidate j is
        the MTP's j-th for j <= m, else the drafter's. mtp_values [..., S, *rest] (None: no MTP),
        drafted [..., num_drafter_candidates, *rest], num_mtp [...] -> [..., K, *rest]."""
        if mtp_values is None:
            return drafted
        d = num_mtp.dim()
        k = self.num_candidates
        fixed = k - self.num_drafter_candidates      # candidates that always come from the MTP
        by_drafter = torch.cat([mtp_values.narrow(d, 0, fixed), drafted], dim=d)
        steps = mtp_values.shape[d]
        if steps == fixed:   # m is constant: nothing to choose (every variant but the multi-step one)
            return by_drafter
        by_mtp = torch.cat([mtp_values, by_drafter.narrow(d, steps, k - steps)], dim=d)
        use_mtp = torch.arange(k, device=num_mtp.device) < num_mtp[..., None]
        use_mtp = use_mtp.view(*use_mtp.shape, *([1] * (by_mtp.dim() - use_mtp.dim())))
        return torch.where(use_mtp, by_mtp, by_drafter)

    def forced_drafter_slots(self, mtp_tokens: torch.Tensor, num_mtp: torch.Tensor):
        """(tokens, use) [..., num_drafter_candidates]: the predicted slots whose candidate is the MTP's (j <= m,
        the multi-step variant) and its token there, so that a proposal sequential in the previous token
        (DSpark's Markov head, DFlash2's selector) walks through the tokens the block really holds, as
        training's teacher-forced path does. mtp_tokens [..., S], num_mtp [...].

        None when no predicted slot can hold an MTP token (every variant but the multi-step one)."""
        n = self.num_drafter_candidates
        fixed = self.num_candidates - n                       # candidates that always come from the MTP
        if mtp_tokens.shape[-1] <= fixed:
            return None
        index = torch.arange(fixed, fixed + n, device=mtp_tokens.device)   # candidate j = index + 1
        steps = mtp_tokens.shape[-1]
        tokens = mtp_tokens.gather(-1, index.clamp(max=steps - 1).expand(*mtp_tokens.shape[:-1], n))
        return tokens, (index + 1) <= num_mtp[..., None]

    # -- slots ------------------------------------------------------------------------------------
    def build_block(self, embed: Embed, anchor: torch.Tensor, mtp_tokens: torch.Tensor | None,
                    mtp_hidden: torch.Tensor | None, num_mtp: torch.Tensor | None = None,
                    mtp_grad: bool = False) -> torch.Tensor:
        """What training and decoding call: anchor [N], mtp_tokens [N, S] (T1..TS), mtp_hidden
        [N, S, H] (h_j predicted T_j), num_mtp [N] (m) -> slot embeddings [N, num_slots, H].
        The MTP hidden is stop-gradiented here (SPEC's sg) unless the MTP trains (`mtp_grad`)."""
        if mtp_hidden is not None and not mtp_grad:
            mtp_hidden = mtp_hidden.detach()
        return self.block_slots(embed, anchor, mtp_tokens, mtp_hidden, num_mtp)

    def block_slots(self, embed: Embed, anchor: torch.Tensor, mtp_tokens: torch.Tensor | None,
                    mtp_hidden: torch.Tensor | None, num_mtp: torch.Tensor | None) -> torch.Tensor:
        """One MTP token per block (m = 1): the slots from T1 and its hidden."""
        t1 = None if mtp_tokens is None else mtp_tokens[:, 0]
        h = None if mtp_hidden is None else mtp_hidden[:, 0]
        return self.build_slots(embed, anchor, t1, h)

    def mask_ids(self, n: int, count: int, device) -> torch.Tensor:
        return torch.full((n, count), self.mask_token_id, dtype=torch.long, device=device)

    def build_slots(self, embed: Embed, anchor: torch.Tensor, t1: torch.Tensor | None,
                    h_mtp: torch.Tensor | None) -> torch.Tensor:
        """anchor [N], t1 [N], h_mtp [N, H] -> slot embeddings [N, num_slots, H]."""
        raise NotImplementedError

    def t1_and_masks(self, embed: Embed, t1: torch.Tensor) -> torch.Tensor:
        """Embeddings of [T1, MASK x (B-2)]."""
        ids = torch.cat([t1[:, None], self.mask_ids(t1.shape[0], self.num_candidates - 1, t1.device)], dim=1)
        return embed(ids)

    def previous_token(self, anchor: torch.Tensor, mtp_tokens: torch.Tensor | None) -> torch.Tensor:
        """The token just before the first slot the drafter predicts (what a DFlash2 selector path starts
        from): T1 when the MTP proposes it, else A. anchor [...], mtp_tokens [..., S] or None -> [...].
        The one rule for decoding (T1 = the MTP's proposal) and training (T1 = the data token)."""
        return mtp_tokens[..., 0] if self.uses_mtp else anchor


class LowRankResidual(nn.Module):
    """r = up(silu(down(RMS(h)))): the MTP hidden squeezed through a low-rank bottleneck."""

    def __init__(self, hidden_size: int, rank: int):
        super().__init__()
        self.norm = RMSNorm(hidden_size)
        self.down = nn.Linear(hidden_size, rank, bias=False)
        self.up = nn.Linear(rank, hidden_size, bias=False)
        nn.init.normal_(self.down.weight, std=0.02)
        nn.init.normal_(self.up.weight, std=0.02)

    def forward(self, h: torch.Tensor) -> torch.Tensor:   # h arrives stop-gradiented (Injection.build_block)
        return self.up(torch.nn.functional.silu(self.down(self.norm(h))))


class TokenHiddenFusion(nn.Module):
    """W [RMS_e(E(T1)); RMS_m(sg(h_mtp))]: MTP-style fusion of the candidate and its predicting hidden
    (row-wise: any leading dims, e.g. [N, S, H] for the multi-step variant's T1..TS).

    The sg is applied by `Injection.build_block`, so that a jointly trained MTP (model.train_mtp) gets the block
    loss's gradient through h."""

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
        fused = torch.cat([self.norm_embedding(e_t1), self.norm_mtp(h_mtp.to(e_t1.dtype))], dim=-1)
        return self.proj(fused)
