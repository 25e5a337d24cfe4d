"""The one error a target's MTP raises when it cannot be read or built (a ValueError: commands print it
as one line).

Its own module so that the loader and the family table both raise it without importing each other."""
from __future__ import annotations


class MTPLoadError(ValueError):
    pass
