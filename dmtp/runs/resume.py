"""Where a training run lives and how it continues: one directory per run, resumed in place.

- Where a run's checkpoints are and which directory a resume continues in: dmtp.runs.dirs.
- A run directory belongs to one run. `claim_run_dir` marks it atomically when the run starts, so a
  second run pointed at the same directory fails up front instead of replacing the first one's
  checkpoints and drafter (default directories are unique anyway: see `dmtp.resolvers`). While a run is
  writing, its directory is also locked (dmtp.runs.lock), so a resume of it is refused as well.
- `resume=<run dir>` continues that run from its newest checkpoint that loads (a newer one that does not,
  e.g. one damaged outside dmtp, is skipped and named in one line); `ckpt_path=<run>/checkpoints/<file>`
  continues from that file. Either way the run goes on in its own directory (checkpoints, logs and the
  exported drafter stay together); a checkpoint outside a `checkpoints/` folder starts a new directory.
- A resumed run first removes the temporaries a killed save left in it (dmtp.atomic_io).
- `checkpoint_shapes` / `check_checkpoint_fits` read a checkpoint before Lightning does (tensors only,
  `weights_only=True`), so a truncated file or one saved for another target, drafter or injection is
  one line naming `ckpt_path`, not a size-mismatch traceback after the trainer started.
"""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import torch

from dmtp.atomic_io import remove_stale_temporaries
from dmtp.errors import reason
from dmtp.runs.dirs import CHECKPOINTS, RUN_MARKER, START_AGAIN, checkpoints_newest_first, resumed_run_dir


def newest_loadable_checkpoint(run_dir: str | Path) -> Path:
    """The newest checkpoint of the run that loads; the newer ones that do not are named in one line."""
    run_dir = Path(run_dir)
    skipped = []
    for ckpt in checkpoints_newest_first(run_dir):
        try:
            _load(ckpt)
        except UnreadableCheckpoint as e:
            skipped.append(f"{ckpt.name}, which {e.why}")
            continue
        if skipped:
            print(f"[dmtp] resume: skipped {'; '.join(skipped)}; resuming from {ckpt}")
        return ckpt
    raise ValueError(f"resume={run_dir}: no checkpoint under {run_dir / CHECKPOINTS} loads: {'; '.join(skipped)}")


def resume_plan(resume: str | None, ckpt_path: str | None) -> tuple[Path | None, Path | None]:
    """-> (checkpoint to load, run directory to continue in); (None, None) for a fresh run."""
    run_dir = resumed_run_dir(resume, ckpt_path)
    if resume:
        return newest_loadable_checkpoint(run_dir), run_dir
    if ckpt_path:
        return Path(ckpt_path).expanduser(), run_dir
    return None, None


def claim_run_dir(run_dir: str | Path, resuming: bool) -> None:
    """Mark `run_dir` as this run's, or fail if another run already holds it (its marker, checkpoints or
    drafter).

    A run resumed in its own directory keeps it."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    marker = run_dir / RUN_MARKER
    if resuming:
        marker.touch()
        for folder in (run_dir, run_dir / CHECKPOINTS, run_dir / "drafter"):   # what a killed save left
            remove_stale_temporaries(folder)
        return
    taken = f"{run_dir} already holds another training run ({{}}); continue it with resume={run_dir}, or leave " \
            "hydra.run.dir / paths.output_dir to their unique defaults"
    if (run_dir / "drafter").exists() or any(run_dir.glob(f"{CHECKPOINTS}/*.ckpt")):
        raise ValueError(taken.format("its checkpoints or drafter"))
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))   # atomic: exactly one run wins
    except FileExistsError:   # a run that saved nothing to resume (a run still writing holds the lock before this)
        raise ValueError(f"{run_dir} already holds another training run (its {RUN_MARKER}), which saved no "
                         f"checkpoint to resume: {START_AGAIN.format(run_dir=run_dir)}") from None


# The BlockDrafter's children, as a checkpoint names them (dmtp.drafters.block_drafter).
BLOCK_DRAFTER_CHILDREN = ("drafter.backbone.", "drafter.injection.", "drafter.mtp_correction.")


def current_key(key: str) -> str:
    """A checkpoint tensor's name in today's module.

    Checkpoints written before the drafter became one module (`BlockDrafter`) hold the backbone as `drafter.*` and
    the injection as `injection.*`; both now live under `drafter.` (`drafter.backbone.*`, `drafter.injection.*`), in
    the same parameter order, so such a run resumes exactly. The MTP correction (`drafter.mtp_correction.*`) came
    after the one unit, so its names are today's already."""
    if key.startswith("injection."):
        return "drafter." + key
    if key.startswith("drafter.") and not key.startswith(BLOCK_DRAFTER_CHILDREN):
        return "drafter.backbone." + key[len("drafter."):]
    return key


class UnreadableCheckpoint(ValueError):
    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


def _load(ckpt: str | Path) -> dict:
    """A checkpoint's contents, memory-mapped (tensors and plain values only: nothing in the file is
    executed); UnreadableCheckpoint(why) when it is not a whole Lightning checkpoint."""
    try:
        state = torch.load(ckpt, map_location="cpu", weights_only=True, mmap=True)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, ValueError) as e:
        raise UnreadableCheckpoint(f"is not a readable Lightning checkpoint written by dmtp ({reason(e)})") from None
    if not isinstance(state, dict) or not isinstance(state.get("state_dict"), dict):
        raise UnreadableCheckpoint("is not a Lightning checkpoint (no state_dict)")
    return state


def read_checkpoint(ckpt: str | Path) -> dict:
    """`_load`, or one line naming `ckpt_path`."""
    try:
        return _load(ckpt)
    except UnreadableCheckpoint as e:
        raise ValueError(f"ckpt_path {ckpt} {e.why}") from None


def checkpoint_shapes(state: dict) -> dict[str, tuple[int, ...]]:
    """The tensor shapes a checkpoint (`read_checkpoint`'s contents) holds, under today's names."""
    return {current_key(k): tuple(v.shape) for k, v in state["state_dict"].items()}


def check_checkpoint_fits(ckpt: str | Path, shapes: dict[str, tuple[int, ...]], module: torch.nn.Module) -> None:
    """The checkpoint holds exactly the module's trainable tensors, with the same shapes."""
    excluded = module.checkpoint_excludes   # what checkpoints leave out (the frozen parts)
    mine = {k: tuple(v.shape) for k, v in module.state_dict().items() if not k.startswith(excluded)}
    foreign = " (saved for another target, drafter or injection variant?)"
    for key, shape in mine.items():
        if key not in shapes:
            raise ValueError(f"ckpt_path {ckpt} has no tensor {key}{foreign}")
        if shapes[key] != shape:
            raise ValueError(f"ckpt_path {ckpt}: tensor {key} has shape {list(shapes[key])}, this run's has "
                             f"{list(shape)}{foreign}")
    extra = sorted(set(shapes) - set(mine))
    if extra:
        raise ValueError(f"ckpt_path {ckpt} holds tensor {extra[0]} that this run does not have{foreign}")
