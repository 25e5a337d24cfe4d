"""A batch's teacher features from the feature cache instead of the target's forward (`data.features=true`).

`cached_teacher_features` gives the LightningModule and the validation walk the same `TeacherFeatures` that
`dmtp.training.blocks.teacher_features` computes online: the tapped layers as the target's forward returns
them, the MTP's per-position hiddens (recomputed from the cached last hidden, with their autograd graph, when
the MTP trains), the injection's context built from them, and the target's logits where the loss reads them,
rebuilt from the stored labels (`teacher_logits`).
"""
from __future__ import annotations

import math

import torch

from dmtp.training.blocks import TeacherFeatures

TINY = 1e-30


def teacher_logits(cached: dict, vocab_size: int) -> torch.Tensor:
    """[B, T, V] logits whose softmax is the stored distribution and whose argmax is the stored greedy id.

    top-k: log p at the k stored ids, and the tail mass spread evenly over the other V - k ids (each such
    share is at most the k-th probability, so the argmax stays the top-1 id); greedy only: one-hot (its argmax
    is all it can stand for: a KL / TV loss needs `labels=topk`, checked when the run is built)."""
    greedy = cached["greedy"]
    if "topk_ids" in cached:
        ids, probs = cached["topk_ids"], cached["topk_probs"]
        k = ids.shape[-1]
        rest = (cached["tail"] / max(1, vocab_size - k)).clamp(min=TINY).log()
        out = rest[..., None].expand(*greedy.shape, vocab_size).clone()
        out.scatter_(-1, ids, probs.clamp(min=TINY).log())
        # the stored argmax wins exact ties of the reconstruction (a top-k in fp16 can hold equal values)
        top = out.gather(-1, greedy[..., None])
        return out.scatter_(-1, greedy[..., None], torch.nextafter(top, torch.full_like(top, math.inf)))
    out = torch.zeros(*greedy.shape, vocab_size, device=greedy.device)
    return out.scatter_(-1, greedy[..., None], 1.0)


def cached_teacher_features(drafter, mtp, input_ids: torch.Tensor, cached: dict, vocab_size: int,
                            mtp_grad: bool = False, logits: bool = True) -> TeacherFeatures:
    """The batch's cached features as `TeacherFeatures` (the same fields `teacher_features` fills online)."""
    last = cached.get("last_hidden")
    with torch.set_grad_enabled(mtp_grad and torch.is_grad_enabled()):
        g = None
        if drafter.needs_mtp:
            if mtp_grad and torch.is_grad_enabled():
                if last is None:
                    raise ValueError("model.train_mtp=true recomputes the MTP's pass from the target's last hidden: "
                                     "capture it (data.feature_last_hidden=true)")
                g = mtp.forward_teacher(input_ids, last)
            else:
                g = cached.get("mtp_hidden")
        context = drafter.injection.context_features(cached["taps"], g)
    target_logits = teacher_logits(cached, vocab_size) if logits and "greedy" in cached else None
    return TeacherFeatures(input_ids, target_logits, context, g, last)


def rows_of(cached: dict | None, rows: torch.Tensor) -> dict | None:
    """The cached features of some rows of a batch (a rank's share of a validation batch)."""
    if cached is None:
        return None
    return {k: v[rows.to(v.device)] for k, v in cached.items()}


__all__ = ["cached_teacher_features", "rows_of", "teacher_logits"]
