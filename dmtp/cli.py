"""Command-line error reporting: bad input ends a command with one line, not a traceback.

Configuration and data problems surface as ValueError / FileNotFoundError (MTPLoadError is a
ValueError) with a message that names the problem; the command prints `<prog>: error: <message>`
and exits with status 2. Environment faults (a full disk, a quota, a read-only filesystem: a write
refused, see dmtp.atomic_io), wherever they are raised, Hydra's own writes included, print one line too
and exit with status 1. `DMTP_TRACEBACK=1` re-raises instead, for debugging.
"""
from __future__ import annotations

import errno
import os
import sys
from contextlib import contextmanager

from dmtp.atomic_io import WriteFailed

USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError)
# errno -> what the user is told; the OS's own text for each, as libraries that wrap an OSError quote it
# (safetensors' writer, torch's stream writer) without its errno.
ENVIRONMENT_FAULTS = {errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded",
                      errno.EROFS: "read-only file system"}
_FAULT_TEXT = {os.strerror(code): what for code, what in ENVIRONMENT_FAULTS.items()}
_RERUN = "free space or fix the filesystem and rerun"


@contextmanager
def one_line_errors(prog: str):
    try:
        yield
    except (WriteFailed, *USER_ERRORS) as err:
        if os.environ.get("DMTP_TRACEBACK"):
            raise
        message = (err.strerror if isinstance(err, WriteFailed) else " ".join(str(err).split())) or type(err).__name__
        print(f"{prog}: error: {message}", file=sys.stderr)
        raise SystemExit(1 if isinstance(err, WriteFailed) else 2) from None


def environment_fault(err: BaseException) -> str | None:
    """The one line for an environment fault anywhere in `err`'s chain (its causes and contexts), else None."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in ENVIRONMENT_FAULTS:
            where = f" writing {err.filename}" if err.filename else ""
            return f"{ENVIRONMENT_FAULTS[err.errno]}{where} ({err.strerror}); {_RERUN}"
        text = str(err)
        for os_text, what in _FAULT_TEXT.items():
            if os_text in text:
                return f"{what} while writing ({type(err).__name__}: {reason(err)}); {_RERUN}"
        err = err.__cause__ or err.__context__
    return None


@contextmanager
def environment_faults_one_line(prog: str):
    """An environment fault raised inside: `<prog>: error: <what>`, exit status 1; anything else unchanged."""
    try:
        yield
    except Exception as err:
        line = environment_fault(err)
        if line is None or os.environ.get("DMTP_TRACEBACK"):
            raise
        print(f"{prog}: error: {line}", file=sys.stderr)
        raise SystemExit(1) from None   # not an Exception: Hydra's reporter lets it through


def _faults_as_one_line(prog: str, func):
    with environment_faults_one_line(prog):
        return func()


@contextmanager
def hydra_faults_one_line(prog: str):
    """Run a Hydra command so that an environment fault becomes one line and exit status 1 wherever it is
    raised: in the job, or in Hydra's own steps before and after it (the run directory, its copy of the
    composed config), which Hydra's reporter (`run_and_report`, a module global of hydra._internal.utils,
    which every step calls) would otherwise print as a traceback. Its reporter is wrapped for the call, so
    everything else Hydra reports looks as before."""
    import hydra._internal.utils as hydra_utils

    original = hydra_utils.run_and_report
    hydra_utils.run_and_report = lambda func: original(lambda: _faults_as_one_line(prog, func))
    try:
        yield
    finally:
        hydra_utils.run_and_report = original


def reason(err: BaseException, limit: int = 160) -> str:
    """The first sentence of a library's error, to quote inside a one-line message."""
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return first.split(". ")[0][:limit]


def drafter_path_shorthand(argv: list[str]) -> list[str]:
    """`drafter=<dir>` -> `drafter.path=<dir>` (dmtp.infer): `drafter` is also the name of the training's
    config group, which Hydra would otherwise try to select."""
    return ["drafter.path=" + a[len("drafter="):] if a.startswith("drafter=") else a for a in argv]
