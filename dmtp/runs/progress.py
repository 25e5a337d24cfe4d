"""Training progress.

On a terminal: the bar, counting optimizer steps (dmtp trains for `max_steps` with max_epochs=-1, and Lightning's
own description would read `Epoch 0/-2`). In a log file: `ProgressLines`."""
from __future__ import annotations

import sys
import time

import lightning as L

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


class ProgressLines(L.Callback):
    """Progress for a log file (stdout not a terminal: nohup, a cluster's job log), where a bar draws nothing:
    one line every `every_n_steps` optimizer steps (step, loss, tokens/s over the last lines, ETA) and, after
    each validation, the walk's table (`table`: metrics -> text or None)."""

    def __init__(self, every_n_steps: int, table=None, out=None):
        self.every = max(1, int(every_n_steps))
        self.table = table
        self.out = out if out is not None else sys.stdout
        self._tokens = 0
        self._since = self._start = None
        self._start_step = 0
        self._printed = -1   # the step last printed (a step ending several accumulated batches prints once)

    def _print(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def on_train_start(self, trainer, pl_module) -> None:
        self._since = self._start = time.perf_counter()
        self._start_step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._tokens += batch["input_ids"].numel() * trainer.world_size
        step = trainer.global_step
        if not trainer.is_global_zero or step == self._printed or step % self.every:
            return
        now = time.perf_counter()
        rate = self._tokens / max(now - self._since, 1e-9)
        self._tokens, self._since = 0, now
        loss = trainer.callback_metrics.get("train/loss")
        parts = [step_description(trainer)]
        if loss is not None:
            parts.append(f"loss {float(loss):.4f}")
        parts.append(f"{rate:,.0f} tok/s")
        done = step - self._start_step
        if trainer.max_steps and trainer.max_steps > 0 and done > 0:
            left = (now - self._start) / done * (trainer.max_steps - step)
            parts.append(f"ETA {_duration(left)}")
        self._print("[dmtp] " + ", ".join(parts))
        self._printed = step

    def on_validation_end(self, trainer, pl_module) -> None:
        # The run-end table is printed once, by dmtp.train after the export.
        final = trainer.max_steps and trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps
        if not trainer.is_global_zero or trainer.sanity_checking or self.table is None or final:
            return
        text = self.table(trainer)
        if text:
            self._print(text)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def stdout_is_terminal() -> bool:
    return sys.stdout.isatty()
