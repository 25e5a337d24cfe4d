"""Hidden residual on T1: slots [E(T1) + r, MASK x6], r = LowRankMLP(h_mtp)."""
from dmtp.injection.base import Injection, LowRankResidual


class HiddenResidualT1(Injection):
    def __init__(self, hidden_size, num_target_features, mask_token_id, rank: int = 64):
        super().__init__(hidden_size, num_target_features, mask_token_id)
        self.residual = LowRankResidual(hidden_size, rank)
        self.init_kwargs = {"rank": rank}

    def build_slots(self, embed, anchor, t1, h_mtp):
        slots = self.t1_and_masks(embed, t1)
        r = self.residual(h_mtp).to(slots.dtype)
        return slots + r[:, None] * slots.new_tensor([1.0] + [0.0] * (slots.shape[1] - 1))[None, :, None]
