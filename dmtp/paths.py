"""Where dmtp keeps what it builds: `$DMTP_HOME`, default `~/.cache/dmtp`."""
from __future__ import annotations

import os
from pathlib import Path


def dmtp_home() -> Path:
    return Path(os.environ.get("DMTP_HOME", Path.home() / ".cache" / "dmtp")).expanduser()


def targets_dir() -> Path:
    return dmtp_home() / "targets"
