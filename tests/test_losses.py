"""`model.loss`: ce (default, unchanged), tv (total variation to the target's distribution) and DSpark's
mix (0.1 ce + 0.9 tv), all under the same position decay, for every drafter."""
from __future__ import annotations

import pytest
import torch

from dmtp.configs import compose_train
from dmtp.training.components import build_components
from dmtp.training.losses import total_variation
from dmtp.training.module import dmtp_module


def test_total_variation_follows_its_definition():
    g = torch.Generator().manual_seed(0)
    t, d = torch.randn(3, 5, 11, generator=g), torch.randn(3, 5, 11, generator=g)
    expected = 0.5 * (t.softmax(-1) - d.softmax(-1)).abs().sum(-1)
    torch.testing.assert_close(total_variation(t, d), expected)
    assert total_variation(t, t).abs().max() < 1e-6
    far = torch.tensor([[50.0, 0.0]]), torch.tensor([[0.0, 50.0]])
    assert total_variation(*far).item() == pytest.approx(1.0, abs=1e-6)


def _module(*overrides):
    torch.manual_seed(0)
    _, tokenizer, _, module = build_components(compose_train(["injection=dual_anchor_zero_init", "recipe=greedy", *overrides]))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 400, (2, 48), generator=g)
    return module, ids, torch.ones_like(ids)


@pytest.mark.parametrize("drafter", ["dflash", "dspark"])
def test_dspark_mix_is_the_weighted_sum_of_ce_and_tv(drafter):
    """The same blocks (same seed) under each loss: dspark = 0.1 ce + 0.9 tv, and tv is the decayed mean of
    the TV of each supervised slot; the greedy recipe's is ce."""
    module, ids, mask = _module(f"drafter={drafter}", "drafter.num_layers=1", "drafter.mtp_correction_rank=8")
    assert module.loss_name == "ce" and module.loss_mix == (1.0, 0.0)
    losses = {}
    for name in ("ce", "tv", "dspark"):
        module.loss_mix = {"ce": (1.0, 0.0), "tv": (0.0, 1.0), "dspark": (0.1, 0.9)}[name]
        aux_free, _, _ = module.block_loss(ids, mask, generator=torch.Generator().manual_seed(3))
        # the block's loss alone: the confidence BCE is the drafter's own term, the MTP correction's loss its own
        losses[name] = aux_free - module.last_auxiliary_loss - module.last_correction_loss
    assert 0 < losses["tv"] < 1 and losses["ce"] > losses["tv"]
    torch.testing.assert_close(losses["dspark"], 0.1 * losses["ce"] + 0.9 * losses["tv"])
    losses["tv"].backward()   # TV trains the drafter
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.drafter.parameters())


def test_tv_loss_learns_and_lowers_tv():
    module, ids, mask = _module("drafter.num_layers=1", "model.loss=tv")
    assert module.loss_mix == (0.0, 1.0)
    opt = torch.optim.AdamW(module.drafter.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        loss, _, _ = module.block_loss(ids, mask, generator=torch.Generator().manual_seed(0))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0], losses


def test_unknown_loss_is_one_line():
    with pytest.raises(ValueError, match=r"^model.loss must be one of ce, tv, dspark, got 'kl'$"):
        dmtp_module(None, None, None, None, loss="kl")
    with pytest.raises(ValueError, match=r"^unknown model option\(s\) model.anchors; known: label_source, label_temperature, loss, "):
        dmtp_module(None, None, None, None, anchors=8)
