"""Hidden residual on T1: slots [E(T1) + r, MASK x6], r = LowRankMLP(h_mtp)."""
import torch

from dmtp.injection.base import Injection, LowRankResidual
from dmtp.injection.catalogue import register_variant


@register_variant(name="hidden_residual_t1", slots="[E(T1)+r, MASK x6]",
                  injected="low-rank residual of h_mtp on T1")
class HiddenResidualT1(Injection):
    def __init__(self, hidden_size, num_target_features, mask_token_id, block_size, rank: int = 64):
        super().__init__(hidden_size, num_target_features, mask_token_id, block_size)
        self.residual = LowRankResidual(hidden_size, rank)

    def build_slots(self, embed, anchor, t1, h_mtp):
        slots = self.t1_and_masks(embed, t1)
        r = self.residual(h_mtp).to(slots.dtype)
        return torch.cat([slots[:, :1] + r[:, None], slots[:, 1:]], dim=1)
