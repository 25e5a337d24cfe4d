"""What a failure says: the wording every layer shares, so a command can end with one line.

Two kinds, each with one way to say it (dmtp.cli prints them as `<prog>: error: <line>`):
- bad input (configuration, data, a file that is not what it should be): a `USER_ERRORS` exception whose
  message names the problem; the command exits with status 2;
- an environment fault (the machine refused a write: disk full, quota, read-only filesystem, a directory
  this user may not write, an I/O error): `environment_fault(err)` finds it anywhere in an exception's chain
  and gives its one line,
  built by `fault_line`; the command exits with status 1. dmtp's own writes (dmtp.atomic_io) raise
  `WriteFailed`, whose message is that line already; a library's fault (an OSError, or safetensors' error
  quoting the OS's text) is worded the same way.

Nothing here imports anything of dmtp: every tier may use it.
"""
from __future__ import annotations

import errno
import os

USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError)
# errno -> what the user is told; the OS's own text for each, as libraries that wrap an OSError quote it
# (safetensors' writer, torch's stream writer) without its errno.
ENVIRONMENT_FAULTS = {errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded",
                      errno.EROFS: "read-only file system"}
# A path this user may not write (or read): EACCES for a user without the rights, EPERM for an immutable file
# even root may not change (chattr +i). Not read from a library's text, as the codes above are: "Permission
# denied" is also what a server says for a refused download, which is no fault of this machine.
PERMISSION_FAULTS = {errno.EACCES: "permission denied", errno.EPERM: "operation not permitted"}
_FAULT_TEXT = {os.strerror(code): what for code, what in ENVIRONMENT_FAULTS.items()}
RERUN = "free space or fix the filesystem and rerun"
RERUN_ELSEWHERE = "give this user access there or point the command elsewhere (hydra.run.dir=<dir>, DMTP_HOME=<dir>)"


def fault_line(code: int, filename=None, os_text: str | None = None, kept: str | None = None) -> str:
    """The one line for an environment fault: what happened, where, the OS's words, what was kept, what to do."""
    os_text = os_text or os.strerror(code)
    if code in PERMISSION_FAULTS:   # a read may be refused too: the path, not "writing" it
        return f"{PERMISSION_FAULTS[code]}{f' on {filename}' if filename else ''} ({os_text}); {RERUN_ELSEWHERE}"
    what = ENVIRONMENT_FAULTS.get(code) or os_text.lower()
    where = f" writing {filename}" if filename else ""
    note = f"; the previous {kept}, if any, is left as it was" if kept else ""
    return f"{what}{where} ({os_text}){note}; {RERUN}"


class WriteFailed(OSError):
    """The machine refused one of dmtp's writes: an environment fault; its message is its one line."""

    def __init__(self, code: int, path, kept: str | None = None):
        super().__init__(code, fault_line(code, path, kept=kept), str(path))

    def __str__(self) -> str:
        return self.strerror


def environment_fault(err: BaseException) -> str | None:
    """The one line for an environment fault anywhere in `err`'s chain (its causes and contexts), else None."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, WriteFailed):
            return err.strerror
        if isinstance(err, OSError) and (err.errno in ENVIRONMENT_FAULTS or err.errno in PERMISSION_FAULTS):
            return fault_line(err.errno, err.filename, err.strerror)
        text = str(err)
        for os_text, what in _FAULT_TEXT.items():
            if os_text in text:
                return f"{what} while writing ({type(err).__name__}: {reason(err)}); {RERUN}"
        err = err.__cause__ or err.__context__
    return None


def reason(err: BaseException, limit: int = 160) -> str:
    """The first sentence of a library's error, to quote inside a one-line message."""
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return first.split(". ")[0][:limit]
