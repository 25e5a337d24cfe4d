"""What `dmtp.train` writes into its run directory, and when: nothing before the run holds the directory.

Hydra writes its record of a run (`.hydra/config.yaml`, `hydra.yaml`, `overrides.yaml`) and opens its log file
before the job checks anything, so a command refused because the directory already held another run replaced
that run's records. conf/hydra/default.yaml therefore has Hydra write neither (`output_subdir: null`;
the log file is opened on its first record, conf/hydra/job_logging/dmtp.yaml); the run writes the same record
itself (`write_hydra_record`) once it has claimed the directory (dmtp.runs.resume.claim_run_dir): under
`.hydra/` for a new run, `.hydra/resumed-<id>/` for a resumed one (its first record is kept).

`NoteNewRunDirs`, a Hydra callback, notes whether the run (or sweep) directory existed before Hydra created it:
a run that stops before its first step removes a directory its own command made (`created_by_this_command`)
and leaves one that was there before as it found it (dmtp.runs.first_step). The other commands use it too: a
refused `dmtp.infer` / `dmtp.regime` removes the directory it made with what Hydra wrote there
(`unused_dir_removed`), and `dmtp.prepare`, which writes its caches elsewhere, removes its empty one
(`dir_removed_if_unused`).

No torch: the command imports this before anything heavy.
"""
from __future__ import annotations

import logging
import secrets
import shutil
from contextlib import contextmanager
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from dmtp.atomic_io import write_text

_MADE: set[Path] = set()   # directories this process's Hydra command was about to create


def _note(config, key: str) -> None:
    """Notes the highest directory above (or at) `key`'s path that does not exist yet: Hydra makes them all."""
    try:
        path = Path(str(OmegaConf.select(config, key))).expanduser().absolute()
    except Exception:   # noqa: BLE001 - an interpolation only the job can resolve: nothing noted, nothing removed
        return
    missing = [p for p in (path, *path.parents) if not p.exists()]
    if missing:
        _MADE.add(missing[-1])


class NoteNewRunDirs(Callback):
    """Hydra callback (conf/hydra/default.yaml): notes the run / sweep directory Hydra is about to create."""

    def on_run_start(self, config, **kwargs) -> None:
        _note(config, "hydra.run.dir")

    def on_multirun_start(self, config, **kwargs) -> None:
        _note(config, "hydra.sweep.dir")


def created_by_this_command(path: str | Path) -> bool:
    """Whether `path` (or a directory above it) did not exist before this process's Hydra command started."""
    path = Path(path).expanduser().absolute()
    return any(made == path or made in path.parents for made in _MADE)


def remove_if_made(path: str | Path) -> None:
    """Remove `path` if this command made it and it is empty, and the empty directories above it it made too."""
    path = Path(path).expanduser().absolute()
    tops = [made for made in _MADE if made == path or made in path.parents]
    for folder in (path, *path.parents):
        if not tops or not any(folder == top or top in folder.parents for top in tops):
            return
        try:
            folder.rmdir()
        except FileNotFoundError:   # already removed (dmtp.runs.first_step)
            continue
        except OSError:   # not empty: the run wrote there, or another one did
            return
        close_log_files_under(folder)


def close_log_files_under(folder: Path) -> None:
    """Detach the log files (opened on their first record) that lay in the removed `folder`: a later record in this
    process (a command run in-process, as the tests and a notebook do) would otherwise fail to open them."""
    loggers = [logging.getLogger(), *(one for one in logging.Logger.manager.loggerDict.values()
                                      if isinstance(one, logging.Logger))]
    for logger in loggers:
        for handler in list(logger.handlers):
            name = getattr(handler, "baseFilename", None)
            if name is not None and folder in Path(name).parents:
                logger.removeHandler(handler)
                handler.close()


@contextmanager
def unused_dir_removed(path: str | Path, hydra_files: tuple[str, ...] = ()):
    """A failure inside (bad input found before the job starts, e.g. `threads=`) removes `path` if this command
    made it and it is still empty (`remove_if_made`). `hydra_files`: what Hydra itself wrote there before the job
    (`hydra_own_files`: its record and log file, for a command that keeps them), removed first from a directory this
    command made: a refused command leaves nothing."""
    try:
        yield
    except BaseException:
        if created_by_this_command(path):
            for name in hydra_files:
                own = Path(path) / name
                if own.is_dir():
                    shutil.rmtree(own, ignore_errors=True)
                else:
                    own.unlink(missing_ok=True)
        remove_if_made(path)
        raise


@contextmanager
def dir_removed_if_unused(path: str | Path):
    """`path` removed once the command inside ends, however it ends, if this command made it and left it empty (a
    command that writes elsewhere: dmtp.prepare's caches are under $DMTP_HOME)."""
    try:
        yield
    finally:
        remove_if_made(path)


def hydra_own_files() -> tuple[str, ...]:
    """What Hydra writes into a job's run directory before the job runs: its record (`.hydra/`, unless the config
    turns it off) and the job's log file."""
    from hydra.core.hydra_config import HydraConfig

    hydra = HydraConfig.get()
    return tuple(name for name in (hydra.output_subdir, f"{hydra.job.name}.log") if name)


def hydra_record(task_cfg) -> dict[str, str]:
    """The files Hydra would have written for this job (its config, Hydra's own, the command-line overrides),
    as text; called in the job, written by `write_hydra_record` once the run holds its directory."""
    from hydra.core.hydra_config import HydraConfig

    return {"config.yaml": OmegaConf.to_yaml(task_cfg),
            "hydra.yaml": OmegaConf.to_yaml(HydraConfig.instance().cfg),
            "overrides.yaml": OmegaConf.to_yaml(HydraConfig.get().overrides.task)}


def write_hydra_record(run_dir: str | Path, record: dict[str, str], resumed: bool) -> Path:
    """`record` under `<run_dir>/.hydra` (a new run) or `<run_dir>/.hydra/resumed-<id>` (a resumed one)."""
    folder = Path(run_dir) / ".hydra"
    if resumed:
        folder = folder / f"resumed-{secrets.token_hex(3)}"
    for name, text in record.items():
        write_text(folder / name, text)
    return folder


__all__ = ["NoteNewRunDirs", "created_by_this_command", "dir_removed_if_unused", "hydra_own_files", "hydra_record",
           "remove_if_made", "unused_dir_removed", "write_hydra_record"]
