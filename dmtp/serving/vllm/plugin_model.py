"""The DMTP drafter as a vLLM model: vLLM's DFlash drafter (`DFlashQwen3ForCausalLM`) plus what DMTP
adds to it, both loaded and run by dmtp's own modules (one rule in one place):

* the injection module (`dmtp_injection.*` in the export's model.safetensors), built from the
  export's "dmtp" section by dmtp's catalogue and loaded strictly;
* the target's native MTP layer, loaded strictly by dmtp's MTP loader from the target's
  checkpoint, or from the drafter's own `mtp.safetensors` when it was trained with it. It shares
  the target's embedding and head (resolved at call time: vLLM hands the target's modules to the
  drafter after loading);
* the drafter's MTP correction when it has one (`dmtp_mtp_correction.*`, `mtp_correction_rank` in the "dmtp"
  section; dmtp.models.mtp_correction): `dmtp_mtp` is then the MTP as the drafter proposes with it, its T1
  logits through the correction, exactly as in dmtp's own loop.

Registered under the export's architecture name (`DMTPDraftModel`) by `dmtp.serving.vllm.plugin`;
`dmtp.serving.vllm.plugin_proposer` drives it. Imported only inside vLLM processes.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from vllm.config import VllmConfig
from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM

from dmtp.drafters.block_drafter import CORRECTION_PREFIX, INJECTION_PREFIX, tuned_mtp_path
from dmtp.injection.base import Injection
from dmtp.injection.catalogue import make_injection
from dmtp.drafters.checkpoint import read_drafter_config
from dmtp.drafters.dflash import DFlashConfig
from dmtp.models.mtp import NativeMTP
from dmtp.models.mtp_correction import MTPCorrection, ProposingMTP, require_correction_rank
from dmtp.families.mtp_loading import load_native_mtp


def serving_layout_problem(injection: Injection, config: DFlashConfig, num_speculative_tokens: int) -> str | None:
    """Why vLLM's DFlash block cannot host this variant (None: it can). vLLM drafts one block of
    1 + num_speculative_tokens query slots at positions a..a+K, slot 0 = the anchor A, from context
    K/V of the tapped layers only; the MTP gives T1 from one hidden per round."""
    if num_speculative_tokens != config.block_size - 1:
        return (f"num_speculative_tokens must be {config.block_size - 1} for this DMTP drafter (its block_size "
                f"{config.block_size} minus the anchor; got {num_speculative_tokens})")
    if injection.first_slot_offset != 0 or injection.num_slots != 1 + num_speculative_tokens:
        return "its block does not start at the anchor (vLLM's block is [A, c1..cK])"
    if injection.needs_mtp_context:
        return "it reads the MTP's hidden as context (vLLM's context is the tapped target layers only)"
    if injection.mtp_steps != 1 or not injection.uses_mtp:
        return "it does not take exactly one MTP token per block"
    if config.input_embedding_scale != 1.0:
        return "it scales its input embeddings (vLLM's DFlash path does not)"
    return None


class _LateBound:
    """A module of the target's (embedding or head) as the MTP calls it, resolved at each call."""

    def __init__(self, call, weight):
        self._call, self._weight = call, weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._call(x)

    @property
    def weight(self) -> torch.Tensor:
        return self._weight()


class DMTPDraftModelForVLLM(DFlashQwen3ForCausalLM):
    """vLLM's DFlash drafter with dmtp's injection (`dmtp_injection`) and the native MTP (`dmtp_mtp`)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        spec = vllm_config.speculative_config
        self.drafter_dir = spec.draft_model_config.model
        self.target_dir = vllm_config.model_config.model
        raw = read_drafter_config(self.drafter_dir)
        config = DFlashConfig.from_hf_config(raw)
        meta = raw.get("dmtp") or {}
        name = meta.get("injection")
        if not name:
            raise ValueError(f"drafter {self.drafter_dir} is named DMTPDraftModel but its config.json has no "
                             "'dmtp.injection' (not a dmtp export)")
        self.dmtp_injection = make_injection(name, config.hidden_size, len(config.target_layer_ids),
                                             config.mask_token_id, config.block_size,
                                             **meta.get("injection_kwargs", {}))
        problem = serving_layout_problem(self.dmtp_injection, config, spec.num_speculative_tokens)
        if problem:
            raise ValueError(f"DMTP drafter {self.drafter_dir} ({name}) cannot be served by vLLM: {problem}")
        self.dmtp_mtp: NativeMTP | ProposingMTP | None = None
        rank = require_correction_rank(meta.get("mtp_correction_rank", 0))
        self.dmtp_mtp_correction = MTPCorrection(config.hidden_size, rank) if rank else None
        self.dmtp_correction_greedy_only = meta.get("mtp_correction_greedy_only") is True

    # The target's embedding and head, looked up when called: vLLM replaces the drafter's own
    # embed_tokens / lm_head with the target's after loading (the export ships neither).
    def target_embed(self) -> _LateBound:
        return _LateBound(lambda ids: self.model.embed_tokens(ids), lambda: self.model.embed_tokens.weight)

    def target_head(self) -> _LateBound:
        return _LateBound(lambda hidden: F.linear(hidden, self.lm_head.weight), lambda: self.lm_head.weight)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]):
        injection, correction, rest = {}, {}, []
        for name, tensor in weights:
            if name.startswith(INJECTION_PREFIX):
                injection[name[len(INJECTION_PREFIX):]] = tensor
            elif name.startswith(CORRECTION_PREFIX) and self.dmtp_mtp_correction is not None:
                correction[name[len(CORRECTION_PREFIX):]] = tensor
            else:
                rest.append((name, tensor))
        self.dmtp_injection.load_state_dict(injection, strict=True)
        super().load_weights(rest)
        p = self.lm_head.weight
        self.dmtp_injection.to(device=p.device, dtype=p.dtype)
        mtp = load_native_mtp(self.target_dir, self.target_embed(), self.target_head(), dtype=p.dtype,
                              device=p.device, tuned=tuned_mtp_path(self.drafter_dir)).eval()
        if self.dmtp_mtp_correction is not None:
            self.dmtp_mtp_correction.load_state_dict(correction, strict=True)
            self.dmtp_mtp_correction.greedy_only = self.dmtp_correction_greedy_only
            self.dmtp_mtp_correction.to(device=p.device, dtype=p.dtype)
            mtp = ProposingMTP(mtp, self.dmtp_mtp_correction)
        self.dmtp_mtp = mtp

    def build_block(self, anchor: torch.Tensor, t1: torch.Tensor, h_mtp: torch.Tensor) -> torch.Tensor:
        """The block's slot embeddings [N, 1 + K, H] from the anchor [N], T1 [N] and the MTP hidden that
        predicted T1 [N, H], by the injection (the mask slots embedded as vLLM's DFlash path does)."""
        ones = torch.ones_like(t1)
        return self.dmtp_injection.build_block(self.model.embed_input_ids, anchor, t1[:, None], h_mtp[:, None], ones)


__all__ = ["DMTPDraftModelForVLLM", "serving_layout_problem"]
