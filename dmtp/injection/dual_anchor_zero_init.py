"""Dual-anchor zero-init (the current main method): slots [E(A), E(T1) + D, MASK x6],
D = W[RMS_e(E(T1)); RMS_m(sg(h_mtp))] with W = 0 at initialisation, so a fresh module is exactly a
dual-anchor drafter fed plain E(T1), and a published DFlash drafter continues from its own function."""
import torch

from dmtp.injection.base import Injection, TokenHiddenFusion
from dmtp.injection.catalogue import register_variant


@register_variant(name="dual_anchor_zero_init",
                  slots="[E(A), E(T1)+D, MASK x6]",
                  injected="D = W[...], W = 0 at init (**main method**)",
                  label="[A, E(T1)+D, MASK x6]")
class DualAnchorZeroInit(Injection):
    first_slot_offset = 0

    def __init__(self, hidden_size, num_target_features, mask_token_id, block_size):
        super().__init__(hidden_size, num_target_features, mask_token_id, block_size)
        self.fusion = TokenHiddenFusion(hidden_size, zero_init=True)

    def build_slots(self, embed, anchor, t1, h_mtp):
        rest = self.t1_and_masks(embed, t1)
        t1_slot = rest[:, 0] + self.fusion(rest[:, 0], h_mtp).to(rest.dtype)
        return torch.cat([embed(anchor[:, None]), t1_slot[:, None], rest[:, 1:]], dim=1)
