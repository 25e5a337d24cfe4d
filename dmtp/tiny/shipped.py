"""The embedded targets' built weights, shipped with the package (a few MB each), so that every machine runs the
same testbed: a rebuild on another machine or torch build trains other weights from the same recipe (its CPU
kernels sum in another order over the build's steps), and with them other tables.

`dmtp/tiny/shipped/<preset>-<hash>/` is a built target's directory exactly as `python -m dmtp.tiny.build` wrote it
(config.json, safetensors, tokenizer, build_report.json with each weight file's sha256). On first use the target is
unpacked into the cache ($DMTP_HOME/targets/<preset>-<hash>, the same place a build goes) after every weight file
is checked against its recorded sha256; a preset whose recipe changed has another hash and is built instead.
`python -m dmtp.tiny.build` still builds from the recipe and says whether it reproduced the shipped weights.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from dmtp.atomic_io import publish_directory, remove_stale_temporaries, staging_directory, write_json
from dmtp.models.provenance import file_sha256, weights_digest

SHIPPED_DIR = Path(__file__).with_name("shipped")
UNPACKED = "unpacked_from_package"   # set in an unpacked copy's build_report.json (the weights are untouched)


def shipped_copy(name: str) -> Path | None:
    """The shipped directory of the target whose cache directory is named `name` (e.g. tiny-0d0bd710), if any."""
    path = SHIPPED_DIR / name
    return path if (path / "build_report.json").is_file() else None


def _recorded_hashes(path: Path) -> dict[str, str]:
    return json.loads((path / "build_report.json").read_text()).get("weights_sha256") or {}


def unpack_shipped(out_dir: Path, progress: bool = True) -> Path | None:
    """Copy the shipped build of `out_dir`'s target into `out_dir` (checked, then published whole); None when the
    package ships none for it.

    A shipped file that does not match its recorded sha256 is refused in one line."""
    out_dir = Path(out_dir)
    source = shipped_copy(out_dir.name)
    if source is None:
        return None
    recorded = _recorded_hashes(source)
    remove_stale_temporaries(out_dir.parent)
    staging = staging_directory(out_dir)
    try:
        for f in sorted(source.iterdir()):
            if f.is_file():
                shutil.copyfile(f, staging / f.name)
        for name, digest in recorded.items():
            actual = file_sha256(staging / name) if (staging / name).is_file() else None
            if actual != digest:
                raise ValueError(f"shipped target {source}: {name} has sha256 {actual or 'missing'}, its build report "
                                 f"records {digest}: reinstall dmtp, or build it with python -m dmtp.tiny.build")
        report = json.loads((staging / "build_report.json").read_text())
        write_json(staging / "build_report.json", {**report, UNPACKED: True})
        if not (out_dir / "build_report.json").exists():   # another process may have unpacked it meanwhile
            if out_dir.exists():
                shutil.rmtree(out_dir)
            publish_directory(staging, out_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    if progress:
        print(f"[dmtp] {out_dir.name} target unpacked from the package into {out_dir} (weights {weights_digest(out_dir)}, "
              "checked against their recorded sha256)")
    return out_dir


def compare_with_shipped(built: Path) -> str:
    """One line: whether a built target's weights are the shipped ones, byte for byte."""
    built = Path(built)
    source = shipped_copy(built.name)
    if source is None:
        return f"[dmtp] the package ships no build of {built.name} to compare with"
    mine, theirs = weights_digest(built), weights_digest(source)
    if json.loads((built / "build_report.json").read_text()).get(UNPACKED):
        same = "the" if mine == theirs else "NOT the"
        return (f"[dmtp] {built.name} was unpacked from the package: {same} shipped weights (digest {mine}); build it "
                "with --force to see whether this machine reproduces them")
    if mine == theirs:
        return f"[dmtp] reproduced the shipped weights of {built.name} exactly (digest {mine})"
    return (f"[dmtp] these weights (digest {mine}) differ from the shipped ones (digest {theirs}): another machine or "
            f"torch build trains other weights from the same recipe; every table names the digest it was measured "
            f"with (python -m dmtp.tiny.build --force --unpack restores the shipped ones)")


__all__ = ["SHIPPED_DIR", "compare_with_shipped", "shipped_copy", "unpack_shipped"]
