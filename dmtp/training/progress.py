"""The training progress bar counts optimizer steps: dmtp trains for `max_steps` with max_epochs=-1, and
Lightning's own description would read `Epoch 0/-2`."""
from __future__ import annotations

from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from lightning.pytorch.utilities.imports import _RICH_AVAILABLE


def step_description(trainer) -> str:
    if trainer.max_steps and trainer.max_steps > 0:
        return f"step {trainer.global_step}/{trainer.max_steps}"
    return f"step {trainer.global_step} (epoch {trainer.current_epoch})"


class StepRichProgressBar(RichProgressBar):
    def _get_train_description(self, current_epoch: int) -> str:
        return step_description(self.trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if self.progress is not None and self.train_progress_bar_id is not None:
            self.progress.update(self.train_progress_bar_id, description=step_description(trainer))


class StepTQDMProgressBar(TQDMProgressBar):
    def on_train_epoch_start(self, trainer, *_) -> None:
        super().on_train_epoch_start(trainer)
        self.train_progress_bar.set_description(step_description(trainer))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self.train_progress_bar.set_description(step_description(trainer))


def step_progress_bar():
    """Lightning's choice of bar (Rich when installed, else tqdm), described in steps."""
    return StepRichProgressBar() if _RICH_AVAILABLE else StepTQDMProgressBar()
