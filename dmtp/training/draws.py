"""Where the training loss draws its random numbers (block anchors, multi-step m per block).

`RowDraws` (training): each row's numbers come from its own generator, keyed by (seed, step, the row's index
in the training set). A row's anchors are therefore the same whatever the batch it shares, the rank it lands
on or the world size: 2 ranks of batch b draw exactly what 1 rank of batch 2b draws for the same rows, and a
resumed run draws what the uninterrupted one did.
`BatchDraws` (validation): one generator for the whole batch (or the global RNG when None).
"""
from __future__ import annotations

import hashlib

import torch


class BatchDraws:
    def __init__(self, generator: torch.Generator | None = None):
        self.generator = generator

    def uniform(self, shape, device) -> torch.Tensor:
        return torch.rand(tuple(shape), generator=self.generator, device=device)

    def integers(self, low: int, high: int, shape, device) -> torch.Tensor:
        return torch.randint(low, high, tuple(shape), generator=self.generator, device=device)


def row_seed(seed: int, step: int, index: int) -> int:
    digest = hashlib.blake2b(f"dmtp-row:{seed}:{step}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


class RowDraws:
    """Per-row generators (on the CPU: a few hundred numbers per row, then one copy to the device)."""

    def __init__(self, seed: int, step: int, indices: torch.Tensor):
        self.generators = [torch.Generator().manual_seed(row_seed(seed, step, int(i))) for i in indices.tolist()]

    def _rows(self, shape, draw) -> torch.Tensor:
        if shape[0] != len(self.generators):
            raise ValueError(f"{len(self.generators)} rows of draws for a batch of {shape[0]}")
        return torch.stack([draw(tuple(shape[1:]), g) for g in self.generators])

    def uniform(self, shape, device) -> torch.Tensor:
        return self._rows(shape, lambda s, g: torch.rand(s, generator=g)).to(device)

    def integers(self, low: int, high: int, shape, device) -> torch.Tensor:
        return self._rows(shape, lambda s, g: torch.randint(low, high, s, generator=g)).to(device)
