"""A training run's plan, made once before anything is built: which config it runs, from which checkpoint, in
which directory. `resume=<run dir>` and `ckpt_path=<file>` are read here, and nowhere else, into a `RunPlan`
that the job then follows (dmtp.training.job)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, open_dict

from dmtp.runs.recorded_config import resume_line, resumed_config, run_recipe
from dmtp.runs.resume import checkpoint_shapes, read_checkpoint, resume_plan


@dataclass(frozen=True)
class RunPlan:
    """The config to run (a resumed run's own), the directory it runs in, and what it continues from.

    `ckpt_path`: the checkpoint loaded before the first step (None: a fresh run); `resumed_dir`: the run
    directory it continues in (None: a fresh run, or a checkpoint outside any run's `checkpoints/`);
    `saved_shapes`: the checkpoint's tensor shapes under today's names, checked against the built module
    before Lightning loads it; `recorded`: the config the run recorded (None where it records none)."""
    cfg: DictConfig
    output_dir: Path
    ckpt_path: Path | None = None
    resumed_dir: Path | None = None
    by_resume: bool = False
    saved_step: int | None = None
    saved_shapes: dict[str, tuple[int, ...]] | None = None
    recorded: DictConfig | None = None

    @property
    def resuming(self) -> bool:
        """The run goes on in a directory an earlier run holds."""
        return self.resumed_dir is not None

    def resume_line(self) -> str | None:
        """The one line a continued run prints before its first step (None for a fresh run)."""
        if self.ckpt_path is None:
            return None
        return resume_line(self.ckpt_path, self.saved_step, self.recorded, self.cfg, self.by_resume)


def plan_run(cfg: DictConfig, overrides: list[str] | None) -> RunPlan:
    """The run `cfg` asks for. `resume=` runs the run's own recorded config with the options given now that a
    resume may change (`overrides`: the command line's; None: every key of `cfg` counts as given); `ckpt_path=`
    runs the config given.

    Either way a continued run stays in its own directory (Hydra already points there)."""
    by_resume = bool(cfg.get("resume"))
    ckpt_path, resumed_dir = resume_plan(cfg.get("resume"), cfg.ckpt_path)
    if ckpt_path is None:
        return RunPlan(cfg=cfg, output_dir=Path(cfg.paths.output_dir))
    saved = read_checkpoint(ckpt_path)
    recorded = run_recipe(resumed_dir, saved, required=by_resume)
    if by_resume:
        cfg = resumed_config(cfg, recorded, resumed_dir, overrides)
    if resumed_dir is not None:
        with open_dict(cfg):
            cfg.paths.output_dir = str(resumed_dir)
    return RunPlan(cfg=cfg, output_dir=Path(cfg.paths.output_dir), ckpt_path=ckpt_path, resumed_dir=resumed_dir,
                   by_resume=by_resume, saved_step=saved.get("global_step"), saved_shapes=checkpoint_shapes(saved),
                   recorded=recorded)


__all__ = ["RunPlan", "plan_run"]
