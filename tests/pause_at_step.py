"""A Lightning callback for tests that need a training run caught mid-run in a process of its own: at `step` it
writes `marker` and waits, writing nothing, until `go` exists (`+callbacks.pause._target_=pause_at_step.PauseAtStep`,
with tests/ on PYTHONPATH). Deterministic where a signal sent on seeing a checkpoint races a fast run."""
from __future__ import annotations

import time
from pathlib import Path

from lightning.pytorch.callbacks import Callback


class PauseAtStep(Callback):
    def __init__(self, step: int, marker: str, go: str, timeout: float = 600):
        self.step, self.marker, self.go, self.timeout = step, Path(marker), Path(go), timeout
        self.done = False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        # The step-`step` checkpoint is written at the end of the batch before this one.
        if self.done or trainer.global_step != self.step:
            return
        self.done = True
        self.marker.write_text(str(trainer.global_step))
        deadline = time.monotonic() + self.timeout
        while not self.go.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
