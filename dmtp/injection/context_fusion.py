"""Context fusion: context = [tapped target layers ; per-position MTP hidden], projected (n+1)H -> H
by the drafter's own fc.

Slots [T1, MASK x6]."""
import torch

from dmtp.injection.base import Injection
from dmtp.injection.catalogue import register_variant


@register_variant(name="context_fusion",
                  slots="[T1, MASK x6]",
                  injected="context = [target layers; per-position MTP hidden]",
                  label="ctx [target; MTP] 6H->H")
class ContextFusion(Injection):
    needs_mtp_context = True

    @property
    def context_dim(self) -> int:
        return (self.num_target_features + 1) * self.hidden_size

    def context_features(self, target_features, mtp_hidden):
        return torch.cat([target_features, mtp_hidden.to(target_features.dtype)], dim=-1)

    def build_slots(self, embed, anchor, t1, h_mtp=None):
        return self.t1_and_masks(embed, t1)
