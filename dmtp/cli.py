"""Command-line error reporting: bad input ends a command with one line, not a traceback.

Configuration and data problems surface as ValueError / FileNotFoundError (MTPLoadError is a
ValueError) with a message that names the problem; the command prints `<prog>: error: <message>`
and exits with status 2. A fault of the machine (a write refused: disk full, quota, read-only; see
dmtp.atomic_io) is one line too, with exit status 1. `DMTP_TRACEBACK=1` re-raises instead, for debugging.
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager

from dmtp.atomic_io import WriteFailed

USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError)


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


def reason(err: BaseException, limit: int = 160) -> str:
    """The first sentence of a library's error, to quote inside a one-line message."""
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return first.split(". ")[0][:limit]


def drafter_path_shorthand(argv: list[str]) -> list[str]:
    """`drafter=<dir>` -> `drafter.path=<dir>` (dmtp.infer): `drafter` is also the name of the training's
    config group, which Hydra would otherwise try to select."""
    return ["drafter.path=" + a[len("drafter="):] if a.startswith("drafter=") else a for a in argv]
