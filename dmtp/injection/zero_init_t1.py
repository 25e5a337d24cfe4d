"""Single-anchor zero-init: slots [E(T1) + D, MASK x6], D as in the main method (W = 0 at initialisation).

The fourth cell of the seed's two updates (zero-init residual vs direct fusion, dual vs single anchor): the main
method without A's slot, so the continuation study compares each update alone (docs/results.md §12)."""
import torch

from dmtp.injection.base import Injection, TokenHiddenFusion
from dmtp.injection.catalogue import register_variant


@register_variant(name="zero_init_t1",
                  slots="[E(T1)+D, MASK x6]",
                  injected="D = W[...], W = 0 at init; single anchor",
                  label="[E(T1)+D, MASK x6]")
class ZeroInitT1(Injection):
    def __init__(self, hidden_size, num_target_features, mask_token_id, block_size):
        super().__init__(hidden_size, num_target_features, mask_token_id, block_size)
        self.fusion = TokenHiddenFusion(hidden_size, zero_init=True)

    def build_slots(self, embed, anchor, t1, h_mtp):
        slots = self.t1_and_masks(embed, t1)
        t1_slot = slots[:, 0] + self.fusion(slots[:, 0], h_mtp).to(slots.dtype)
        return torch.cat([t1_slot[:, None], slots[:, 1:]], dim=1)
