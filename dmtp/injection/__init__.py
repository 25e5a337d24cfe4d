"""Injection variants: how the MTP's first candidate (and its hidden) reach the DFlash drafter.

The catalogue is explicit; Hydra's `conf/injection/<name>.yaml` points `_target_` at one class.
"""
from dmtp.injection.base import BLOCK_CANDIDATES, Injection
from dmtp.injection.context_fusion import ContextFusion
from dmtp.injection.dual_anchor_fusion import DualAnchorFusion
from dmtp.injection.dual_anchor_zero_init import DualAnchorZeroInit
from dmtp.injection.fusion_t1 import FusionT1
from dmtp.injection.hidden_residual_t1 import HiddenResidualT1
from dmtp.injection.mtp_context_only import MTPContextOnly
from dmtp.injection.multi_mtp_zero_init import MultiMTPZeroInit
from dmtp.injection.raw_dflash import RawDFlash
from dmtp.injection.six_mask_residual import SixMaskResidual
from dmtp.injection.token_only import TokenOnly

VARIANTS = {
    "raw_dflash": RawDFlash,
    "token_only": TokenOnly,
    "hidden_residual_t1": HiddenResidualT1,
    "six_mask_residual": SixMaskResidual,
    "context_fusion": ContextFusion,
    "mtp_context_only": MTPContextOnly,
    "fusion_t1": FusionT1,
    "dual_anchor_fusion": DualAnchorFusion,
    "dual_anchor_zero_init": DualAnchorZeroInit,
    "multi_mtp_zero_init": MultiMTPZeroInit,
}

__all__ = ["BLOCK_CANDIDATES", "Injection", "VARIANTS", *[c.__name__ for c in VARIANTS.values()]]
