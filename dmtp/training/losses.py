"""The drafter's per-position loss options (`model.loss`), weighed by the position decay in module.py.

* `ce` (default): cross-entropy to the labels (`model.label_source`: data tokens, the target's greedy
  token, or its whole distribution as KL), exactly the loss every earlier result was trained with.
* `tv`: total variation distance 0.5 * sum_v |p_v - q_v| between the target's next-token distribution p
  (temperature 1) and the drafter's q. 1 - TV is the probability that one rejection-sampling step
  accepts, so TV is an acceptance proxy (DSpark, reference/dspark.md); it ignores `label_source`.
* `dspark`: DSpark's mix, 0.1 x the `ce` term + 0.9 x TV (NeMo AutoModel's defaults). The confidence
  head's BCE is not here: it is the drafter's own `auxiliary_loss` (dmtp.drafters.dspark).

Each term is per predicted slot; block_loss weighs the slots by exp(-(k-1)/gamma) and normalises.
"""
from __future__ import annotations

import torch

# name -> (weight of the CE/KL term, weight of the TV term)
LOSS_MIXES = {"ce": (1.0, 0.0), "tv": (0.0, 1.0), "dspark": (0.1, 0.9)}


def require_loss(name) -> tuple[float, float]:
    if name not in LOSS_MIXES:
        raise ValueError(f"model.loss must be one of {', '.join(LOSS_MIXES)}, got {name!r}")
    return LOSS_MIXES[name]


def total_variation(target_logits: torch.Tensor, draft_logits: torch.Tensor) -> torch.Tensor:
    """[..., V] target logits, [..., V] drafter logits -> [...] 0.5 * |softmax(t) - softmax(d)|_1 (fp32)."""
    p = torch.softmax(target_logits.float(), -1)
    q = torch.softmax(draft_logits.float(), -1)
    return 0.5 * (p - q).abs().sum(-1)


__all__ = ["LOSS_MIXES", "require_loss", "total_variation"]
