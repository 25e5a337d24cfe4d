"""One writer per run directory: a training run holds `<run>/.dmtp-lock` from the moment it takes the directory
until it ends, so a second `dmtp.train` pointed at it (resume=, ckpt_path= or a fresh run) is refused in one
line naming the process that holds it, instead of writing checkpoints, metrics and a drafter beside it.

The lock is the kernel's (`fcntl.flock` on a file kept open for the run's lifetime), not the file's presence:
the kernel drops it when the process ends, however it ends, so a run killed with SIGKILL never blocks its own
resume. The holder writes "<pid> <host>" into the file and removes it when it lets go; a file found when the
lock is free was left by a holder that was killed, which the taker says in one note.

Only the process that runs the job takes it (rank 0, dmtp.training.job): the other ranks of one distributed
run write through rank 0 and are not refused. No torch: the path rules stay light.
"""
from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
from pathlib import Path

from dmtp.configs import override

LOCK_NAME = ".dmtp-lock"
# Filesystems that offer no locks at all (some network and FUSE mounts): the run goes on, unguarded, and says so.
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)


def _holder(fd: int, wait: bool = True) -> tuple[str, str] | None:
    """(pid, host) as the holder wrote them into the lock file, None when it is empty; `wait`: for the instant
    between a holder's lock and its write."""
    for _ in range(20 if wait else 1):
        pid, _, host = os.pread(fd, 200, 0).decode(errors="replace").strip().partition(" ")
        if pid:
            return pid, host or "?"
        if wait:
            time.sleep(0.05)
    return None


class RunDirLock:
    """The lock of one run directory, held from `take` until `release` (or the process's end)."""

    def __init__(self):
        self.fd: int | None = None
        self.path: Path | None = None
        self.created = False   # the lock file was not there before `take` (a refused run leaves nothing)

    def holds(self, run_dir: str | Path) -> bool:
        return self.fd is not None and self.path == Path(run_dir) / LOCK_NAME

    def take(self, run_dir: str | Path, command: str = "dmtp.train") -> None:
        """Hold `run_dir`'s lock, or raise ValueError naming the process that holds it."""
        run_dir = Path(run_dir)
        if self.holds(run_dir):
            return
        self.release()   # one directory at a time
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / LOCK_NAME
        while True:
            created = not path.exists()
            fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid, host = _holder(fd) or ("?", "?")
                os.close(fd)
                where = "" if host == socket.gethostname() else f" on host {host}"
                raise ValueError(f"{run_dir} is in use by another {command} run (pid {pid}{where}, which holds "
                                 f"{path}): let it finish, or stop it (kill {pid}) and continue it with "
                                 f"{override('resume', run_dir)}") from None
            except OSError as e:
                if e.errno not in _NO_LOCKS:
                    os.close(fd)
                    raise
                print(f"[dmtp] {run_dir}: its filesystem offers no file locks, so no other run is kept out of it")
            try:   # the file a releasing holder removed between our open and our lock: take the new one
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        left = _holder(fd, wait=False)
        if left:   # a holder that never let go: killed (the kernel dropped its lock with it)
            pid, host = left
            print(f"[dmtp] {run_dir}: the run that held it (pid {pid} on {host}) ended without letting go "
                  "(killed?); taking it over")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}".encode(), 0)
        self.fd, self.path, self.created = fd, path, created

    def release(self) -> None:
        """Let go: the file removed, then the lock (the next taker finds no file, or a new one); safe to call twice."""
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        try:
            if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                self.path.unlink()
        except OSError:   # removed already (a run undone before its first step), or a read-only directory now
            pass
        finally:
            os.close(fd)


__all__ = ["LOCK_NAME", "RunDirLock"]
