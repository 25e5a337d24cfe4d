"""DFlash2 candidate-head drafts on vLLM's V1 model runner (its CPU build has no other).

vLLM 0.32 walks a DFlash2 drafter's candidate selector only in its V2 speculator (Triton, GPUs:
`v1/worker/gpu/spec_decode/dflash2/speculator.py`). Its V1 runner drafts through `DFlashProposer`,
which takes the argmax of the unary logits and never calls the selector, so vLLM refuses such
drafters there rather than degrade them to DFlash v1 (`config/vllm.py`, "DFlash candidate-head
drafts"). This proposer does the V2 speculator's greedy walk on V1: at each block slot the top-K of
the drafter's (scaled, soft-capped) logits, `model.compute_candidates`, are scored by the loaded
`candidate_selector` given the previously chosen candidate (the anchor before slot 1), and the best
one is taken: dmtp's own walk (`dmtp.drafters.dflash2.walk_candidates`, which `DFlash2Drafter.propose`
takes too) over vLLM's score table, as V2 walks it.

Drafts are greedy (vLLM's default `draft_sample_method`): at temperature > 0 the rejection sampler
then treats them as deterministic proposals, which keeps the target's distribution. Probabilistic
drafts (the walk's softmax as the proposal) are refused in one line.
"""
from __future__ import annotations

from typing import Any

import torch
from vllm.v1.spec_decode.dflash import DFlashProposer

from dmtp.drafters.dflash import default_sampler
from dmtp.drafters.dflash2 import walk_candidates

# vLLM's own names for candidate-head DFlash drafters (`VllmConfig._is_dflash_candidate_draft`).
CANDIDATE_HEAD_ARCHITECTURES = ("DFlash2DraftModel",)


def is_candidate_head_drafter(vllm_config) -> bool:
    """Whether the configured drafter is one this proposer serves (vLLM's own test, DFlash2 only:
    LiLiCorr's candidate head is another one)."""
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is None or spec.method != "dflash":
        return False
    names = getattr(getattr(spec, "draft_model_config", None), "architectures", None) or []
    return any(n in names for n in CANDIDATE_HEAD_ARCHITECTURES)


class DFlash2Proposer(DFlashProposer):
    def __init__(self, vllm_config, device, runner=None):
        super().__init__(vllm_config, device, runner)
        if self._enable_probabilistic_draft_probs:
            raise ValueError("DFlash2 drafts on vLLM's V1 runner are greedy walks of the candidate selector: "
                             "serve with draft_sample_method 'greedy' (the default)")
        self.anchors: torch.Tensor | None = None

    def build_model_inputs_first_pass(self, num_tokens: int, num_input_tokens: int,
                                      mm_embed_inputs) -> tuple[dict[str, Any], int]:
        kwargs, size = super().build_model_inputs_first_pass(num_tokens, num_input_tokens, mm_embed_inputs)
        width = 1 + self.num_speculative_tokens   # each request's block: [anchor, MASK x K]
        self.anchors = kwargs["input_ids"][:num_tokens].view(-1, width)[:, 0].long()
        return kwargs, size

    def _sample_draft_tokens(self, hidden_states: torch.Tensor, sampling_metadata) -> tuple[torch.Tensor, None]:
        """hidden_states [B * K, H], request-major -> draft tokens [B * K] (the selector's greedy path)."""
        steps = self.num_speculative_tokens
        hidden = hidden_states.view(-1, steps, hidden_states.shape[-1])
        batch = hidden.shape[0]
        candidates, unary = self.model.compute_candidates(hidden_states)
        candidates = candidates.view(batch, steps, -1)
        scores = self.model.model.candidate_selector(candidates, unary.view_as(candidates), hidden,
                                                     self.anchors[:batch])   # [B, K, previous, candidate]
        rows = torch.arange(batch, device=candidates.device)

        def score_at(step, prev_token, prev_rank):   # vLLM's table is indexed by the previous candidate's rank
            return scores[rows, step, prev_rank].float()

        tokens, _ = walk_candidates(candidates, score_at, self.anchors[:batch], default_sampler(0.0))
        return tokens.reshape(-1), None


__all__ = ["CANDIDATE_HEAD_ARCHITECTURES", "DFlash2Proposer", "is_candidate_head_drafter"]
