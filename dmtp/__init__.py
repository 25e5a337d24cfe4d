"""dmtp: the target's native MTP proposes the first draft token, a DFlash block drafter the rest."""

from dmtp import resolvers as _resolvers

__version__ = "0.1.0"

_resolvers.register()   # conf/ interpolates them; `python -m dmtp.<cmd>` imports this first
