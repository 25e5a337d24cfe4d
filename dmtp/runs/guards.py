"""Training stops at the first non-finite number instead of exporting a broken drafter.

`FiniteGuard` checks, every step, the loss and the gradients before the optimizer step (in one read to the
host, after the backward: a read before it would hold the backward's launch until the forward had finished
on the device) and the trained weights after it. The first non-finite one raises `NonFiniteError` (a ValueError, so
the command ends with one line and a non-zero status) naming the step, the quantity and the last good
checkpoint. The weights are checked before any checkpoint callback runs (Lightning runs those last),
so every checkpoint on disk holds finite weights. `dmtp.train` always adds the guard: it is a safety
rule, not an option.
"""
from __future__ import annotations

import math

import lightning as L
import torch
from torch.distributed.tensor import DTensor


class NonFiniteError(ValueError):
    """A non-finite loss, gradient or weight stopped training."""


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of an FSDP-sharded tensor (every rank checks its own; the decision is reduced)."""
    return t.to_local() if isinstance(t, DTensor) else t


def _first_nonfinite(named) -> str | None:
    """Name of the first tensor with a NaN/inf entry (one host sync when all are finite)."""
    named = [(n, _local(t.detach())) for n, t in named if t is not None]
    if not named or bool(torch.stack([torch.isfinite(t).all() for _, t in named]).all()):
        return None
    return next(n for n, t in named if not torch.isfinite(t).all())


def _last_good_checkpoint(trainer: L.Trainer) -> str | None:
    for cb in trainer.checkpoint_callbacks:
        path = getattr(cb, "last_model_path", "") or getattr(cb, "best_model_path", "")
        if path:
            return path
    return None


class FiniteGuard(L.Callback):
    def _stop_if(self, trainer: L.Trainer, bad: bool, step: int, what: str) -> None:
        # Every rank takes the same decision (one rank's NaN loss must not leave the others waiting).
        if not trainer.strategy.reduce_boolean_decision(bad, all=False):
            return
        ckpt = _last_good_checkpoint(trainer)
        where = f"last good checkpoint: {ckpt}" if ckpt else "no checkpoint was saved before it"
        raise NonFiniteError(f"training stopped at step {step}: {what} (lower model.optimizer.lr?); {where}; "
                             "no drafter exported")

    def __init__(self) -> None:
        self._losses: list[torch.Tensor] = []   # this optimizer step's losses (one per accumulated batch)

    def on_before_backward(self, trainer, pl_module, loss: torch.Tensor) -> None:
        self._losses.append(loss.detach())      # checked before the optimizer step, with the gradients

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        losses, self._losses = self._losses, []
        # fp16 loss scaling: an overflowing gradient is expected, and the scaler skips that step.
        scaled = getattr(trainer.precision_plugin, "scaler", None) is not None
        grads = [] if scaled else [(n, p.grad) for n, p in pl_module.named_parameters()]
        name = _first_nonfinite([("loss", loss) for loss in losses] + grads)
        if name == "loss":
            value = next(v for v in (loss.float().sum().item() for loss in losses) if not math.isfinite(v))
            what = f"the loss is {value}"
        else:
            what = f"the gradient of {name} is non-finite"
        self._stop_if(trainer, name is not None, trainer.global_step + 1, what)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        name = _first_nonfinite((n, p) for n, p in pl_module.named_parameters() if p.requires_grad)
        self._stop_if(trainer, name is not None, trainer.global_step,
                      f"weight {name} is non-finite after the optimizer step")
