"""Sharded caches written by many workers: which shards are whose, one lock per shard, the manifest.

The regeneration cache (regenerate.py) and the feature cache (feature_cache.py) keep their output as
numbered shards in one directory, each shard written atomically (dmtp.atomic_io) and checked by its own
reader. W independent workers (processes, GPUs or nodes sharing the filesystem) split a cache between
them: worker i of W owns shards i, i + W, i + 2W, ... (`Share`). Whoever writes a shard holds its lock
file (`.shard-00007.lock`), so any mix of workers and trainers on one cache never writes a shard twice: a
second comer waits, then reads what the first wrote. A killed worker loses only the shard it was writing,
and the same worker started again resumes after its finished shards.

The manifest (`manifest.json`) is written once every shard of a cache is there and verified: each shard's
checksum, rows and bytes, and the cache's total (what the merge step and the storage bill read).
"""
from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dmtp.atomic_io import write_json

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Share:
    """Worker `worker` of `workers` (0-based): the shards it writes."""
    workers: int = 1
    worker: int = 0

    def __post_init__(self):
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise ValueError(f"workers must be an integer >= 1, got {self.workers!r}")
        if isinstance(self.worker, bool) or not isinstance(self.worker, int) or not 0 <= self.worker < self.workers:
            raise ValueError(f"worker must be an integer in 0..{self.workers - 1} (one of workers={self.workers}), "
                             f"got {self.worker!r}")

    @property
    def whole(self) -> bool:
        return self.workers == 1

    def indices(self, n_shards: int) -> list[int]:
        return list(range(self.worker, n_shards, self.workers))

    def owner(self, index: int) -> int:
        return index % self.workers

    def __str__(self) -> str:
        return "all shards" if self.whole else f"worker {self.worker} of {self.workers}"


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


def shard_lock(out_dir: Path, index: int, on_wait: Callable[[str], None] | None = None):
    """Hold shard `index`'s lock (waiting for another writer to finish it; `on_wait(holder)` runs before the wait)."""
    return file_lock(out_dir, f"shard-{index:05d}", on_wait)


def process_group() -> str:
    """The distributed run this process is a rank of (its rendezvous address, shared by its ranks and by no
    other run at the same time), or "" outside one."""
    import torch

    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    dist = torch.distributed
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else \
        int(os.environ.get("WORLD_SIZE") or 1)
    return f"{addr}:{port}" if addr and port and world > 1 else ""


def _holder(fd: int) -> str:
    """Who holds a lock, as its holder wrote it: "this run's rank (pid N)" (the same distributed run) or
    "another run (pid N)". The holder writes it right after taking the lock and clears it on release."""
    for _ in range(20):   # the instant between the holder's lock and its write
        holder = os.pread(fd, 200, 0).decode(errors="replace").split()   # "<pid> <its process group>"
        if holder:
            break
        time.sleep(0.05)
    pid = f" (pid {holder[0]})" if holder else ""
    return f"this run's rank{pid}" if len(holder) == 2 and holder[1] == process_group() else f"another run{pid}"


@contextmanager
def file_lock(out_dir: Path, name: str, on_wait: Callable[[str], None] | None = None):
    """Hold the lock `.<name>.lock` of `out_dir` (another holder is waited for; `on_wait(holder)`, who holds it,
    runs before the wait).

    The holder notes its pid and distributed run in the file for a waiter to say."""
    fd = os.open(out_dir / f".{name}.lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait(_holder(fd))
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)   # what a killed holder left
        os.pwrite(fd, f"{os.getpid()} {process_group() or '-'}".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)   # releases the lock (so does the process ending, however it ends)


def _stat(path: Path):
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino


def fill(out_dir: Path, indices: list[int], read: Callable[[int], Any], write: Callable[[int], Any],
         on_wait: Callable[[str], None] | None = None) -> Iterator[tuple[int, Any, bool]]:
    """For each shard of `indices`, in order: (index, its value, whether this call wrote it).

    `read(i)`: the shard's value if its file is there and verifies, else None (a damaged one is named by the
    reader); `write(i)`: make it, write it, return its value. A shard found missing or damaged is written
    under its lock, unless another writer finished it while this one waited."""
    for index in indices:
        path = out_dir / shard_name(index)
        before = _stat(path)
        value = read(index) if before is not None else None
        written = False
        if value is None:
            with shard_lock(out_dir, index, on_wait):
                now = _stat(path)
                if now is not None and now != before:   # someone else wrote it meanwhile
                    value = read(index)
                if value is None:
                    value, written = write(index), True
        yield index, value, written


def write_manifest(out_dir: Path, shards: list[dict], **facts) -> dict:
    """manifest.json: every shard's record ({"file", "sha256", "rows", "bytes"}, in order) and the totals."""
    manifest = {"shards": shards, "rows": sum(s["rows"] for s in shards),
                "bytes": sum(s["bytes"] for s in shards), **facts}
    write_json(out_dir / MANIFEST, manifest)
    return manifest


def read_manifest(out_dir: Path) -> dict | None:
    try:
        return json.loads((out_dir / MANIFEST).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def workers_missing(missing: list[int], share_of: int) -> str:
    """'shards 3, 5 (workers 1, 1 of 2)'-like wording of the shards a cache lacks and who owns them."""
    shown = ", ".join(str(i) for i in missing[:8]) + (f", ... ({len(missing)} in all)" if len(missing) > 8 else "")
    owners = sorted({i % share_of for i in missing})
    who = "" if share_of == 1 else f" (worker{'s' if len(owners) > 1 else ''} " \
        f"{', '.join(map(str, owners))} of {share_of})"
    return f"shard{'s' if len(missing) > 1 else ''} {shown}{who}"


__all__ = ["MANIFEST", "Share", "file_lock", "fill", "read_manifest", "shard_lock", "shard_name", "workers_missing",
           "write_manifest"]
