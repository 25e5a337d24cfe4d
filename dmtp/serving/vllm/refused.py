"""Drafter exports dmtp's vLLM plug-in refuses by their architecture name, with the reason, when vLLM builds
them (else vLLM would stop deep inside with "architecture not supported", or, for a name it half-knows,
run the drafter as something it is not).

No vLLM import: the refusal is testable without vLLM.

`DMTPDSparkDraftModel` (a DMTP variant on DSpark's heads, `drafter=dspark`): vLLM's `dspark` speculator
starts the Markov chain at the anchor and has no slot for the MTP's T1, and dmtp's own DMTP proposer
drafts the block without DSpark's sequential Markov head, so neither would propose what the drafter
was trained to; it is refused until a proposer serves it. A raw DSpark export (`Qwen3DSparkModel`,
vanilla Markov head) is vLLM's own layout and is served by vLLM itself (`"method": "dspark"`).
"""
from __future__ import annotations

from torch import nn

REFUSED = {
    "DMTPDSparkDraftModel": (
        "a DMTP drafter with DSpark's heads is not served by vLLM yet: vLLM's dspark speculator has no slot for "
        "the MTP's T1 and dmtp's plug-in does not run DSpark's sequential Markov head; decode it with "
        "python -m dmtp.infer (a raw DSpark export, injection=raw_dflash, is served by vLLM's own dspark method)"),
}
# vLLM's speculative config renames a `dflash` drafter's architecture X to DFlashX (see vllm_plugin_proposer).
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
