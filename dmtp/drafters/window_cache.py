"""A sliding-window drafter layer's decoding cache, bounded by the window instead of the context.

A layer with `sliding_window` w (`drafter.layer_types`) lets a block query at position p see context
positions p - w + 1 .. anchor - 1 and its own block's rows: at most w - 1 context rows, whatever the
context's length. `WindowCache` keeps a ring of R = w + B slots (B: the block width) per request, position p
in slot p mod R, so its memory and the attention that reads it are the window's, not the context's.

Which position a slot holds follows from the round: every write so far is at a position at most the
current block's last row `last` (the context appended after a verify reaches a_prev + B - 1 < last; the
block's rows end at last), and a ring of R >= w + B - 1 slots holds the R positions last - R + 1 .. last
without two sharing a slot; the window the block reads, anchor - w + 1 .. last, lies inside them. So slot j
holds position last - ((last - j) mod R) (`ring_positions`), and `ring_block_mask` is `cached_block_mask`'s
visibility over those positions. The one write that spans more than R rows, a prompt, keeps each request's
last R rows before its own length (`write_prompt`): the rows of the others' padding would otherwise land on
slots its window reads.
"""
from __future__ import annotations

import torch

from dmtp.models.qwen3 import KVCache


def ring_size(window: int, block_size: int) -> int:
    """Slots of a window cache: the window plus the block (module docstring)."""
    return window + block_size


class WindowCache(KVCache):
    """A ring of `ring` slots per request (K/V [B, hkv, ring, d]): position p lives in slot p mod ring."""

    def __init__(self, batch: int, num_kv_heads: int, ring: int, head_dim: int, dtype, device):
        super().__init__(batch, num_kv_heads, ring, head_dim, dtype, device)
        self.ring = ring

    def write(self, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """positions [B, T] with T <= ring (a round's rows: no two share a slot)."""
        if positions.shape[1] > self.ring:
            raise ValueError(f"a window cache of {self.ring} slots takes at most {self.ring} rows per write, "
                             f"got {positions.shape[1]} (a prompt goes through write_prompt)")
        super().write(positions % self.ring, k, v)

    def write_prompt(self, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor) -> None:
        """A right-padded prompt's rows at positions 0..T-1 [B, T], `lengths` [B] valid: each request's last
        `ring` rows before its length (fewer when it is shorter: its first row repeated, the same value)."""
        if positions.shape[1] <= self.ring:
            return self.write(positions, k, v)
        rows = (lengths[:, None] - self.ring + torch.arange(self.ring, device=lengths.device)).clamp(min=0)
        pick = lambda t: t.gather(2, rows[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[-1]))  # noqa: E731
        self.write(positions.gather(1, rows), pick(k), pick(v))


def ring_positions(last: torch.Tensor, ring: int) -> torch.Tensor:
    """last [B] (the block's last row) -> [B, ring]: the position each slot holds."""
    slots = torch.arange(ring, device=last.device)
    return last[:, None] - (last[:, None] - slots[None]) % ring


def ring_block_mask(noise_positions: torch.Tensor, ctx_limit: torch.Tensor, ring: int, causal: bool,
                    window: int) -> torch.Tensor:
    """`cached_block_mask`'s visibility [B, 1, Q, ring] over a window cache's slots: query q sees the slot of
    position p iff p >= 0 and (p < ctx_limit[q] or p is one of the block's rows), p <= pq when causal, and
    |pq - p| < window."""
    pos = ring_positions(noise_positions[:, -1], ring)[:, None, :]            # [B, 1, R]
    pq = noise_positions[:, :, None]
    in_block = (pos >= noise_positions[:, :1, None]) & (pos <= noise_positions[:, -1:, None])
    visible = ((pos < ctx_limit[:, :, None]) | in_block) & (pos >= 0) & ((pq - pos).abs() < window)
    if causal:
        visible = visible & (pos <= pq)
    return visible[:, None]


__all__ = ["WindowCache", "ring_block_mask", "ring_positions", "ring_size"]
