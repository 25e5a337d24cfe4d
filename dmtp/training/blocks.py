"""Teacher-forced drafting of many blocks at once: one code path for the training loss and the
exact validation walk. Given a sequence, its target features and anchors, assemble every block's
slots through the injection module (the same `build_slots` the decoding loop calls) and run the
drafter once over all blocks; blocks never see each other (see `dflash_attention_mask`)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dmtp.injection.base import Injection
from dmtp.models.drafter import DFlashDrafter


@dataclass
class TeacherFeatures:
    input_ids: torch.Tensor       # [B, T]
    target_logits: torch.Tensor   # [B, T, V]
    context: torch.Tensor         # [B, T, context_dim]: injection.context_features(...)
    mtp_hidden: torch.Tensor | None  # [B, T, H]: g[:, t] predicts x_{t+1}; None when no MTP


@torch.no_grad()
def teacher_features(target, mtp, injection: Injection, layer_ids, input_ids: torch.Tensor,
                     attention_mask: torch.Tensor | None = None) -> TeacherFeatures:
    out = target(input_ids, layer_ids=layer_ids, attention_mask=attention_mask)
    g = None
    if injection.uses_mtp or injection.needs_mtp_context:
        g = mtp.forward_teacher(input_ids, out.last_hidden)
    return TeacherFeatures(input_ids, out.logits, injection.context_features(out.layer_hidden, g), g)


def sample_anchors(valid: torch.Tensor, num_anchors: int, generator: torch.Generator | None = None):
    """valid [B, T] bool -> (anchors [B, N] sorted, keep [B, N] bool). Uniform without replacement."""
    keys = torch.rand(valid.shape, generator=generator, device=valid.device)
    keys = keys.masked_fill(~valid, 2.0)
    n = max(1, min(num_anchors, int(valid.sum(1).max().item())))
    order = keys.argsort(dim=1)[:, :n]
    keep = valid.gather(1, order)
    anchors = torch.where(keep, order, torch.zeros_like(order))
    anchors, idx = anchors.sort(dim=1)
    return anchors, keep.gather(1, idx)


def predicted_positions(injection: Injection, anchors: torch.Tensor) -> torch.Tensor:
    """[B, N] anchors -> [B, N, n_pred] positions of the drafter's predicted slots."""
    return injection.slot_positions(anchors.flatten())[:, injection.first_predicted_slot:].view(
        *anchors.shape, injection.num_drafter_candidates)


def valid_anchors(injection: Injection, loss_mask: torch.Tensor) -> torch.Tensor:
    """An anchor a is usable when the first position the drafter predicts is in range and supervised."""
    b, t = loss_mask.shape
    first = torch.arange(t, device=loss_mask.device) + injection.first_slot_offset + injection.first_predicted_slot
    ok = first < t
    supervised = torch.zeros_like(loss_mask, dtype=torch.bool)
    supervised[:, ok] = loss_mask[:, first[ok]].bool()
    return supervised


def draft_blocks(drafter: DFlashDrafter, injection: Injection, embed_weight: torch.Tensor,
                 feats: TeacherFeatures, anchors: torch.Tensor, keep: torch.Tensor,
                 t1: torch.Tensor | None) -> torch.Tensor:
    """Run the drafter over every (sequence, anchor) block. anchors/keep [B, N]; t1 [B, N] or None.

    Returns the drafter's final hidden states at the predicted slots: [B, N, n_pred, H]."""
    b, n = anchors.shape
    ids = feats.input_ids
    anchor_tok = ids.gather(1, anchors)
    h_mtp = None
    if feats.mtp_hidden is not None:
        h_mtp = feats.mtp_hidden.gather(1, anchors[..., None].expand(-1, -1, feats.mtp_hidden.shape[-1]))
        h_mtp = h_mtp.flatten(0, 1)
    embed = lambda x: drafter.embed_noise(x, embed_weight)  # noqa: E731
    slots = injection.build_slots(embed, anchor_tok.flatten(), None if t1 is None else t1.flatten(), h_mtp)
    s = slots.shape[1]
    positions = injection.slot_positions(anchors.flatten()).view(b, n * s)
    t = ids.shape[1]
    ctx_positions = torch.arange(t, device=ids.device).expand(b, -1)
    ctx_kv = drafter.context_kv(drafter.project_context(feats.context), ctx_positions)
    # Dropped anchors see no context (limit 0); their outputs carry zero loss weight.
    ctx_limit = torch.where(keep, anchors, torch.zeros_like(anchors)).repeat_interleave(s, dim=1)
    block_ids = torch.arange(n, device=ids.device).repeat_interleave(s)[None].expand(b, -1)
    hidden = drafter(slots.view(b, n * s, -1), positions, ctx_kv, ctx_positions, ctx_limit, block_ids)
    return hidden.view(b, n, s, -1)[:, :, injection.first_predicted_slot:]
