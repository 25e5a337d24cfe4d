"""A training step reads nothing back to the host between the target's forward and the optimizer step: on a
GPU each such read holds the launch of the rest of the step until the device has caught up (issue 33, "host
syncs"). The anchors' count is read before the target's forward; the guard reads the loss with the gradients."""
from __future__ import annotations

import pytest
import torch

import dmtp.training.module as module_file
from dmtp.configs import compose_train
from dmtp.injection import VARIANTS
from dmtp.runs.guards import FiniteGuard
from dmtp.training.components import build_components
from test_training import _batch

HOST_READS = ("item", "tolist", "__bool__", "__int__", "__float__")


@pytest.fixture
def host_reads_after_the_targets_forward(monkeypatch):
    """Every host read of a tensor after `teacher_features` has run, by name (nothing is blocked)."""
    reads, started = [], []
    forward = module_file.teacher_features

    def teacher_features(*args, **kwargs):
        out = forward(*args, **kwargs)
        started.append(True)
        return out

    monkeypatch.setattr(module_file, "teacher_features", teacher_features)
    for name in HOST_READS:
        def read(self, *args, _real=getattr(torch.Tensor, name), _name=name, **kwargs):
            if started:
                reads.append(_name)
            return _real(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, read)
    return reads, started


@pytest.mark.parametrize("name", ["raw_dflash", "dual_anchor_zero_init", "multi_mtp_zero_init"])
def test_a_training_step_reads_nothing_back_after_the_targets_forward(name, host_reads_after_the_targets_forward):
    assert name in VARIANTS
    torch.manual_seed(0)
    _, tokenizer, _, module = build_components(compose_train([f"injection={name}"]))
    ids, mask = _batch(tokenizer)
    reads, started = host_reads_after_the_targets_forward
    loss = module.training_step({"input_ids": ids, "loss_mask": mask, "index": torch.arange(ids.shape[0])}, 0)
    FiniteGuard().on_before_backward(None, module, loss)
    loss.backward()
    assert started and reads == [], reads


def test_the_guard_still_names_a_nonfinite_loss_at_the_optimizer_step():
    class Strategy:
        @staticmethod
        def reduce_boolean_decision(bad, all=False):
            return bad

    class Trainer:
        strategy, precision_plugin, global_step, checkpoint_callbacks = Strategy(), None, 4, []

    module = torch.nn.Linear(2, 1)
    module.weight.grad, module.bias.grad = torch.zeros(1, 2), torch.zeros(1)
    guard = FiniteGuard()
    guard.on_before_backward(Trainer, module, torch.tensor(1.5))
    guard.on_before_optimizer_step(Trainer, module, None)          # finite: nothing happens
    guard.on_before_backward(Trainer, module, torch.tensor(float("nan")))
    with pytest.raises(ValueError, match=r"^training stopped at step 5: the loss is nan"):
        guard.on_before_optimizer_step(Trainer, module, None)
