"""Drafter exports dmtp's vLLM plug-in refuses by their architecture name, with the reason, when vLLM builds
them (else vLLM would stop deep inside with "architecture not supported", or, for a name it half-knows,
run the drafter as something it is not).

No vLLM import: the refusal is testable without vLLM.

`DMTPDFlash2DraftModel` (a DMTP variant on DFlash2's backbone, `drafter=dflash2`): its candidate selector walks
from the MTP's T1 through a block whose first candidate is the MTP's, which neither vLLM's DFlash2 speculator
(V2 runner, from the anchor) nor the plug-in's DFlash2 walk (raw DFlash2 exports) does; dmtp's loop serves it.
"""
from __future__ import annotations

from torch import nn

REFUSED = {
    "DMTPDFlash2DraftModel": (
        "a DMTP drafter on DFlash2's candidate selector is not served by vLLM: the selector would walk from the "
        "anchor, not from the MTP's T1; decode it with python -m dmtp.infer (a raw DFlash2 export, "
        "injection=raw_dflash, and DMTP on DFlash or DSpark backbones are served by the plug-in)"),
}
# vLLM's speculative config renames a `dflash` drafter's architecture X to DFlashX (see plugin_proposer).
REGISTERED_NAMES = {alias: name for name in REFUSED for alias in (name, "DFlash" + name)}


def refusal(architectures) -> str | None:
    """The reason a drafter with these config.json `architectures` is refused (None: not refused here)."""
    for name in architectures or []:
        if name in REGISTERED_NAMES:
            return REFUSED[REGISTERED_NAMES[name]]
    return None


class RefusedDraftModel(nn.Module):
    """What vLLM builds for a refused architecture: one ValueError naming the drafter and the reason."""

    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__()
        draft = vllm_config.speculative_config.draft_model_config
        names = getattr(getattr(draft, "hf_config", None), "architectures", None) or getattr(draft, "architectures", [])
        raise ValueError(f"drafter {draft.model}: {refusal(names) or 'refused by dmtp: ' + ', '.join(names)}")


__all__ = ["REFUSED", "REGISTERED_NAMES", "RefusedDraftModel", "refusal"]
