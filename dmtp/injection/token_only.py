"""Token-only single anchor: slots [T1, MASK x6]; T1 from the MTP, no MTP hidden."""
from dmtp.injection.base import Injection
from dmtp.injection.catalogue import register_variant


@register_variant(name="token_only", slots="[T1, MASK x6]", injected="T1 only")
class TokenOnly(Injection):
    def build_slots(self, embed, anchor, t1, h_mtp=None):
        return self.t1_and_masks(embed, t1)
