"""Teacher-forced drafting of many blocks at once: one code path for the training loss and the
exact validation walk. Given a sequence, its target features and anchors, assemble every block's
slots through the injection module (the same `build_block` the decoding loop calls) and run the
drafter once over all blocks; blocks never see each other (see `dflash_attention_mask`).

A block's MTP inputs (`MTPBlockInputs`): T1..TS and the hiddens that predicted them. h_1 = g_a comes
from the teacher-forced MTP pass; for S > 1 (the multi-step variant) h_2..h_S come from the MTP's
own chain from each anchor (`dmtp.models.mtp_chain.TeacherChain`, exactly decoding's rows), fed the
data tokens in training (teacher forcing) or the MTP's own greedy tokens in the validation walk."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dmtp.block_drafter import BlockDrafter
from dmtp.injection.base import Injection
from dmtp.models.mtp_chain import TeacherChain


@dataclass
class TeacherFeatures:
    input_ids: torch.Tensor       # [B, T]
    target_logits: torch.Tensor   # [B, T, V]
    context: torch.Tensor         # [B, T, context_dim]: injection.context_features(...)
    mtp_hidden: torch.Tensor | None  # [B, T, H]: g[:, t] predicts x_{t+1}; None when no MTP
    target_hidden: torch.Tensor | None = None  # [B, T, H]: the target's post-norm hidden (the MTP's input)


@dataclass
class MTPBlockInputs:
    """What the MTP gives each block: tokens [B, N, S] (T1..TS), hidden [B, N, S, H] (h_j predicted
    T_j) and num [B, N] (m: how many of them the block uses, 1..S)."""
    tokens: torch.Tensor
    hidden: torch.Tensor
    num: torch.Tensor


def teacher_features(target, mtp, drafter: BlockDrafter, input_ids: torch.Tensor,
                     attention_mask: torch.Tensor | None = None, mtp_grad: bool = False) -> TeacherFeatures:
    """The frozen target's features at the drafter's tapped layers and the MTP's teacher-forced hiddens;
    with `mtp_grad` (a jointly trained MTP) the MTP's pass keeps its autograd graph."""
    with torch.no_grad():
        out = target(input_ids, layer_ids=drafter.layer_ids, attention_mask=attention_mask)
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
                     tokens: torch.Tensor | None = None, mtp_grad: bool = False):
    """T1..T_steps [B, N, steps] and their hiddens [B, N, steps, H] for every anchor [B, N], plus the
    chain's logits [B, N, steps, V] when the MTP picks the tokens.

    tokens [B, N, steps]: the data tokens to feed the chain (teacher forcing, training; logits None);
    None: the MTP's own greedy picks, as greedy decoding proposes them (the validation walk)."""
    grad = mtp_grad and torch.is_grad_enabled()
    hiddens = [_at_anchors(feats.mtp_hidden, anchors)]
    chain = None
    if steps > 1:
        with torch.set_grad_enabled(grad):
            chain = TeacherChain(mtp, feats.input_ids, feats.target_hidden, anchors, steps - 1)
    toks, logits = [], []
    for j in range(steps):
        if j:
            with torch.set_grad_enabled(grad):
                hiddens.append(chain.step(j, toks[-1], hiddens[-1]))
        if tokens is None:
            logits.append(mtp.logits(hiddens[-1]))
            toks.append(logits[-1].argmax(-1))
        else:
            toks.append(tokens[..., j])
    return torch.stack(toks, -1), torch.stack(hiddens, -2), torch.stack(logits, -2) if logits else None


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


def draft_blocks(drafter: BlockDrafter, embed_weight: torch.Tensor, feats: TeacherFeatures,
                 anchors: torch.Tensor, keep: torch.Tensor,
                 mtp_inputs: "torch.Tensor | MTPBlockInputs | None", mtp_grad: bool = False) -> torch.Tensor:
    """Run the drafter over every (sequence, anchor) block. anchors/keep [B, N]; mtp_inputs: the
    blocks' `MTPBlockInputs`, or just T1 [B, N] (one MTP token, h_1 = g_a), or None (no MTP token).

    Returns the drafter's final hidden states at the predicted slots: [B, N, n_pred, H]."""
    injection = drafter.injection
    b, n = anchors.shape
    ids = feats.input_ids
    anchor_tok = ids.gather(1, anchors)
    if isinstance(mtp_inputs, torch.Tensor):
        ones = torch.ones_like(mtp_inputs)
        mtp_inputs = MTPBlockInputs(mtp_inputs[..., None], _at_anchors(feats.mtp_hidden, anchors)[..., None, :], ones)
    tokens = hidden = num = None
    if mtp_inputs is not None:
        tokens, num = mtp_inputs.tokens.flatten(0, 1), mtp_inputs.num.flatten()
        hidden = mtp_inputs.hidden.flatten(0, 1)
    elif feats.mtp_hidden is not None:   # variants that read h_mtp without a T1 of their own
        hidden = _at_anchors(feats.mtp_hidden, anchors).flatten(0, 1)[:, None]
    embed = lambda x: drafter.embed(x, embed_weight)  # noqa: E731
    slots = injection.build_block(embed, anchor_tok.flatten(), tokens, hidden, num, mtp_grad=mtp_grad)
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
