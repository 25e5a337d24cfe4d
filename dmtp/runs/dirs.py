"""Where a training run's files are: `<run>/checkpoints/*.ckpt`, and which run directory `resume=` /
`ckpt_path=` continue in.

Path rules only (no torch): the config resolvers (dmtp.resolvers, on `import dmtp`) need them before anything heavy,
and dmtp.runs.resume builds the resume on them."""
from __future__ import annotations

from pathlib import Path

CHECKPOINTS = "checkpoints"   # <run>/checkpoints/*.ckpt (conf/callbacks/default.yaml)
RUN_MARKER = ".dmtp-run"      # written once, atomically, by the run that owns the directory (dmtp.runs.resume)


# What to do with a run that stopped before its first checkpoint: neither resume= nor a new run can use its directory.
START_AGAIN = ("the run there stopped before its first checkpoint; to start it again remove {run_dir} and rerun its "
               "command, or rerun it with hydra.run.dir=<another dir>")


def run_dir_of(ckpt: str | Path) -> Path | None:
    """The run a checkpoint belongs to: `<run>/checkpoints/<file>.ckpt` -> `<run>`; else None."""
    ckpt = Path(ckpt).expanduser().absolute()
    return ckpt.parent.parent if ckpt.parent.name == CHECKPOINTS else None


def checkpoints_newest_first(run_dir: Path) -> list[Path]:
    """`<run>/checkpoints/*.ckpt`, the most recently written first (`last.ckpt` first on a tie: ModelCheckpoint
    writes it right after the step's own file)."""
    folder = run_dir / CHECKPOINTS
    found = list(folder.glob("*.ckpt")) if folder.is_dir() else []
    if not found:
        raise FileNotFoundError(f"resume={run_dir}: no checkpoint under {folder} (nothing to resume)"
                                + (f"; {START_AGAIN.format(run_dir=run_dir)}" if (run_dir / RUN_MARKER).exists()
                                   else "; is it a training run's directory?"))
    return sorted(found, key=lambda p: (p.stat().st_mtime_ns, p.name == "last.ckpt"), reverse=True)


def resumed_run_dir(resume: str | None, ckpt_path: str | None) -> Path | None:
    """The run directory a resume continues in (None for a fresh run), checked without loading anything."""
    if resume and ckpt_path:
        raise ValueError(f"give resume=<run dir> or ckpt_path=<file>, not both (resume={resume}, "
                         f"ckpt_path={ckpt_path})")
    if resume:
        run_dir = Path(resume).expanduser().absolute()
        if not run_dir.is_dir():
            raise FileNotFoundError(f"resume={resume}: no such run directory")
        checkpoints_newest_first(run_dir)
        return run_dir
    if ckpt_path:
        ckpt = Path(ckpt_path).expanduser()
        if not ckpt.is_file():
            # Lightning would silently start from scratch on a missing "last" checkpoint.
            raise FileNotFoundError(f"ckpt_path {ckpt_path} does not exist: nothing to resume (resume=<run dir> "
                                    "finds a run's newest checkpoint)")
        return run_dir_of(ckpt)
    return None


def continued_run_dir(resume, ckpt_path) -> Path | None:
    """The existing directory `resume=` or `ckpt_path=` points at, before anything in it is checked (None: a
    fresh run, or no such directory): the directory a second writer must be kept out of (dmtp.runs.lock)."""
    if resume:
        run_dir = Path(resume).expanduser().absolute()
    elif ckpt_path:
        run_dir = run_dir_of(ckpt_path)
    else:
        return None
    return run_dir if run_dir is not None and run_dir.is_dir() else None


def hydra_run_dir(resume, ckpt_path, default: str) -> str:
    """`hydra.run.dir` (resolver `dmtp_run_dir`): the resumed run's directory, else `default`.

    Never raises: a bad resume/ckpt_path is reported by `train` as one line, not by Hydra as a traceback."""
    try:
        run_dir = resumed_run_dir(resume, ckpt_path)
    except (ValueError, OSError):
        return default
    return str(run_dir) if run_dir else default
