"""Which target an exported drafter belongs to, recorded so that it can be checked later.

A drafter is trained against one target's hidden states and (for DMTP) its native MTP; decoded against
another checkpoint of the same shapes it runs, silently worse. config.json's "dmtp" section therefore
records the target as given (a local path or a hub id), the sha256 of its config.json and of the files
holding its MTP tensors (what `sha256sum` prints, so a user can check them by hand), and decoding compares
the target's hashes with the recorded ones (`target_mismatch`: config.json, then the MTP's files).
"""
from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

CHUNK = 1 << 20


def file_sha256(path: str | Path) -> str:
    stat = Path(path).stat()
    return _sha256(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=64)
def _sha256(path: str, size: int, mtime_ns: int) -> str:   # once per file version in a process (load, then report)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def config_sha256(target: str | Path) -> str | None:
    """The sha256 of a local target's config.json (None for a hub id or a directory without one)."""
    config = Path(str(target)).expanduser() / "config.json"
    return file_sha256(config) if config.is_file() else None


def mtp_file_hashes(target: str | Path) -> dict[str, str] | None:
    """{file name: sha256} of the files holding a local target's MTP tensors (one for the embedded targets'
    mtp.safetensors; a release may spread its MTP over its last shards); None when it has no MTP or is not a
    local checkpoint."""
    from dmtp.models.mtp_checkpoint import read_checkpoint_mtp
    from dmtp.models.mtp_errors import MTPLoadError

    root = Path(str(target)).expanduser()
    try:
        _, _, index, layout, names = read_checkpoint_mtp(root)
    except (FileNotFoundError, MTPLoadError, ValueError, OSError):
        return None
    if layout == "none":
        return None
    files = sorted({Path(index.files[k]) for k in names})
    return {f.name: file_sha256(f) for f in files}


# Weights larger than this are not hashed at decoding time (a real checkpoint's shards: minutes of reading).
HASHED_WEIGHTS_MAX_BYTES = 512 << 20
WEIGHT_SUFFIXES = (".safetensors",)


def weights_digest(target: str | Path) -> str | None:
    """A short fingerprint of a local target's weights, which every results table names: the first 12 hex digits
    of the sha256 over "<file> <sha256>" lines of its *.safetensors files in name order (None for a hub id, or
    for weights over HASHED_WEIGHTS_MAX_BYTES, which would take minutes to read: a real checkpoint's shards)."""
    root = Path(str(target)).expanduser()
    files = sorted(p for p in root.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES)) \
        if root.is_dir() else []
    if not files or sum(f.stat().st_size for f in files) > HASHED_WEIGHTS_MAX_BYTES:
        return None
    lines = "".join(f"{f.name} {file_sha256(f)}\n" for f in files)
    return hashlib.sha256(lines.encode()).hexdigest()[:12]


def target_provenance(target: str | Path) -> dict:
    """config.json "dmtp" fields naming the target and fingerprinting it (hashes null where not local)."""
    return {"target": str(target), "target_config_sha256": config_sha256(target),
            "target_mtp_sha256": mtp_file_hashes(target)}


def target_mismatch(recorded: dict, target: str | Path | None, what: str = "this drafter") -> str | None:
    """One warning line when `target`'s config.json differs from the one the drafter recorded (`recorded`:
    config.json's "dmtp" section); None when they agree or either hash is unknown (a hub id, an old export)."""
    if target is None:
        return None
    expected, actual = recorded.get("target_config_sha256"), config_sha256(target)
    if expected and actual and expected != actual:
        return (f"[dmtp] warning: {what} was trained for {recorded.get('target')} (config.json sha256 "
                f"{expected[:12]}), but decodes against {target} (config.json sha256 {actual[:12]}): its acceptance "
                "may be lower; tokens stay the target's")
    expected_mtp = recorded.get("target_mtp_sha256")
    actual_mtp = mtp_file_hashes(target) if expected_mtp else None
    if not actual_mtp or actual_mtp == expected_mtp:
        return None
    return (f"[dmtp] warning: {what} was trained for {recorded.get('target')} (MTP sha256 {_short(expected_mtp)}), "
            f"but decodes against {target}, whose MTP differs (sha256 {_short(actual_mtp)}): its acceptance may be "
            "lower; tokens stay the target's")


def _short(hashes: dict) -> str:
    return ", ".join(f"{name} {digest[:12]}" for name, digest in sorted(hashes.items()))


__all__ = ["config_sha256", "file_sha256", "mtp_file_hashes", "target_mismatch", "target_provenance",
           "weights_digest"]
