"""Teacher-forced drafting of many blocks at once: one code path for the training loss and the
exact validation walk.

Given a sequence, its target features and anchors, the drafter drafts every block in one forward
(`BlockDrafter.draft_block`, the function the decoding loop and the reference round call too); blocks never see each
other (see `dflash_attention_mask`).

A block's MTP inputs (`MTPBlockInputs`): T1..TS and the hiddens that predicted them. h_1 = g_a comes
from the teacher-forced MTP pass; for S > 1 (the multi-step variant) h_2..h_S come from the MTP's
own chain from each anchor (`chain_mtp` over `dmtp.models.mtp_chain.TeacherChain`, exactly decoding's
rows), fed the data tokens in training (teacher forcing) or the MTP's own greedy tokens in the
validation walk."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dmtp.drafters.block_drafter import BlockDrafter, DraftedBlock, MTPBlockInputs
from dmtp.injection.base import Injection
from dmtp.models.mtp_chain import MTPChain, TeacherChain, chain_mtp
from dmtp.training.draws import BatchDraws, RowDraws


@dataclass
class TeacherFeatures:
    input_ids: torch.Tensor       # [B, T]
    target_logits: torch.Tensor | None   # [B, T, V]; None when not asked for
    context: torch.Tensor         # [B, T, context_dim]: injection.context_features(...)
    mtp_hidden: torch.Tensor | None  # [B, T, H]: g[:, t] predicts x_{t+1}; None when no MTP
    target_hidden: torch.Tensor | None = None  # [B, T, H]: the target's post-norm hidden (the MTP's input)


def teacher_features(target, mtp, drafter: BlockDrafter, input_ids: torch.Tensor,
                     attention_mask: torch.Tensor | None = None, mtp_grad: bool = False,
                     logits: bool = True) -> TeacherFeatures:
    """The frozen target's features at the drafter's tapped layers and the MTP's teacher-forced hiddens;
    with `mtp_grad` (a jointly trained MTP) the MTP's pass keeps its autograd graph. `logits=False`: no
    target logits (`target_logits` None), for losses that read only the data tokens."""
    with torch.no_grad():
        out = target(input_ids, layer_ids=drafter.layer_ids, attention_mask=attention_mask, logits=logits)
    g = None
    with torch.set_grad_enabled(mtp_grad and torch.is_grad_enabled()):
        if drafter.needs_mtp:
            g = mtp.forward_teacher(input_ids, out.last_hidden)
        context = drafter.injection.context_features(out.layer_hidden, g)
    return TeacherFeatures(input_ids, out.logits, context, g, out.last_hidden)


def _at_anchors(x: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """x [B, T, H], anchors [B, N] -> [B, N, H]."""
    return x.gather(1, anchors[..., None].expand(-1, -1, x.shape[-1]))


def mtp_block_inputs(mtp, feats: TeacherFeatures, anchors: torch.Tensor, steps: int,
                     tokens: torch.Tensor | None = None, mtp_grad: bool = False) -> MTPChain:
    """The MTP's chain from every anchor [B, N]: T1..T_steps [B, N, steps], their hiddens [B, N, steps, H]
    and, when the MTP picks the tokens, the chain's logits [B, N, steps, V].

    tokens [B, N, steps]: the data tokens to feed the chain (teacher forcing, training; logits None);
    None: the MTP's own greedy picks, as greedy decoding proposes them (the validation walk)."""
    grad = mtp_grad and torch.is_grad_enabled()
    chain = None
    if steps > 1:
        with torch.set_grad_enabled(grad):
            chain = TeacherChain(mtp, feats.input_ids, feats.target_hidden, anchors, steps - 1)

    def step(j, token, hidden):
        with torch.set_grad_enabled(grad):
            return chain.step(j, token, hidden)

    return chain_mtp(mtp, _at_anchors(feats.mtp_hidden, anchors), steps, step, tokens=tokens, keep_logits=True)


def sample_anchors(valid: torch.Tensor, num_anchors: int, generator: torch.Generator | None = None,
                   draws: "BatchDraws | RowDraws | None" = None):
    """valid [B, T] bool -> (anchors [B, N] sorted, keep [B, N] bool).

    Uniform without replacement, drawn from `draws` (dmtp.training.draws), else from `generator` (else the global
    RNG)."""
    keys = (draws or BatchDraws(generator)).uniform(valid.shape, valid.device)
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


def draft_blocks(drafter: BlockDrafter, embed_weight: torch.Tensor, feats: TeacherFeatures,
                 anchors: torch.Tensor, keep: torch.Tensor, mtp_inputs: "torch.Tensor | MTPBlockInputs | None",
                 mtp_grad: bool = False, lm_head_weight: torch.Tensor | None = None) -> DraftedBlock:
    """Draft every (sequence, anchor) block in one forward. anchors/keep [B, N]; mtp_inputs: the blocks'
    `MTPBlockInputs`, or just T1 [B, N] (one MTP token, h_1 = g_a), or None (no MTP token).

    The context: the whole sequence's features, each block seeing the positions before its anchor (a dropped anchor
    sees none; its outputs carry zero loss weight). With `lm_head_weight`, the candidates too. -> `DraftedBlock`
    (hidden states at the predicted slots [B, N, n_pred, H], ...)."""
    b, _ = anchors.shape
    ids = feats.input_ids
    if isinstance(mtp_inputs, torch.Tensor):
        ones = torch.ones_like(mtp_inputs)
        mtp_inputs = MTPBlockInputs(mtp_inputs[..., None], _at_anchors(feats.mtp_hidden, anchors)[..., None, :], ones)
    ctx_positions = torch.arange(ids.shape[1], device=ids.device).expand(b, -1)
    ctx_kv = drafter.context_kv(drafter.project_context(feats.context), ctx_positions)
    return drafter.draft_block(embed_weight, ids.gather(1, anchors), anchors, ctx_kv, ctx_positions, mtp_inputs,
                               keep=keep, lm_head_weight=lm_head_weight, mtp_grad=mtp_grad)
