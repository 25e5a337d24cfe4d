"""A base module never imports the module built on it: subclasses and families register themselves instead
(the import rules themselves, circles, tiers and commands, are tests/test_layering.py)."""
from __future__ import annotations

import pytest

from dmtp.models.dflash2 import DFlash2Drafter
from dmtp.models.drafter import DFLASH2_ARCH, DFLASH_ARCH, DRAFTER_CLASSES, DFlashConfig, DFlashDrafter, drafter_class


def test_drafter_architectures_are_registered():
    assert DRAFTER_CLASSES[DFLASH_ARCH] is DFlashDrafter and DRAFTER_CLASSES[DFLASH2_ARCH] is DFlash2Drafter
    config = DFlashConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=2, head_dim=16, vocab_size=50, num_target_layers=2,
                          target_layer_ids=[0], mask_token_id=3)
    assert drafter_class(config) is DFlashDrafter
    DRAFTER_CLASSES.pop(DFLASH_ARCH)
    try:
        with pytest.raises(ValueError, match="no drafter class is registered for architecture 'DFlashDraftModel'"):
            drafter_class(config)
    finally:
        DRAFTER_CLASSES[DFLASH_ARCH] = DFlashDrafter
