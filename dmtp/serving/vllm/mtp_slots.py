"""The native MTP's KV cache for every live request of a serving engine: one static cache, one slot (row) each.

DMTP's vLLM proposer catches the MTP up on all requests of a step together rather than with one forward per
request. The requests whose rows fit in one block (decode steps: the accepted tokens and the new anchor)
share one padded forward. A longer prompt chunk (chunked prefill) gets a forward of its own, so that it does
not pad every decode request to its length. A padded row is scratch at a position after its request's last
valid row (`NativeMTP.forward_rows`): the request's next rows overwrite it before anything attends there.
Slots of finished requests are reused; the cache doubles its slots when more requests are live than it has.
A chained MTP step (`chain_step`, the multi-step variants) writes one scratch row per request after its anchor,
as dmtp's loop does: the next catch-up overwrites it, and no row attends past its own position.

No vLLM import here: the catch-up is tested against one forward per request without an engine.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence

from dmtp.models.qwen3 import KVCache


@dataclass
class MTPRows:
    """One request's rows of a step: row i consumes (tokens[i], hidden[i]) at position first_position + i."""
    req_id: str
    tokens: torch.Tensor   # [n] long
    hidden: torch.Tensor   # [n, H]: the target's post-norm hidden at the previous position of each row
    first_position: int


class _SlotRows:
    """The slots of one forward, seen by the MTP's layers as a `KVCache`: K/V are written into the shared
    cache at (slot, position) and read back gathered over the live span only."""

    def __init__(self, cache: KVCache, slots: torch.Tensor, span: int):
        self.cache, self.slots, self.rows, self.max_len = cache, slots, slots[:, None], span

    def write(self, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.cache.k[self.rows, :, positions] = k.transpose(1, 2).to(self.cache.k.dtype)
        self.cache.v[self.rows, :, positions] = v.transpose(1, 2).to(self.cache.v.dtype)

    @property
    def k(self) -> torch.Tensor:
        return self.cache.k[self.slots, :, :self.max_len]

    @property
    def v(self) -> torch.Tensor:
        return self.cache.v[self.slots, :, :self.max_len]


class MTPSlots:
    """The MTP's per-request KV state for an engine whose requests come and go.

    `max_position`: the largest position a valid row can have (the engine's max model length);
    `block_rows`: the most rows a decode step gives one request (1 + the speculative tokens)."""

    def __init__(self, mtp, max_position: int, block_rows: int):
        self.mtp, self.block_rows = mtp, block_rows
        self.length = max_position + 1 + block_rows   # room for a padded row after the last valid one
        self.slot_of: dict[str, int] = {}
        self.last_row: dict[str, int] = {}   # per request: the position of its last valid (committed) row
        self.cache: KVCache | None = None

    def forget_all_but(self, live) -> None:
        """Frees the slots of requests that are no longer live (finished or aborted)."""
        for req_id in [r for r in self.slot_of if r not in live]:
            del self.slot_of[req_id]
            self.last_row.pop(req_id, None)

    def rows_before(self, req_id: str) -> int:
        """The position of the request's last committed row (0: none yet): rows 1..that one are valid."""
        return self.last_row.get(req_id, 0)

    def catch_up(self, requests: list[MTPRows]) -> torch.Tensor:
        """Runs every request's rows; returns [len(requests), H]: each request's last row's output."""
        slots = [self._slot(r.req_id) for r in requests]
        out = None
        short = [i for i, r in enumerate(requests) if len(r.tokens) <= self.block_rows]
        long = [i for i, r in enumerate(requests) if len(r.tokens) > self.block_rows]
        groups = ([short] if short else []) + [[i] for i in long]
        for group in groups:
            g = self._forward([requests[i] for i in group], [slots[i] for i in group])
            if out is None:
                out = g.new_empty(len(requests), g.shape[-1])
            out[group] = g
        for r in requests:
            self.last_row[r.req_id] = r.first_position + len(r.tokens) - 1
        return out

    def slots_of(self, req_ids: list[str]) -> torch.Tensor:
        """[B] the cache slots of live requests (once per round, for its chained steps)."""
        return torch.tensor([self.slot_of[r] for r in req_ids], device=self.cache.k.device)

    def chain_step(self, slots: torch.Tensor, tokens: torch.Tensor, hidden: torch.Tensor,
                   positions: torch.Tensor, span: int) -> torch.Tensor:
        """One chained row per request, scratch (the next catch-up overwrites it): the row at `positions` [B]
        of the requests' `slots` [B] consumes (tokens [B], hidden [B, H]) -> its output [B, H]. `span` > every
        position."""
        g = self.mtp.forward_rows(tokens[:, None], hidden[:, None], positions[:, None],
                                  _SlotRows(self.cache, slots, span), span=span)
        return g[:, 0]

    def _forward(self, requests: list[MTPRows], slots: list[int]) -> torch.Tensor:
        counts = [len(r.tokens) for r in requests]
        width = max(counts)
        device = requests[0].hidden.device
        tokens = pad_sequence([r.tokens for r in requests], batch_first=True)
        hidden = pad_sequence([r.hidden for r in requests], batch_first=True)
        starts = torch.tensor([r.first_position for r in requests], device=device)
        positions = starts[:, None] + torch.arange(width, device=device)
        span = max(r.first_position for r in requests) + width
        view = _SlotRows(self.cache, torch.tensor(slots, device=self.cache.k.device), span)
        g = self.mtp.forward_rows(tokens, hidden, positions, view, span=span)
        return g[torch.arange(len(requests), device=g.device), torch.tensor(counts, device=g.device) - 1]

    def _slot(self, req_id: str) -> int:
        slot = self.slot_of.get(req_id)
        if slot is None:
            taken = set(self.slot_of.values())
            slot = next(i for i in range(len(taken) + 1) if i not in taken)
            self._ensure_slots(slot + 1)
            self.slot_of[req_id] = slot
        return slot

    def _ensure_slots(self, count: int) -> None:
        have = 0 if self.cache is None else self.cache.k.shape[0]
        if count <= have:
            return
        grown = self.mtp.new_cache(max(count, 2 * have), self.length)
        if not isinstance(grown, KVCache):
            raise TypeError(f"serving the MTP needs a KVCache MTP block (Qwen3 family); "
                            f"{type(self.mtp.layers[0]).__name__} keeps a {type(grown).__name__}")
        if self.cache is not None:
            grown.k[:have], grown.v[:have] = self.cache.k, self.cache.v
        self.cache = grown


__all__ = ["MTPRows", "MTPSlots"]
