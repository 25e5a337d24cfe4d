"""The drafter-training levers of the sandbox study: soft (KL) distillation labels, T1 from the MTP's
own prediction, draft layers started from the target's last layers."""
from __future__ import annotations

import pytest
import torch

from dmtp.configs import compose_train
from dmtp.injection import VARIANTS
from dmtp.training.components import build_components
from test_training import _batch


@pytest.fixture(scope="module")
def tokenizer():
    _, tok, _, _ = build_components(compose_train([]))
    return tok


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_kl_distillation_gives_finite_loss_and_gradients(name, tokenizer):
    torch.manual_seed(0)
    _, _, _, module = build_components(compose_train([f"injection={name}", "model.label_source=target_kl"]))
    ids, mask = _batch(tokenizer)
    loss, acc, n = module.block_loss(ids, mask, generator=torch.Generator().manual_seed(0))
    loss.backward()
    grads = [p.grad for p in module.drafter.parameters() if p.requires_grad]
    assert n > 0 and torch.isfinite(loss) and loss > 0
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


def test_kl_equals_hard_ce_on_exactly_one_hot_teachers(tokenizer):
    """With a one-hot teacher, KL(p || q) is the CE on the teacher's argmax: the two label sources then give
    the same loss, which pins down that KL reads the right target rows.

    The teacher is made exactly one-hot (0 on the target's argmax, -1e4 elsewhere: exp(-1e4) is 0 in fp32), not
    by scaling the logits: scaled near-ties keep some mass off the argmax, by an amount that moves with the CPU's
    summation order (threads, BLAS build), and the two losses then differ by that entropy. Exactly one-hot, both
    are -log q(argmax) per slot, computed by two fp32 routines (a fused cross-entropy and log_softmax + gather):
    a few ulps of a value ~8 (1e-6) per slot, the same after the shared weighted mean; 1e-5 leaves 10x margin."""
    torch.manual_seed(0)
    _, _, _, module = build_components(compose_train(["model.label_source=target"]))
    ids, mask = _batch(tokenizer)
    real_forward = module.target.forward

    def one_hot(*args, **kwargs):
        out = real_forward(*args, **kwargs)
        top = out.logits.argmax(-1, keepdim=True)
        out.logits = torch.full_like(out.logits, -1e4).scatter_(-1, top, 0.0)
        return out

    module.target.forward = one_hot
    try:
        hard, _, _ = module.block_loss(ids, mask, generator=torch.Generator().manual_seed(1))
        module.label_source = "target_kl"
        soft, _, _ = module.block_loss(ids, mask, generator=torch.Generator().manual_seed(1))
    finally:
        module.target.forward = real_forward
    assert torch.allclose(hard, soft, rtol=0, atol=1e-5), (hard.item(), soft.item())


def test_t1_from_the_mtp_trains_only_blocks_whose_t1_the_mtp_gets_right(tokenizer):
    torch.manual_seed(0)
    _, _, _, module = build_components(compose_train([]))
    ids, mask = _batch(tokenizer)
    _, _, n_data = module.block_loss(ids, mask, generator=torch.Generator().manual_seed(2))
    module.t1_source = "mtp"
    loss, _, n_mtp = module.block_loss(ids, mask, generator=torch.Generator().manual_seed(2))
    assert 0 < n_mtp < n_data and torch.isfinite(loss)


def test_draft_layers_can_start_from_the_targets_last_layers():
    _, _, _, module = build_components(compose_train(["drafter.init_from_target_layers=true",
                                                      "drafter.num_layers=2"]))
    target_layers = module.target.hf.model.layers
    for draft_layer, source in zip(module.drafter.backbone.layers, list(target_layers)[-2:]):
        src = source.state_dict()
        for k, v in draft_layer.state_dict().items():
            assert torch.equal(v, src[k]), k
        assert draft_layer.self_attn.q_proj.weight.data_ptr() != source.self_attn.q_proj.weight.data_ptr()


@pytest.mark.parametrize("key,value,match", [("model.label_source", "soft", "label_source"),
                                             ("model.t1_source", "oracle", "t1_source")])
def test_bad_lever_values_are_one_line_errors(key, value, match):
    with pytest.raises(ValueError, match=match) as err:
        build_components(compose_train([f"{key}={value}"]))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("preset", ["micro", "micro_hybrid"])
def test_a_loss_on_data_tokens_skips_the_targets_lm_head_and_changes_nothing(preset):
    """label_source=data with CE reads no target logits: the decoder alone runs (no 151k-vocab head at real
    sizes), with the very same hidden states, so the loss is unchanged."""
    from built_targets import built_target
    from dmtp.models.target import TargetModel

    target = TargetModel.from_pretrained(built_target(preset))
    ids = torch.randint(5, target.config.vocab_size - 5, (2, 24), generator=torch.Generator().manual_seed(0))
    full, alone = target(ids, layer_ids=[0, 1]), target(ids, layer_ids=[0, 1], logits=False)
    assert alone.logits is None and full.logits is not None
    assert torch.equal(full.layer_hidden, alone.layer_hidden) and torch.equal(full.last_hidden, alone.last_hidden)
    module = build_components(compose_train(["debug=tiny_budget", "recipe=greedy", "model.label_source=data"]))[3]
    assert not module.needs_target_logits
    assert build_components(compose_train(["debug=tiny_budget", "recipe=greedy", "model.label_source=target"]))[3].needs_target_logits
