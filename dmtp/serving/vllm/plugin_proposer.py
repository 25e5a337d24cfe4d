"""DMTP's round inside vLLM: a `DFlashProposer` whose block carries the native MTP's T1.

Per round (vLLM 0.32, V1 runner; ../../docs/vllm-plugin.md has the hook points):
1. One more tap: the target's last layer output (vLLM taps are pre-final-norm), normalised here by
   the target's own final norm, gives the post-norm hidden h_t the MTP reads.
2. The MTP catches up causally, with its own KV cache (a slot per request, `mtp_slots`): row p+1
   consumes (x_{p+1}, h_p) for every verified position p of this step (x at the last one is the new
   anchor A); the row at A's position gives the hidden that predicts T1 (dmtp's row convention,
   `dmtp.models.mtp`). All requests of a step in one forward; a long prompt chunk in its own.
   That cache lives outside vLLM's block manager, so a prefix-cache hit would skip MTP rows: the
   proposer refuses to start with prefix caching on.
3. vLLM's DFlash forward runs on the injection's slots [E(A), E(T1)+D, MASK...] instead of
   [E(A), MASK...] (`build_model_inputs_first_pass`); candidate 1 is T1 (with the MTP's
   probabilities when vLLM samples drafts), candidates 2..K the drafter's.
4. The target verifies through vLLM's normal path (greedy or its rejection sampler).
"""
from __future__ import annotations

from typing import Any

import torch
from vllm.v1.spec_decode.dflash import DFlashProposer

from dmtp.serving.vllm.mtp_slots import MTPRows, MTPSlots

DMTP_ARCHITECTURE = "DMTPDraftModel"
# vLLM's speculative config renames a dflash drafter's architecture `X` to `DFlashX`
# (transformers_utils/configs/eagle.py): the name the registry is asked for.
SERVED_ARCHITECTURE = "DFlash" + DMTP_ARCHITECTURE


def is_dmtp_drafter(vllm_config) -> bool:
    spec = getattr(vllm_config, "speculative_config", None)
    draft = getattr(spec, "draft_model_config", None)
    return SERVED_ARCHITECTURE in (getattr(getattr(draft, "hf_config", None), "architectures", None) or [])


class DMTPProposer(DFlashProposer):
    def __init__(self, vllm_config, device, runner=None):
        super().__init__(vllm_config, device, runner)
        self.runner = runner
        # The runner asks itself which target layers to tap when it loads the target (after this):
        # this runner also taps the last layer's output (aux id = number of layers), after DFlash's
        # own taps ("output of layer i" -> aux id i + 1). The drafter's fc still reads DFlash's taps
        # only (its width comes from the draft config, left as it is).
        self.target_hidden_size = vllm_config.model_config.get_hidden_size()
        num_layers = vllm_config.model_config.get_total_num_hidden_layers()
        taps = tuple(i + 1 for i in self.dflash_config["target_layer_ids"]) + (num_layers,)
        runner._get_eagle3_aux_layers_from_config = lambda: taps
        if vllm_config.cache_config.enable_prefix_caching:
            raise ValueError("a DMTP drafter keeps its MTP's KV outside vLLM's block manager, so prefix-cache hits "
                             "would skip MTP rows: serve it with prefix caching off (--no-enable-prefix-caching, "
                             "or enable_prefix_caching=False)")
        self.mtp_slots: MTPSlots | None = None
        self.block: tuple[torch.Tensor, torch.Tensor] | None = None

    def load_model(self, target_model) -> None:
        super().load_model(target_model)
        inner = getattr(target_model, "language_model", target_model)
        self.target_norm = inner.model.norm
        self.mtp_slots = MTPSlots(self.model.dmtp_mtp, self.max_model_len, 1 + self.num_speculative_tokens)

    # -- the MTP ----------------------------------------------------------------------------------
    def _mtp_hidden(self, tokens, positions, final_hidden, next_token_ids, cad, num_rejected) -> torch.Tensor:
        """[B, H]: per request, the MTP rows after this step's verified positions; the last one's
        output (at the new anchor's position) predicts T1."""
        starts = cad.query_start_loc_cpu.tolist()
        batch = cad.batch_size()
        rejected = num_rejected.tolist() if num_rejected is not None else [0] * batch
        first = positions[torch.tensor(starts[:batch], device=positions.device)].tolist()   # one device sync
        req_ids = self.runner.input_batch.req_ids
        rows = []
        for r in range(batch):
            s, e = starts[r], starts[r + 1] - int(rejected[r])
            last = self._next_token(req_ids[r], first[r] + e - s, next_token_ids[r])
            rows.append(MTPRows(req_ids[r], torch.cat([tokens[s + 1:e].long(), last]), final_hidden[s:e],
                                first[r] + 1))
        self.mtp_slots.forget_all_but(self.runner.requests)
        return self.mtp_slots.catch_up(rows)

    def _next_token(self, req_id: str, position: int, sampled: torch.Tensor) -> torch.Tensor:
        """[1]: the token at `position`, after this step's last verified one: the anchor vLLM sampled,
        or, mid-prompt (chunked prefill), the prompt's next token (vLLM's padded batch passes the
        prompt's last token there, a placeholder for a draft it discards, but this MTP row stays)."""
        state = self.runner.requests[req_id]
        if position < state.num_prompt_tokens:
            return torch.tensor([state.get_token_id(position)], dtype=torch.long, device=sampled.device)
        return sampled.view(1).long()

    def _propose_t1(self, h_mtp, sampling_metadata) -> tuple[torch.Tensor, torch.Tensor | None]:
        mtp = self.model.dmtp_mtp
        sampled = self._enable_probabilistic_draft_probs and not sampling_metadata.all_greedy
        if sampled and getattr(getattr(mtp, "correction", None), "greedy_only", False):
            mtp = mtp.native   # a correction trained on greedy tokens serves greedy batches only, as in dmtp's loop
        logits = mtp.logits(h_mtp)
        if sampled:
            return self._sample_from_logits(logits, sampling_metadata)
        return logits.argmax(-1), None

    # -- the round --------------------------------------------------------------------------------
    def propose(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                next_token_ids, token_indices_to_sample, common_attn_metadata, sampling_metadata,
                mm_embed_inputs=None, num_rejected_tokens_gpu=None, slot_mappings=None) -> torch.Tensor:
        taps = target_hidden_states[:, :-self.target_hidden_size]
        final_hidden = self.target_norm(target_hidden_states[:, -self.target_hidden_size:].contiguous())
        h_mtp = self._mtp_hidden(target_token_ids, target_positions, final_hidden, next_token_ids,
                                 common_attn_metadata, num_rejected_tokens_gpu)
        t1, t1_probs = self._propose_t1(h_mtp, sampling_metadata)
        self.block = (t1, h_mtp)
        drafts = super().propose(num_speculative_tokens, target_token_ids, target_positions, taps.contiguous(),
                                 next_token_ids, token_indices_to_sample, common_attn_metadata, sampling_metadata,
                                 mm_embed_inputs, num_rejected_tokens_gpu, slot_mappings)
        self.block = None
        if drafts.shape[1] == 0:
            return drafts
        drafts[:, 0] = t1.to(drafts.dtype)
        if self._last_draft_probs is not None:
            self._last_draft_probs[:, 0] = t1_probs.to(self._last_draft_probs.dtype)
        return drafts

    def build_model_inputs_first_pass(self, num_tokens: int, num_input_tokens: int,
                                      mm_embed_inputs) -> tuple[dict[str, Any], int]:
        kwargs, size = super().build_model_inputs_first_pass(num_tokens, num_input_tokens, mm_embed_inputs)
        t1, h_mtp = self.block
        width = 1 + self.num_speculative_tokens
        ids = kwargs["input_ids"]
        embeds = self.model.embed_input_ids(ids)
        n = t1.shape[0] * width
        slots = self.model.build_block(ids[:n].view(-1, width)[:, 0].long(), t1, h_mtp)
        embeds[:n] = slots.reshape(n, -1).to(embeds.dtype)
        kwargs["inputs_embeds"] = embeds
        return kwargs, size


__all__ = ["DMTP_ARCHITECTURE", "SERVED_ARCHITECTURE", "DMTPProposer", "is_dmtp_drafter"]
