"""Files a later step trusts are replaced whole or not at all: the one rule for every write dmtp makes.

A file is written under a temporary name in its own directory (`.<name>.tmp-<pid>-<thread>`), flushed and
fsynced, then renamed over the final name (a rename within one filesystem is atomic), and the directory is
fsynced so that the rename itself survives a crash. A kill or a full disk during the write leaves the
previous file exactly as it was; the temporary is removed on failure, and one left by a killed process is
removed by `remove_stale_temporaries` when the next run starts in that directory. A writer holds an
exclusive lock on its temporary while it writes, so a temporary is "stale" exactly when nobody holds its
lock (a pid, which the system reuses, is only in the name to make it recognisable).

A write that fails for a reason of the machine (disk full, quota, read-only, I/O error) raises
`WriteFailed` (dmtp.errors): one line naming the file, which the commands report with exit status 1.

No torch at import time: the commands import this module before anything heavy.
"""
from __future__ import annotations

import fcntl
import io
import json
import os
import re
import secrets
import shutil
import stat
import threading
from contextlib import contextmanager
from pathlib import Path

from dmtp.errors import WriteFailed

TMP_MARK = ".tmp-"   # `.<name>.tmp-<pid>-<thread>`
_OS_ERROR_IN_TEXT = re.compile(r"os error (\d+)")   # how safetensors (Rust) reports an OS error


def temporary_name(path: Path) -> Path:
    """`.<name>.tmp-<pid>-<thread>`: two writers of one file never share a temporary."""
    return path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}-{threading.get_native_id()}")


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:   # some filesystems cannot open a directory; the rename is still atomic there
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _failure(path: Path, err: BaseException) -> WriteFailed | None:
    """`err` as a one-line WriteFailed naming `path`, if it is the machine's fault; else None."""
    code = err.errno if isinstance(err, OSError) else None
    if code is None:
        found = _OS_ERROR_IN_TEXT.search(str(err))
        code = int(found.group(1)) if found else None
    if code is None:
        return None
    return WriteFailed(code, path, kept=path.name)


def _settle(tmp: Path, lock_fd: int) -> None:
    """The temporary's content on disk, with the mode the umask gives.

    Most writers truncate the temporary we created (same inode); safetensors' writer makes a new file of its own,
    mode 0600, and renames it over ours: that file gets our file's mode and is the one fsynced."""
    written = os.open(tmp, os.O_RDONLY)
    try:
        if os.fstat(written).st_ino != os.fstat(lock_fd).st_ino:
            os.fchmod(written, stat.S_IMODE(os.fstat(lock_fd).st_mode))
        os.fsync(written)
    finally:
        os.close(written)


@contextmanager
def atomic_path(path: str | Path):
    """Yields the temporary path to write `path`'s new content to (with any writer that takes a file name);
    on success it replaces `path` in one step, on any failure `path` is untouched and the temporary gone."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    try:   # 0o666 less the umask: the mode any file the user's programs create gets (readable by others at 022)
        lock_fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o666)
    except OSError as e:
        raise (_failure(path, e) or e) from None
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)   # marks the temporary as being written (see module doc)
        yield tmp
        _settle(tmp, lock_fd)
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        failed = _failure(path, e) if isinstance(e, Exception) else None
        if failed is not None:
            raise failed from None
        raise
    finally:
        os.close(lock_fd)
    _fsync_dir(path.parent)


def write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
        f.flush()


def write_text(path: str | Path, text: str) -> None:
    write_bytes(path, text.encode())


def write_json(path: str | Path, obj, **dumps_options) -> None:
    write_text(path, json.dumps(obj, **{"indent": 2, **dumps_options}) + "\n")


def save_safetensors(path: str | Path, tensors: dict, metadata: dict[str, str] | None = None) -> None:
    from safetensors.torch import save_file

    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)


def torch_save(obj, path: str | Path) -> None:
    """torch.save, atomically.

    Serialised in memory first (as Lightning does): torch's file writer turns an OS error into an opaque
    RuntimeError, a plain write keeps it an OSError."""
    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    write_bytes(path, buffer.getbuffer())


def staging_directory(final: str | Path) -> Path:
    """A new directory beside `final` to build its whole content in, then `publish_directory` it."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    while True:   # mkdtemp's directories are 0700; this one gets the mode the umask gives, as `final` would
        staging = final.parent / f"{temporary_name(final).name}-{secrets.token_hex(4)}"
        try:
            staging.mkdir(0o777)
            return staging
        except FileExistsError:
            continue


def publish_directory(staging: Path, final: str | Path) -> None:
    """Every file of `staging` on disk, then `staging` renamed to `final` (which must not exist)."""
    for f in Path(staging).rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    os.replace(staging, final)
    _fsync_dir(Path(final).parent)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temporaries(directory: str | Path) -> list[Path]:
    """Remove the temporaries that killed writers left in `directory` (not those being written now).

    A file is stale when no writer holds its lock; a staging directory when the process named in it is gone."""
    directory = Path(directory)
    removed = []
    for tmp in directory.glob(f".*{TMP_MARK}*") if directory.is_dir() else ():
        if tmp.is_dir():
            pid = tmp.name.rsplit(TMP_MARK, 1)[1].split("-", 1)[0]
            if pid.isdigit() and not _pid_alive(int(pid)):
                shutil.rmtree(tmp, ignore_errors=True)
                removed.append(tmp)
            continue
        if not tmp.is_file():
            continue
        try:
            fd = os.open(tmp, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:   # a live writer holds it
            continue
        else:
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
        finally:
            os.close(fd)
    return removed


__all__ = ["WriteFailed", "atomic_path", "write_bytes", "write_text", "write_json", "save_safetensors", "torch_save",
           "remove_stale_temporaries", "temporary_name", "staging_directory", "publish_directory"]
