"""Dual-anchor fusion: slots [A, F, MASK x6] (8 slots), F as in fusion_t1."""
import torch

from dmtp.injection.base import Injection, TokenHiddenFusion
from dmtp.injection.catalogue import register_variant


@register_variant(name="dual_anchor_fusion",
                  slots="[A, F, MASK x6]",
                  injected="as fusion_t1, A kept",
                  label="[A, F(T1,h), MASK x6]")
class DualAnchorFusion(Injection):
    first_slot_offset = 0

    def __init__(self, hidden_size, num_target_features, mask_token_id, block_size):
        super().__init__(hidden_size, num_target_features, mask_token_id, block_size)
        self.fusion = TokenHiddenFusion(hidden_size, zero_init=False)

    def build_slots(self, embed, anchor, t1, h_mtp):
        rest = self.t1_and_masks(embed, t1)
        fused = self.fusion(rest[:, 0], h_mtp).to(rest.dtype)
        return torch.cat([embed(anchor[:, None]), fused[:, None], rest[:, 1:]], dim=1)
