"""Lightning checkpoints (every `checkpoints/*.ckpt`, `last.ckpt` included) written by dmtp's one atomic-write
rule (dmtp.atomic_io): a kill or a full disk during a save leaves the previous checkpoint intact.

Lightning's own save writes the file elsewhere and then copies it onto the final name when the run
directory is on another filesystem than $TMPDIR, so a failure mid-copy destroyed `last.ckpt`."""
from __future__ import annotations

from pathlib import Path

from lightning.pytorch.plugins.io import TorchCheckpointIO

from dmtp.atomic_io import torch_save


class AtomicCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        torch_save(checkpoint, Path(path))
