"""A run that stops before its first training step leaves its directory as it found it.

Refused bad input (a target without an MTP, a missing `init_from`, a data file that does not parse), a fault
or an interrupt before the first step: what the run wrote there since it claimed the directory (its marker,
Hydra's record, logger folders, a log file) is removed, and so is the directory itself when this command made
it, so "the newest drafter", `dmtp.report` and the next run never meet a run that never ran. A directory held
by another run is never touched (the refusal comes before this run wrote anything), and from the first step on
nothing is removed: a run that trained keeps its logs, whatever ends it.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import lightning as L

from dmtp.runs.records import close_log_files_under


def paths_under(folder: Path) -> set[Path]:
    """Every file and folder below `folder` (none when it does not exist)."""
    return set(folder.rglob("*")) if folder.is_dir() else set()


class FirstStep(L.Callback):
    """Notes that the run reached its first training step."""

    def __init__(self):
        self.reached = False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.reached = True


class UntilFirstStep:
    """Undoes a starting run's writes in `run_dir` if it stops before its first step. `made`: the command made
    the directory (it is removed when empty); `held(before)`: the run now holds the directory, whose paths
    were `before` when it claimed it (what is not among them is the run's own)."""

    def __init__(self, run_dir: Path | None, made: bool):
        self.run_dir, self.made = run_dir, made
        self.before: set[Path] | None = None
        self.first_step = FirstStep()
        self.done = False

    def held(self, before: set[Path]) -> None:
        self.before = before

    def finished(self) -> None:
        """The fit ended normally (a resumed run may have had no step left to take): nothing is undone."""
        self.done = True

    def undo(self) -> None:
        if self.done or self.first_step.reached or self.run_dir is None:
            return
        if self.before is not None:
            for path in sorted(paths_under(self.run_dir) - self.before, key=lambda p: len(p.parts)):
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
        if self.made:
            try:
                self.run_dir.rmdir()   # only when empty
            except OSError:
                return
            close_log_files_under(self.run_dir)


__all__ = ["FirstStep", "UntilFirstStep", "paths_under"]
