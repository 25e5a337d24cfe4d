"""Command-line plumbing: bad input or an environment fault ends a command with one line, not a traceback.

The wording is dmtp.errors': bad input (`USER_ERRORS`, and an option the config has no key for, which Hydra
itself refuses) prints `<prog>: error: <message>` and exits with status 2; an environment fault
(`environment_fault`: a full disk, a quota, a read-only filesystem, wherever it is raised, Hydra's own writes
included) prints its one line and exits with status 1.
`DMTP_TRACEBACK=1` re-raises instead, for debugging.
"""
from __future__ import annotations

import os
import re
import sys
from contextlib import contextmanager
from pathlib import Path

from dmtp.errors import USER_ERRORS, environment_fault


@contextmanager
def one_line_errors(prog: str):
    """Bad input or an environment fault raised inside: `<prog>: error: <line>` and exit status 2 or 1."""
    try:
        yield
    except Exception as err:
        line, status = environment_fault(err), 1
        if line is None and isinstance(err, USER_ERRORS):
            line, status = " ".join(str(err).split()) or type(err).__name__, 2
        if line is None or os.environ.get("DMTP_TRACEBACK"):
            raise
        print(f"{prog}: error: {line}", file=sys.stderr)
        raise SystemExit(status) from None   # not an Exception: Hydra's reporter lets it through


@contextmanager
def environment_faults_one_line(prog: str):
    """An environment fault raised inside: `<prog>: error: <line>`, exit status 1; anything else unchanged
    (for the steps around a job, where bad input is reported by the job's own `one_line_errors`)."""
    try:
        yield
    except Exception as err:
        line = environment_fault(err)
        if line is None or os.environ.get("DMTP_TRACEBACK"):
            raise
        print(f"{prog}: error: {line}", file=sys.stderr)
        raise SystemExit(1) from None


_NOT_AN_OPTION = re.compile(r"Could not override '([^']+)'")


def unknown_option_line(err: BaseException, prog: str) -> str | None:
    """Hydra's refusal of an option the composed config does not have (`drafter.markov_head_type=...` without
    `drafter=dspark`), as one line naming the config-group choices that have it; None for any other error."""
    from hydra.errors import ConfigCompositionException
    from omegaconf import OmegaConf

    from dmtp.configs import CONF_DIR

    found = _NOT_AN_OPTION.match(str(err)) if isinstance(err, ConfigCompositionException) else None
    if found is None or "not in struct" not in str(err.__cause__):
        return None
    key = found.group(1)
    group, _, rest = key.partition(".")
    primary = OmegaConf.load(Path(CONF_DIR) / f"{prog.rpartition('.')[2]}.yaml")   # conf/train.yaml for dmtp.train
    groups = {next(iter(d)) for d in primary.get("defaults", []) if OmegaConf.is_dict(d)}
    missing = object()
    owners = [f"{group}={path.stem}" for path in sorted((Path(CONF_DIR) / group).glob("*.yaml"))
              if group in groups and rest and OmegaConf.select(OmegaConf.load(path), rest, default=missing)
              is not missing]
    if owners:
        return (f"{key} is not an option of the {group} config in use; {', '.join(owners)} "
                f"{'has' if len(owners) == 1 else 'have'} it: add {owners[0]} to the command")
    return f"{key} is not an option (python -m {prog} --cfg job lists them)"


_ALREADY_THERE = re.compile(r"Could not append to config\. An item is already at '([^']+)'")


def composition_line(err: BaseException) -> str | None:
    """Hydra's other refusals of a command line, multi-line or a traceback in its own words, as one line.

    A config-group choice that does not exist (`target=nope`), `+key=value` for a key the config has already, and a
    run directory that is a file; None for any other."""
    from hydra.errors import ConfigCompositionException, MissingConfigException

    if isinstance(err, MissingConfigException) and err.options:
        group, _, choice = str(err.missing_cfg_file or "").rpartition("/")
        return f"{group}={choice} is not a choice of {group}; choose from {', '.join(err.options)}"
    found = _ALREADY_THERE.match(str(err)) if isinstance(err, ConfigCompositionException) else None
    if found:
        key = found.group(1)
        return f"+{key}=... adds an option, but {key} is one already: set it with {key}=... (no +)"
    if isinstance(err, (FileExistsError, NotADirectoryError)) and err.filename:   # Hydra making the run directory
        path = Path(str(err.filename))
        blocking = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
        if blocking is not None:
            return (f"cannot make the directory {path}: {blocking} is a file (is hydra.run.dir, or a directory "
                    "above it, a file?)")
    return None


@contextmanager
def unknown_options_one_line(prog: str):
    """An option Hydra cannot set because the config has no such key, a config-group choice that does not exist, or
    `+` on a key that does (`composition_line`): `<prog>: error: <line>`, exit status 2."""
    try:
        yield
    except Exception as err:
        line = unknown_option_line(err, prog) or composition_line(err)
        if line is None or os.environ.get("DMTP_TRACEBACK"):
            raise
        print(f"{prog}: error: {line}", file=sys.stderr)
        raise SystemExit(2) from None


def _faults_as_one_line(prog: str, func):
    with environment_faults_one_line(prog), unknown_options_one_line(prog):
        return func()


@contextmanager
def hydra_faults_one_line(prog: str):
    """Run a Hydra command so that an environment fault becomes one line and exit status 1 wherever it is
    raised: in the job, or in Hydra's own steps before and after it (the run directory, its copy of the
    composed config), which Hydra's reporter (`run_and_report`, a module global of hydra._internal.utils,
    which every step calls) would otherwise print as a traceback.

    Its reporter is wrapped for the call, so everything else Hydra reports looks as before. A Hydra without that
    private hook still runs the command: faults in the job stay one line (the command's own handler), Hydra's own
    writes fall back to its traceback (tests/test_disk_full.py checks the hook is there in the Hydra we install).
    Ctrl-C ends the command with one line too, exit status 130 (the shell's 128 + SIGINT)."""
    import hydra._internal.utils as hydra_utils

    original = getattr(hydra_utils, "run_and_report", None)
    if original is not None:
        hydra_utils.run_and_report = lambda func: original(lambda: _faults_as_one_line(prog, func))
    try:
        yield
    except KeyboardInterrupt:   # Ctrl-C: the user knows why; a run stopped before its first step has undone itself
        if os.environ.get("DMTP_TRACEBACK"):
            raise
        print(f"{prog}: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        if original is not None:
            hydra_utils.run_and_report = original


def drafter_path_shorthand(argv: list[str]) -> list[str]:
    """`drafter=<dir>` -> `drafter.path=<dir>` (dmtp.infer): `drafter` is also the name of the training's
    config group, which Hydra would otherwise try to select."""
    return ["drafter.path=" + a[len("drafter="):] if a.startswith("drafter=") else a for a in argv]
