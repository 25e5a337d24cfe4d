"""The training text's sources (`data.source`), one file each, registered once: what each needs from the
options (checked when the config is read, one line) and how it yields the training examples."""
from __future__ import annotations

from dmtp.data.sources.catalogue import SOURCES, DataSource, source_named
from dmtp.data.sources import embedded as _embedded  # noqa: F401  (registers embedded)
from dmtp.data.sources import files as _files  # noqa: F401  (registers files)
from dmtp.data.sources import hf as _hf  # noqa: F401  (registers hf)

__all__ = ["SOURCES", "DataSource", "source_named"]
