"""What dmtp writes is readable by whoever the user's umask lets read it (issue 43): an exported drafter's
model.safetensors (written by safetensors' own writer, which makes its files 0600) has the mode of its config.json,
and so do the directories an embedded target is built in."""
from __future__ import annotations

import os
import stat

import pytest

from dmtp.atomic_io import publish_directory, staging_directory, write_text
from dmtp.drafters.block_drafter import fresh_drafter_for


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_an_export_and_a_published_directory_get_the_umasks_mode(umask, tmp_path, micro_target):
    old = os.umask(umask)
    try:
        drafter = tmp_path / "drafter"
        fresh_drafter_for(micro_target, "dual_anchor_zero_init", 3).save(drafter)
        staging = staging_directory(tmp_path / "target")
        write_text(staging / "config.json", "{}\n")
        publish_directory(staging, tmp_path / "target")
    finally:
        os.umask(old)
    files = 0o666 & ~umask
    assert {p.name: _mode(p) for p in drafter.iterdir()} == {p.name: files for p in drafter.iterdir()}
    assert {"model.safetensors", "config.json", "README.md"} <= {p.name for p in drafter.iterdir()}
    assert (_mode(tmp_path / "target"), _mode(tmp_path / "target" / "config.json")) == (0o777 & ~umask, files)
