"""MTP context only: the drafter's context is the per-position MTP hidden alone.

Slots [T1, MASK x6]."""
from dmtp.injection.base import Injection
from dmtp.injection.catalogue import register_variant


@register_variant(name="mtp_context_only",
                  slots="[T1, MASK x6]",
                  injected="context = per-position MTP hidden",
                  label="ctx [MTP] H->H")
class MTPContextOnly(Injection):
    needs_mtp_context = True

    @property
    def context_dim(self) -> int:
        return self.hidden_size

    def context_features(self, target_features, mtp_hidden):
        return mtp_hidden.to(target_features.dtype)

    def build_slots(self, embed, anchor, t1, h_mtp=None):
        return self.t1_and_masks(embed, t1)
