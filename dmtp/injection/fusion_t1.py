"""Fusion on T1 (the October main method): slots [F, MASK x6], F = W[RMS_e(E(T1)); RMS_m(sg(h_mtp))]
REPLACES E(T1)."""
import torch

from dmtp.injection.base import Injection, TokenHiddenFusion
from dmtp.injection.catalogue import register_variant


@register_variant(name="fusion_t1",
                  slots="[F, MASK x6]",
                  injected="F = W[RMS(E(T1)); RMS(sg h_mtp)] replaces E(T1)",
                  label="[F(T1,h), MASK x6]")
class FusionT1(Injection):
    def __init__(self, hidden_size, num_target_features, mask_token_id, block_size):
        super().__init__(hidden_size, num_target_features, mask_token_id, block_size)
        self.fusion = TokenHiddenFusion(hidden_size, zero_init=False)

    def build_slots(self, embed, anchor, t1, h_mtp):
        slots = self.t1_and_masks(embed, t1)
        fused = self.fusion(slots[:, 0], h_mtp).to(slots.dtype)
        return torch.cat([fused[:, None], slots[:, 1:]], dim=1)
