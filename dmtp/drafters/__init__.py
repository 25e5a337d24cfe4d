"""Drafter architectures, one file each, and what every architecture shares.

dflash.py        DFlash v1: its config (and published config.json layout), layers, mask and the block width
dflash2.py       DFlash2: grouped dynamic causal convolutions and a candidate-path selector
dspark.py        DSpark: a Markov head and a confidence head
registry.py      `register_drafter` / `ARCHITECTURES`: each architecture registered once, looked up by name
checkpoint.py    `save_drafter` / `load_drafter`: config.json + model.safetensors, the published layout
config_check.py  what a drafter's config.json must hold before a module is built from it
factory.py       `build_drafter`: a fresh backbone of any architecture sized to a target
fit.py           whether a drafter fits its target and its injection (one rule and one message each)
block_drafter.py `BlockDrafter`: backbone + its injection, built, trained, saved and loaded as one unit

Importing the package registers every shipped architecture, so a checkpoint of any of them loads through
`load_drafter` whichever module the caller imported first.
"""
from dmtp.drafters import dflash as _dflash  # noqa: F401  (registers DFlashDraftModel)
from dmtp.drafters import dflash2 as _dflash2  # noqa: F401  (registers DFlash2DraftModel)
from dmtp.drafters import dspark as _dspark  # noqa: F401  (registers Qwen3DSparkModel)
