"""Injection variants: how the MTP's first candidate (and its hidden) reach the DFlash drafter.

Each variant registers itself in the catalogue (`dmtp.injection.catalogue`, `@register_variant` on its
class); importing the package imports every variant module, so the catalogue is complete here. Hydra's
`conf/injection/<name>.yaml` points `_target_` at one class (tests/test_variant_catalogue.py checks
that the YAMLs and the catalogue agree).
"""
# The catalogue lists variants in import order (the README table's and the report's order): the
# baseline, the single-anchor ones, the context ones, the fusions, then the dual-anchor ones.
from dmtp.injection.base import Injection
from dmtp.injection.catalogue import CATALOGUE, variant, variant_of
from dmtp.injection.raw_dflash import RawDFlash
from dmtp.injection.token_only import TokenOnly
from dmtp.injection.hidden_residual_t1 import HiddenResidualT1
from dmtp.injection.six_mask_residual import SixMaskResidual
from dmtp.injection.context_fusion import ContextFusion
from dmtp.injection.mtp_context_only import MTPContextOnly
from dmtp.injection.fusion_t1 import FusionT1
from dmtp.injection.zero_init_t1 import ZeroInitT1
from dmtp.injection.dual_anchor_fusion import DualAnchorFusion
from dmtp.injection.dual_anchor_zero_init import DualAnchorZeroInit
from dmtp.injection.multi_mtp_zero_init import MultiMTPZeroInit

# name -> class, for callers that only need the classes (tests, tools).
VARIANTS = {name: entry.cls for name, entry in CATALOGUE.items()}

__all__ = ["CATALOGUE", "Injection", "VARIANTS", "variant", "variant_of",
           "RawDFlash", "TokenOnly", "HiddenResidualT1", "SixMaskResidual", "ContextFusion", "MTPContextOnly",
           "FusionT1", "ZeroInitT1", "DualAnchorFusion", "DualAnchorZeroInit", "MultiMTPZeroInit"]
