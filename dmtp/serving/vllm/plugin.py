"""dmtp's vLLM plug-in (entry point `vllm.general_plugins: dmtp`, run in every vLLM process).

It registers the DMTP drafter architectures (`DMTPDraftModel`, and `DMTPDSparkDraftModel` on DSpark's heads;
see `plugin_model`) and makes
vLLM's model runner get a `DMTPProposer` (see `vllm_plugin_proposer`) where it builds a
`DFlashProposer`, only when the configured drafter is a DMTP one. The runner constructs
`DFlashProposer` by name and checks `isinstance(drafter, DFlashProposer)` elsewhere, so the class
keeps its name and identity: its constructor picks the subclass (`__new__`), nothing else changes
and raw DFlash drafters are served exactly as before. Serve with `"method": "dflash"` and the DMTP
export as the drafter (README, Serving with vLLM).

DFlash2 drafters get a `DFlash2Proposer` (see `vllm_dflash2_proposer`) the same way: vLLM's V1 runner
would draft them as DFlash v1 and so refuses them; the plug-in walks their candidate selector there
and lets vLLM's check admit them (LiLiCorr's candidate heads stay refused).

Exports it does not serve (a DMTP variant on DFlash2's selector, `DMTPDFlash2DraftModel`) are registered
to a model that stops with the reason and what serves them (`refused`).

On vLLM's CPU build it also corrects two of vLLM's CPU stand-ins (`vllm_cpu_fixes`): the rejection
sampler's per-request temperature / top_p expansion (sampled speculative decoding read uninitialised
memory) and DFlash's per-layer context K norm (a multi-layer drafter's layers 2..L used layer 1's).
"""
from __future__ import annotations

DMTP_MODEL = "dmtp.serving.vllm.plugin_model:DMTPDraftModelForVLLM"
REFUSED_MODEL = "dmtp.serving.vllm.refused:RefusedDraftModel"


def _choose_proposer(cls, vllm_config, *args, **kwargs):
    from vllm.v1.spec_decode.dflash import DFlashProposer

    from dmtp.serving.vllm.dflash2_proposer import DFlash2Proposer, is_candidate_head_drafter
    from dmtp.serving.vllm.plugin_proposer import DMTPProposer, is_dmtp_drafter

    if cls is DFlashProposer and is_dmtp_drafter(vllm_config):
        cls = DMTPProposer
    elif cls is DFlashProposer and is_candidate_head_drafter(vllm_config):
        cls = DFlash2Proposer
    return object.__new__(cls)


def _admit_served_candidate_heads(original):
    """vLLM's V1 runner refuses candidate-head DFlash drafts (it would degrade them to DFlash v1);
    dmtp's DFlash2Proposer walks DFlash2's selector there, so only the others stay refused."""
    def is_candidate_draft_v1_refuses(self) -> bool:
        from dmtp.serving.vllm.dflash2_proposer import is_candidate_head_drafter

        return original(self) and not is_candidate_head_drafter(self)

    is_candidate_draft_v1_refuses.dmtp_original = original
    return is_candidate_draft_v1_refuses


def register() -> None:
    from vllm import ModelRegistry
    from vllm.config import VllmConfig
    from vllm.v1.spec_decode.dflash import DFlashProposer

    from dmtp.serving.vllm import cpu_fixes as vllm_cpu_fixes
    from dmtp.serving.vllm.plugin_proposer import DMTP_ARCHITECTURES, SERVED_ARCHITECTURES
    from dmtp.serving.vllm.refused import REGISTERED_NAMES

    vllm_cpu_fixes.install()

    # The export's own name (checked when the speculative config is read) and vLLM's DFlash-renamed
    # one (the class it builds).
    for name in (*DMTP_ARCHITECTURES, *SERVED_ARCHITECTURES):
        if name not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(name, DMTP_MODEL)
    # Exports the plug-in does not serve (yet): built as a model that stops with the reason (vllm_refused).
    for name in REGISTERED_NAMES:
        if name not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(name, REFUSED_MODEL)
    check = VllmConfig._is_dflash_candidate_draft
    if not hasattr(check, "dmtp_original"):
        VllmConfig._is_dflash_candidate_draft = _admit_served_candidate_heads(check)
    current = DFlashProposer.__dict__.get("__new__")
    if getattr(current, "__func__", None) is not _choose_proposer:
        DFlashProposer.__new__ = staticmethod(_choose_proposer)


__all__ = ["register"]
