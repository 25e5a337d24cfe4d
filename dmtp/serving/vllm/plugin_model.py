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
  logits through the correction, exactly as in dmtp's own loop;
* DSpark's heads when the backbone is DSpark (`DMTPDSparkDraftModel`: `markov_head.*`, `confidence_head.*`),
  dmtp's own modules: the block's candidates are then drafted slot by slot with the Markov bias of the token
  before each (`dmtp.drafters.dspark.markov_walk`), from T1 (or through the MTP's tokens of a chain).

`draft_candidates` is the drafter's half of a round as dmtp's `BlockDrafter.draft_block` proposes it.

Registered under the exports' architecture names (`DMTPDraftModel`, `DMTPDSparkDraftModel`) by
`dmtp.serving.vllm.plugin`;
`dmtp.serving.vllm.plugin_proposer` drives it. Imported only inside vLLM processes.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from vllm.config import VllmConfig
from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM

from dmtp.decode.sampling import SamplingConfig, draft_rules
from dmtp.drafters.block_drafter import CORRECTION_PREFIX, INJECTION_PREFIX, tuned_mtp_path
from dmtp.drafters.checkpoint import read_drafter_config
from dmtp.drafters.dflash import DFlashConfig
from dmtp.drafters.dspark import ConfidenceHead, DSparkConfig, MarkovHead, markov_walk
from dmtp.drafters.registry import architecture_of_names
from dmtp.injection.base import Injection
from dmtp.injection.catalogue import make_injection
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
    if not injection.uses_mtp:
        return "it takes no MTP token (a raw DFlash export is served by vLLM's own dflash method)"
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
        config = architecture_of_names(raw.get("architectures") or []).config.from_hf_config(raw)
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
            raise ValueError(f"DMTP drafter {self.drafter_dir} ({name}) cannot be served by vLLM: {problem}; "
                             "decode it with python -m dmtp.infer (dmtp's own loop runs every variant)")
        self.dmtp_mtp: NativeMTP | ProposingMTP | None = None
        rank = require_correction_rank(meta.get("mtp_correction_rank", 0))
        self.dmtp_mtp_correction = MTPCorrection(config.hidden_size, rank) if rank else None
        self.dmtp_correction_greedy_only = meta.get("mtp_correction_greedy_only") is True
        self.dmtp_markov, self.dmtp_confidence = _dspark_heads(config)
        # The draft rule per slot source when vLLM samples drafts (draft_sample_method "probabilistic"):
        # `"draft_rule": {"mtp": "sample" | "argmax", "block": ...}` in the "dmtp" section, as dmtp.infer's option.
        rules = SamplingConfig(**draft_rules(meta.get("draft_rule")))   # checked as dmtp.infer checks it
        self.dmtp_draft_rule = {"mtp": rules.mtp_draft, "block": rules.block_draft}

    # The target's embedding and head, looked up when called: vLLM replaces the drafter's own
    # embed_tokens / lm_head with the target's after loading (the export ships neither).
    def target_embed(self) -> _LateBound:
        return _LateBound(lambda ids: self.model.embed_tokens(ids), lambda: self.model.embed_tokens.weight)

    def target_head(self) -> _LateBound:
        return _LateBound(lambda hidden: F.linear(hidden, self.lm_head.weight), lambda: self.lm_head.weight)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]):
        own = {INJECTION_PREFIX: self.dmtp_injection, CORRECTION_PREFIX: self.dmtp_mtp_correction,
               "markov_head.": self.dmtp_markov, "confidence_head.": self.dmtp_confidence}
        own = {prefix: module for prefix, module in own.items() if module is not None}
        states, rest = {prefix: {} for prefix in own}, []
        for name, tensor in weights:
            prefix = next((p for p in own if name.startswith(p)), None)
            if prefix is None:
                rest.append((name, tensor))
            else:
                states[prefix][name[len(prefix):]] = tensor
        super().load_weights(rest)
        p = self.lm_head.weight
        for prefix, module in own.items():
            module.load_state_dict(states[prefix], strict=True)
            module.to(device=p.device, dtype=p.dtype)
        mtp = load_native_mtp(self.target_dir, self.target_embed(), self.target_head(), dtype=p.dtype,
                              device=p.device, tuned=tuned_mtp_path(self.drafter_dir)).eval()
        if self.dmtp_mtp_correction is not None:
            self.dmtp_mtp_correction.greedy_only = self.dmtp_correction_greedy_only
            mtp = ProposingMTP(mtp, self.dmtp_mtp_correction)
        self.dmtp_mtp = mtp

    def build_block(self, anchor: torch.Tensor, mtp_tokens: torch.Tensor, mtp_hidden: torch.Tensor,
                    num_mtp: torch.Tensor) -> torch.Tensor:
        """The block's slot embeddings [N, 1 + K, H] from the anchor [N], the MTP's tokens T1..TS [N, S], the
        hiddens that predicted them [N, S, H] and m [N], by the injection (the mask slots embedded as vLLM's
        DFlash path does)."""
        return self.dmtp_injection.build_block(self.model.embed_input_ids, anchor, mtp_tokens, mtp_hidden, num_mtp)

    def draft_candidates(self, hidden: torch.Tensor, mtp_tokens: torch.Tensor, num_mtp: torch.Tensor, pick):
        """The drafter's candidates from its predicted slots' hidden [N, n, H] (`pick(scores)` -> (token, q or
        None)): independent per slot, or DSpark's Markov walk from the token before the first predicted slot
        through the MTP's tokens the block holds. -> (tokens [N, n], q [N, n, V] or None)."""
        base = self.compute_logits(hidden.flatten(0, 1)).view(*hidden.shape[:2], -1)
        if self.dmtp_markov is None:
            return pick(base)
        inj = self.dmtp_injection
        return markov_walk(self.dmtp_markov, base, hidden, inj.previous_token(None, mtp_tokens), pick,
                           inj.forced_drafter_slots(mtp_tokens, num_mtp))


def _dspark_heads(config: DFlashConfig) -> tuple[MarkovHead | None, ConfidenceHead | None]:
    """DSpark's Markov and confidence heads (dmtp's modules), None for a DFlash backbone.

    The confidence head is loaded so the export loads strictly; vLLM's V1 runner verifies whole blocks, so nothing
    reads it there."""
    if not isinstance(config, DSparkConfig):
        return None, None
    c = config
    markov = MarkovHead(c.vocab_size, c.markov_rank, c.hidden_size, c.markov_head_type)
    if not c.enable_confidence_head:
        return markov, None
    return markov, ConfidenceHead(c.hidden_size + (c.markov_rank if c.confidence_head_with_markov else 0))


__all__ = ["DMTPDraftModelForVLLM", "serving_layout_problem"]
