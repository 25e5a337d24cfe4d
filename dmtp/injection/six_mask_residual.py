"""Six-mask residual: slots [T1, MASK + r x6], the same low-rank residual added to the MASK inputs."""
import torch

from dmtp.injection.base import Injection, LowRankResidual
from dmtp.injection.catalogue import register_variant


@register_variant(name="six_mask_residual", slots="[T1, MASK+r x6]",
                  injected="same residual on the six MASKs")
class SixMaskResidual(Injection):
    def __init__(self, hidden_size, num_target_features, mask_token_id, block_size, rank: int = 64):
        super().__init__(hidden_size, num_target_features, mask_token_id, block_size)
        self.residual = LowRankResidual(hidden_size, rank)

    def build_slots(self, embed, anchor, t1, h_mtp):
        slots = self.t1_and_masks(embed, t1)
        r = self.residual(h_mtp).to(slots.dtype)
        return torch.cat([slots[:, :1], slots[:, 1:] + r[:, None]], dim=1)
