"""dmtp: the target's native MTP proposes the first draft token, a DFlash block drafter the rest."""

__version__ = "0.1.0"
