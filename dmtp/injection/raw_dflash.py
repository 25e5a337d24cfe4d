"""Raw DFlash (external baseline): slots [A, MASK x (B-1)] (B = 8: [A, MASK x7]); the MTP is unused."""
import torch

from dmtp.injection.base import Injection
from dmtp.injection.catalogue import register_variant


@register_variant(name="raw_dflash", slots="[A, MASK x7]", injected="nothing (baseline; MTP unused)")
class RawDFlash(Injection):
    uses_mtp = False
    first_slot_offset = 0

    def build_slots(self, embed, anchor, t1=None, h_mtp=None):
        ids = torch.cat([anchor[:, None], self.mask_ids(anchor.shape[0], self.num_candidates, anchor.device)], dim=1)
        return embed(ids)
