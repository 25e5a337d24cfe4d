"""The drafter's per-position loss options (`model.loss`), weighed by the position decay in module.py.

* `ce` (default): cross-entropy to the labels (`model.label_source`: data tokens, the target's greedy
  token, or its whole distribution as KL), exactly the loss every earlier result was trained with.
* `tv`: total variation distance 0.5 * sum_v |p_v - q_v| between the target's next-token distribution p
  (temperature 1) and the drafter's q. 1 - TV is the probability that one rejection-sampling step
  accepts, so TV is an acceptance proxy (DSpark, reference/dspark.md); it ignores `label_source`.
* `dspark`: DSpark's mix, 0.1 x the `ce` term + 0.9 x TV (NeMo AutoModel's defaults). The confidence
  head's BCE is not here: it is the drafter's own `auxiliary_loss` (dmtp.drafters.dspark).

Each term is per predicted slot; block_loss weighs the slots by exp(-(k-1)/gamma) and normalises.
`token_loss` is the one per-token rule, for the drafter's slots and the MTP's own proposals alike (a jointly
trained MTP, an MTP correction). The distributions compared (KL, TV) are at `temperature` (`model.label_temperature`:
the serving temperature whose rejection sampling the drafter's q is to match): softmax(logits / T) on both sides.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

# name -> (weight of the CE/KL term, weight of the TV term)
LOSS_MIXES = {"ce": (1.0, 0.0), "tv": (0.0, 1.0), "dspark": (0.1, 0.9)}


def require_loss(name) -> tuple[float, float]:
    if name not in LOSS_MIXES:
        raise ValueError(f"model.loss must be one of {', '.join(LOSS_MIXES)}, got {name!r}")
    return LOSS_MIXES[name]


def require_temperature(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"label_temperature must be a number > 0 (the serving temperature the drafter's q is "
                         f"matched at), got {value!r}")
    return float(value)


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    logits = logits.float()
    return logits if temperature == 1.0 else logits / temperature


def total_variation(target_logits: torch.Tensor, draft_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """[..., V] target logits, [..., V] drafter logits -> [...] 0.5 * |p - q|_1 (fp32), both at `temperature`."""
    p = torch.softmax(_scaled(target_logits, temperature), -1)
    q = torch.softmax(_scaled(draft_logits, temperature), -1)
    return 0.5 * (p - q).abs().sum(-1)


def kl_to_target(target_logits: torch.Tensor, draft_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """[..., V] -> [...] KL(p || q) (fp32), both at `temperature`."""
    log_p = torch.log_softmax(_scaled(target_logits, temperature), -1)
    return (log_p.exp() * (log_p - torch.log_softmax(_scaled(draft_logits, temperature), -1))).sum(-1)


def token_loss(logits: torch.Tensor, mix: tuple[float, float], soft_labels: bool, labels: torch.Tensor | None,
               teacher: torch.Tensor | None, temperature: float = 1.0) -> torch.Tensor:
    """The per-token loss: logits [..., V] -> [...]. mix = (CE weight, TV weight) of `model.loss`; the CE term is
    KL from the target's distribution (`teacher` [..., V]) with `soft_labels` (label_source=target_kl), else CE to
    `labels` [...]; the TV term compares with `teacher` at `temperature` too."""
    ce_weight, tv_weight = mix
    out = torch.zeros(logits.shape[:-1], device=logits.device)
    if ce_weight:
        if soft_labels:
            ce = kl_to_target(teacher, logits, temperature)
        else:
            ce = F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), reduction="none").view(logits.shape[:-1])
        out = ce if ce_weight == 1.0 else ce_weight * ce   # `ce` alone: bit-identical to the earlier loss
    if tv_weight:
        out = out + tv_weight * total_variation(teacher, logits, temperature)
    return out


__all__ = ["LOSS_MIXES", "kl_to_target", "require_loss", "require_temperature", "token_loss", "total_variation"]
