"""The target's hidden states of full KV blocks, kept so that a prefix-cache hit can rebuild the MTP's rows.

With prefix caching on, an engine serves a request's cached prefix without running the target there, so the
target's hidden states of those positions never reach the drafter, and the MTP's rows 1..n (row p consumes
x_p and h_{p-1}) would be missing. This store keeps, for every full block a request has computed, the target's
post-norm hidden states at its positions, keyed as a prefix cache keys blocks: a hash chained over the tokens
of every block up to it. On a hit at n tokens the proposer takes h_0..h_{n-1} from here and recomputes the MTP
rows 1..n in one forward, exactly what it would have computed without the cache (`lookup`). Rows are
recomputed, not stored: a row depends on the whole prefix only through h, and h is what the target gave.

Memory: one hidden row per cached token (for an 8B target, 4096 values, ~3% of the target's own KV per token).
The store keeps at most `capacity` blocks, least recently used dropped first. A hit the store cannot cover (its
blocks were dropped) is counted in `misses`; those rows stay missing, so the MTP drafts from a shorter history
for that request (tokens stay the target's: only acceptance can suffer).

No vLLM import here: tested without an engine.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch


@dataclass
class _Request:
    """What a live request has computed so far: its tokens from position 0, the chained key of its last full
    block, and the hidden rows after that block (not yet a full block)."""
    tokens: list[int] = field(default_factory=list)
    key: int = 0
    pending: list[torch.Tensor] = field(default_factory=list)
    pending_rows: int = 0


class PrefixHiddenStore:
    def __init__(self, block_size: int, capacity: int):
        if block_size < 1 or capacity < 1:
            raise ValueError(f"block_size and capacity must be >= 1, got {block_size}, {capacity}")
        self.block_size, self.capacity = block_size, capacity
        self.blocks: OrderedDict[int, torch.Tensor] = OrderedDict()
        self.requests: dict[str, _Request] = {}
        self.hits = self.misses = self.rebuilt_rows = 0

    def _chain(self, key: int, block: list[int]) -> int:
        return hash((key, tuple(block)))

    def record(self, req_id: str, first_position: int, tokens: list[int], hidden: torch.Tensor) -> None:
        """A step's computed positions first_position.. of a request: their tokens and the target's post-norm
        hidden [n, H]. A request's steps arrive in order; a position already recorded is skipped."""
        req = self.requests.setdefault(req_id, _Request())
        skip = len(req.tokens) - first_position
        if skip < 0:   # a gap (a hit the store could not cover): nothing after it can be keyed
            return
        tokens, hidden = tokens[skip:], hidden[skip:]
        req.tokens.extend(tokens)
        req.pending.append(hidden)
        req.pending_rows += len(tokens)
        bs = self.block_size
        while req.pending_rows >= bs:
            rows = torch.cat(req.pending)
            start = len(req.tokens) - req.pending_rows
            req.key = self._chain(req.key, req.tokens[start:start + bs])
            self._keep(req.key, rows[:bs])
            req.pending, req.pending_rows = [rows[bs:]], req.pending_rows - bs

    def _keep(self, key: int, rows: torch.Tensor) -> None:
        self.blocks[key] = rows.detach().clone()
        self.blocks.move_to_end(key)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)

    def lookup(self, req_id: str, prefix: list[int]) -> torch.Tensor | None:
        """The target's hidden h_0..h_{n-1} [n, H] of a cached prefix (its n = len(prefix) tokens), or None.

        None when n is not a whole number of blocks or a block is no longer here (counted in `misses`). A found
        prefix starts the request's record."""
        bs, n = self.block_size, len(prefix)
        key, rows = 0, []
        for start in range(0, n, bs):
            key = self._chain(key, prefix[start:start + bs])
            block = None if n % bs else self.blocks.get(key)
            if block is None:
                self.misses += 1
                return None
            self.blocks.move_to_end(key)
            rows.append(block)
        self.hits += 1
        self.rebuilt_rows += n
        self.requests[req_id] = _Request(tokens=list(prefix), key=key)
        return torch.cat(rows)

    def forget_all_but(self, live) -> None:
        """Drops the records of requests no longer live (their full blocks stay in the store)."""
        for req_id in [r for r in self.requests if r not in live]:
            del self.requests[req_id]


__all__ = ["PrefixHiddenStore"]
