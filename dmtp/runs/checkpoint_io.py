"""Lightning checkpoints (every `checkpoints/*.ckpt`, `last.ckpt` included) written by dmtp's one atomic-write
rule (dmtp.atomic_io): a kill or a full disk during a save leaves the previous checkpoint intact.

`BackgroundCheckpointIO` writes them in a thread (`checkpoint_writes=background`, the default on CUDA trainers): the
run only waits for a host copy of the state (a drafter's weights and optimizer state: ~13 GB for a 1B drafter),
not for the disk. The copy is taken on the training thread before the next step changes anything.

Lightning's own save writes the file elsewhere and then copies it onto the final name when the run
directory is on another filesystem than $TMPDIR, so a failure mid-copy destroyed `last.ckpt`."""
from __future__ import annotations

from pathlib import Path

import torch
from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO
from lightning_utilities.core.apply_func import apply_to_collection

from dmtp.atomic_io import torch_save


class AtomicCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        torch_save(checkpoint, Path(path))


class BackgroundCheckpointIO(AsyncCheckpointIO):
    """`AtomicCheckpointIO` in a background thread, on a host snapshot of the checkpoint taken before returning
    (never a second copy on the device).

    One write at a time; a failed write is raised at the next save or when training ends (Lightning's
    AsyncCheckpointIO contract), so it still ends the command with one line."""

    def __init__(self):
        super().__init__(AtomicCheckpointIO())

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        self._ensure_setup()
        if self._error:
            raise self._error
        snapshot = apply_to_collection(checkpoint, torch.Tensor, lambda t: t.detach().to("cpu", copy=True))

        def write() -> None:
            try:
                self.checkpoint_io.save_checkpoint(snapshot, path, storage_options)
            except BaseException as e:   # noqa: BLE001 - handed to the training thread
                self._error = e

        self._executor.submit(write)


CHECKPOINT_WRITES = ("auto", "background", "inline")


def checkpoint_io_for(writes: str, on_cuda: bool):
    """checkpoint_writes: background | inline | auto (background on a CUDA trainer, inline on the CPU)."""
    if writes not in CHECKPOINT_WRITES:
        raise ValueError(f"checkpoint_writes must be one of {', '.join(CHECKPOINT_WRITES)}, got {writes!r}")
    background = writes == "background" or (writes == "auto" and on_cuda)
    return BackgroundCheckpointIO() if background else AtomicCheckpointIO()
