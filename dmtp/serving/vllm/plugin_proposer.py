"""DMTP's round inside vLLM: a `DFlashProposer` whose block carries the native MTP's tokens.

Per round (vLLM 0.32, V1 runner; ../../docs/vllm-plugin.md has the hook points):
1. One more tap: the target's last layer output (vLLM taps are pre-final-norm), normalised here by
   the target's own final norm, gives the post-norm hidden h_t the MTP reads.
2. The MTP catches up causally, with its own KV cache (a slot per request, `mtp_slots`): row p+1
   consumes (x_{p+1}, h_p) for every verified position p of this step (x at the last one is the new
   anchor A); the row at A's position gives the hidden that predicts T1 (dmtp's row convention,
   `dmtp.models.mtp`). All requests of a step in one forward; a long prompt chunk in its own.
   With prefix caching on, a request whose prefix vLLM serves from its cache gets its MTP rows rebuilt
   from the target's hidden states of those blocks, kept by `mtp_prefix` (the cache skips the target there).
3. The MTP's chain: T1, then, for the multi-step variants, T2..TS from scratch rows after the anchor
   (`dmtp.models.mtp_chain.chain_mtp`, the rule dmtp's loop runs), and m per request (`choose_num_mtp`).
4. vLLM's DFlash forward runs on the injection's slots ([E(A), E(T1)+D, ..., MASK...] instead of
   [E(A), MASK...], `build_model_inputs_first_pass`); the candidates are the MTP's T1..Tm, then the drafter's
   (`_sample_draft_tokens`: per slot, or DSpark's Markov walk from the MTP's last token). When the chain fills
   the block (m = K), no drafter forward runs: the round is the MTP's chain alone, as in dmtp's loop.
5. The target verifies through vLLM's normal path (greedy, or its rejection sampler with each candidate's
   proposal distribution: sampled from q, or its argmax with q one-hot, by the drafter's draft rule).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from vllm.v1.spec_decode.dflash import DFlashProposer

from dmtp.drafters.block_drafter import MTPBlockInputs
from dmtp.models.mtp_chain import chain_mtp
from dmtp.serving.vllm.mtp_prefix import PrefixHiddenStore
from dmtp.serving.vllm.mtp_slots import MTPRows, MTPSlots

DMTP_ARCHITECTURES = ("DMTPDraftModel", "DMTPDSparkDraftModel")
# vLLM's speculative config renames a dflash drafter's architecture `X` to `DFlashX`
# (transformers_utils/configs/eagle.py): the names the registry is asked for.
SERVED_ARCHITECTURES = tuple("DFlash" + name for name in DMTP_ARCHITECTURES)
# Blocks the prefix store keeps when vLLM has not sized its own KV cache yet (it always has by the first round).
DEFAULT_PREFIX_BLOCKS = 1 << 14


def is_dmtp_drafter(vllm_config) -> bool:
    spec = getattr(vllm_config, "speculative_config", None)
    draft = getattr(spec, "draft_model_config", None)
    names = getattr(getattr(draft, "hf_config", None), "architectures", None) or []
    return any(name in SERVED_ARCHITECTURES for name in names)


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
        self.cache_config = vllm_config.cache_config
        self.prefix_store: PrefixHiddenStore | None = None
        self.mtp_slots: MTPSlots | None = None
        self.block: MTPBlockInputs | None = None

    def load_model(self, target_model) -> None:
        super().load_model(target_model)
        inner = getattr(target_model, "language_model", target_model)
        self.target_norm = inner.model.norm
        self.injection = self.model.dmtp_injection
        self.mtp_slots = MTPSlots(self.model.dmtp_mtp, self.max_model_len, 1 + self.num_speculative_tokens)

    # -- the MTP's rows -----------------------------------------------------------------------------
    def _mtp_hidden(self, tokens, positions, final_hidden, next_token_ids, cad, num_rejected):
        """(h [B, H], anchor positions [B], request ids [B]): per request, the MTP rows after this step's
        verified positions; the last one's output (at the new anchor's position) predicts T1."""
        starts = cad.query_start_loc_cpu.tolist()
        batch = cad.batch_size()
        rejected = num_rejected.tolist() if num_rejected is not None else [0] * batch
        first = positions[torch.tensor(starts[:batch], device=positions.device)].tolist()   # one device sync
        req_ids = self.runner.input_batch.req_ids[:batch]
        store = self._prefix_store()
        step_tokens = tokens.tolist() if store is not None else None
        rows, anchors = [], []
        for r in range(batch):
            s, e = starts[r], starts[r + 1] - int(rejected[r])
            anchor = first[r] + e - s
            last = self._next_token(req_ids[r], anchor, next_token_ids[r])
            row = MTPRows(req_ids[r], torch.cat([tokens[s + 1:e].long(), last]), final_hidden[s:e], first[r] + 1)
            if store is not None:
                row = self._with_cached_prefix(store, row, first[r])
                store.record(req_ids[r], first[r], step_tokens[s:e], final_hidden[s:e])
            rows.append(row)
            anchors.append(anchor)
        self.mtp_slots.forget_all_but(self.runner.requests)
        if store is not None:
            store.forget_all_but(self.runner.requests)
        return self.mtp_slots.catch_up(rows), anchors, req_ids

    def _prefix_store(self) -> PrefixHiddenStore | None:
        if self.prefix_store is None and self.cache_config.enable_prefix_caching:
            self.prefix_store = PrefixHiddenStore(self.cache_config.block_size,
                                                  self.cache_config.num_gpu_blocks or DEFAULT_PREFIX_BLOCKS)
        return self.prefix_store

    def _with_cached_prefix(self, store: PrefixHiddenStore, row: MTPRows, first: int) -> MTPRows:
        """The step's rows, preceded by rows 1..first when the request starts past rows it has (vLLM served
        positions < first from its prefix cache): rebuilt from the target's hidden states there, kept by the store."""
        if first == 0 or self.mtp_slots.rows_before(row.req_id) >= first:
            return row
        state = self.runner.requests[row.req_id]
        prefix = [state.get_token_id(p) for p in range(first + 1)]   # x_0..x_first (x_first: this step's first)
        cached = store.lookup(row.req_id, prefix[:first])
        if cached is None:
            return row
        earlier = torch.tensor(prefix[1:first + 1], dtype=torch.long, device=row.tokens.device)
        return MTPRows(row.req_id, torch.cat([earlier, row.tokens]),
                       torch.cat([cached.to(row.hidden.dtype), row.hidden]), 1)

    def _next_token(self, req_id: str, position: int, sampled: torch.Tensor) -> torch.Tensor:
        """[1]: the token at `position`, after this step's last verified one: the anchor vLLM sampled,
        or, mid-prompt (chunked prefill), the prompt's next token (vLLM's padded batch passes the
        prompt's last token there, a placeholder for a draft it discards, but this MTP row stays)."""
        state = self.runner.requests[req_id]
        if position < state.num_prompt_tokens:
            return torch.tensor([state.get_token_id(position)], dtype=torch.long, device=sampled.device)
        return sampled.view(1).long()

    # -- drafting -------------------------------------------------------------------------------------
    def _picker(self, sampling_metadata, source: str):
        """`pick(scores [..., V])` -> (tokens [...], q [..., V] or None) for slots of `source` ("mtp" or "block"):
        the argmax when vLLM drafts greedily (its default) or the batch is greedy; else by the drafter's draft rule,
        sampled by vLLM's own draft sampler (its temperature per request) or the argmax with q one-hot."""
        sampled = self._enable_probabilistic_draft_probs and not sampling_metadata.all_greedy
        argmax = not sampled or self.model.dmtp_draft_rule[source] == "argmax"

        def pick(scores: torch.Tensor):
            flat = scores.reshape(-1, scores.shape[-1])
            if argmax:
                token = flat.argmax(-1)
                q = F.one_hot(token, flat.shape[-1]).float() if sampled else None
            else:   # vLLM's sampler divides the logits in place: they may be kept (the chain's, for m)
                token, q = self._sample_from_logits(flat.clone(), sampling_metadata)
            return token.view(scores.shape[:-1]), None if q is None else q.view(scores.shape)

        return pick

    def _proposing_mtp(self, sampling_metadata):
        mtp = self.model.dmtp_mtp
        sampled = self._enable_probabilistic_draft_probs and not sampling_metadata.all_greedy
        if sampled and getattr(getattr(mtp, "correction", None), "greedy_only", False):
            mtp = mtp.native   # a correction trained on greedy tokens serves greedy batches only, as in dmtp's loop
        return mtp

    def _mtp_block(self, h1: torch.Tensor, anchors: list[int], req_ids, sampling_metadata) -> MTPBlockInputs:
        """The MTP's tokens of this round (T1..TS, chained in scratch rows after each anchor), the hiddens that
        predicted them, their q when sampled, and m per request."""
        inj, steps = self.injection, self.injection.mtp_steps
        if steps > 1:   # the chained rows' slots and positions, once per round
            slots, positions = self.mtp_slots.slots_of(req_ids), torch.tensor(anchors, device=h1.device)
            span = max(anchors) + steps

        def step(j, token, h):
            return self.mtp_slots.chain_step(slots, token, h, positions + j, span)

        chain = chain_mtp(self._proposing_mtp(sampling_metadata), h1, steps, step,
                          pick=self._picker(sampling_metadata, "mtp"), keep_logits=steps > 1)
        num = inj.choose_num_mtp(chain.logits) if steps > 1 else torch.ones_like(chain.tokens[:, 0])
        return MTPBlockInputs(chain.tokens, chain.hidden, num, chain.q)

    def propose(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                next_token_ids, token_indices_to_sample, common_attn_metadata, sampling_metadata,
                mm_embed_inputs=None, num_rejected_tokens_gpu=None, slot_mappings=None) -> torch.Tensor:
        taps = target_hidden_states[:, :-self.target_hidden_size]
        final_hidden = self.target_norm(target_hidden_states[:, -self.target_hidden_size:].contiguous())
        h1, anchors, req_ids = self._mtp_hidden(target_token_ids, target_positions, final_hidden, next_token_ids,
                                                common_attn_metadata, num_rejected_tokens_gpu)
        self.block = self._mtp_block(h1, anchors, req_ids, sampling_metadata)
        if self.injection.mtp_fills_block and num_speculative_tokens == self.injection.num_candidates:
            # every candidate is the MTP's: a drafter forward would propose nothing that is verified
            self.num_speculative_tokens, self._last_draft_probs = num_speculative_tokens, self.block.q
            return self.block.tokens
        try:
            return super().propose(num_speculative_tokens, target_token_ids, target_positions, taps.contiguous(),
                                   next_token_ids, token_indices_to_sample, common_attn_metadata, sampling_metadata,
                                   mm_embed_inputs, num_rejected_tokens_gpu, slot_mappings)
        finally:
            self.block = None

    def build_model_inputs_first_pass(self, num_tokens: int, num_input_tokens: int,
                                      mm_embed_inputs) -> tuple[dict[str, Any], int]:
        kwargs, size = super().build_model_inputs_first_pass(num_tokens, num_input_tokens, mm_embed_inputs)
        b = self.block
        width = 1 + self.num_speculative_tokens
        ids = kwargs["input_ids"]
        embeds = self.model.embed_input_ids(ids)
        n = b.tokens.shape[0] * width
        slots = self.model.build_block(ids[:n].view(-1, width)[:, 0].long(), b.tokens, b.hidden, b.num)
        embeds[:n] = slots.reshape(n, -1).to(embeds.dtype)
        kwargs["inputs_embeds"] = embeds
        return kwargs, size

    def _sample_draft_tokens(self, hidden_states: torch.Tensor, sampling_metadata):
        """hidden_states [B * K, H] of the block's slots 1..K, request-major -> the K candidates [B * K] (the
        MTP's T1..Tm, then the drafter's) and their proposal distributions [B * K, V] when drafts are sampled."""
        b, inj = self.block, self.injection
        hidden = hidden_states.view(b.tokens.shape[0], self.num_speculative_tokens, -1)
        drafted, q = self.model.draft_candidates(hidden[:, inj.first_predicted_slot - 1:], b.tokens, b.num,
                                                 self._picker(sampling_metadata, "block"))
        tokens = inj.merge_candidates(b.tokens, drafted, b.num)
        if q is None:
            return tokens.reshape(-1), None
        return tokens.reshape(-1), inj.merge_candidates(b.q, q, b.num).flatten(0, 1)


__all__ = ["DMTP_ARCHITECTURES", "SERVED_ARCHITECTURES", "DMTPProposer", "is_dmtp_drafter"]
