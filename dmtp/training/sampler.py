"""The training order: a function of (seed, epoch) only, sharded per rank, resumable mid-epoch.

`ResumableSampler` is a `DistributedSampler` (Lightning leaves one in place under DDP/FSDP instead of
wrapping it) whose permutation depends on nothing but the seed and the epoch, and which can start an
epoch part-way through. `ResumableLoader` counts the batches Lightning takes from it and is stateful
(`state_dict` / `load_state_dict`), so Lightning stores (epoch, batches done) in every checkpoint and
a run resumed after k batches of epoch e sees exactly the batches the uninterrupted run saw.
"""
from __future__ import annotations

from torch.utils.data import DataLoader, Dataset, DistributedSampler


class ResumableSampler(DistributedSampler):
    def __init__(self, dataset: Dataset, seed: int, num_replicas: int = 1, rank: int = 0):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        self._resume: tuple[int, int] | None = None   # (epoch, first sample) for the next pass

    def resume_at(self, epoch: int, position: int) -> None:
        """Start epoch `epoch` at sample `position` of this rank's share (applies once)."""
        self._resume = (epoch, position)

    def start_position(self) -> int:
        """Where the next pass over the current epoch starts (0 unless resuming into it)."""
        return self._resume[1] if self._resume is not None and self._resume[0] == self.epoch else 0

    def __iter__(self):
        indices = list(super().__iter__())
        start = self.start_position()
        self._resume = None
        return iter(indices[start:])


class ResumableLoader(DataLoader):
    """A DataLoader over a `ResumableSampler` whose state is the position in the training order."""

    def __init__(self, *args, **kwargs):   # DataLoader's own signature, so Lightning can re-create it
        super().__init__(*args, **kwargs)
        self.batches_done = 0   # in the current epoch, counted as the training loop takes them

    def __iter__(self):
        # Lightning may swap the sampler (overfit_batches uses a SequentialSampler): that starts at 0.
        start = self.sampler.start_position() if isinstance(self.sampler, ResumableSampler) else 0
        self.batches_done = start // self.batch_size
        for batch in super().__iter__():
            self.batches_done += 1
            yield batch

    def state_dict(self) -> dict:
        return {"epoch": getattr(self.sampler, "epoch", 0), "batches": self.batches_done}

    def load_state_dict(self, state_dict: dict) -> None:
        if isinstance(self.sampler, ResumableSampler):
            self.sampler.resume_at(int(state_dict["epoch"]), int(state_dict["batches"]) * self.batch_size)
