"""Models: the target runtime, native MTP layers and their loader, the DFlash / DFlash2 / DSpark block drafters.

Importing the package registers every shipped drafter architecture with `dmtp.models.drafter`, so a
checkpoint of any of them loads through `load_drafter` whichever module the caller imported first.
"""
from dmtp.models import dflash2 as _dflash2  # noqa: F401  (registers DFlash2DraftModel)
from dmtp.models import dspark as _dspark  # noqa: F401  (registers Qwen3DSparkModel)
