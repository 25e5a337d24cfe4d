"""Checkpoints written in a background thread (`checkpoint_writes=background`, the default on CUDA trainers) hold
exactly what inline writes hold, resume the same, and a failed background write still ends the run with its error."""
from __future__ import annotations

import errno

import pytest
import torch

from dmtp.configs import compose_train
from dmtp.runs import checkpoint_io
from dmtp.runs.checkpoint_io import BackgroundCheckpointIO, checkpoint_io_for
from dmtp.training.job import train

COMMON = ["callbacks=default", "~callbacks.lr_monitor", "callbacks.model_checkpoint.every_n_train_steps=2",
          "callbacks.model_checkpoint.save_top_k=-1", "trainer.max_steps=4", "model.val_walk=false",
          "trainer.enable_progress_bar=false", "data.max_examples=12"]


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


def test_background_checkpoints_equal_inline_ones(tmp_path):
    for writes in ("inline", "background"):
        train(compose_train(COMMON + [f"checkpoint_writes={writes}"], output_dir=tmp_path / writes))
    for name in ("step000002.ckpt", "step000004.ckpt"):
        inline = torch.load(tmp_path / "inline" / "checkpoints" / name, weights_only=True)
        background = torch.load(tmp_path / "background" / "checkpoints" / name, weights_only=True)
        for key in ("state_dict", "optimizer_states", "lr_schedulers", "loops", "global_step"):
            assert _equal(inline[key], background[key]), f"{name}: {key} differs"


def test_a_failed_background_write_ends_the_run_with_its_error(tmp_path, monkeypatch):
    def full_disk(obj, path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(checkpoint_io, "torch_save", full_disk)
    with pytest.raises(OSError, match="No space left"):
        train(compose_train(COMMON + ["checkpoint_writes=background"], output_dir=tmp_path / "run"))
    assert not (tmp_path / "run" / "drafter").exists()


def test_checkpoint_writes_choice():
    assert isinstance(checkpoint_io_for("auto", on_cuda=True), BackgroundCheckpointIO)
    assert not isinstance(checkpoint_io_for("auto", on_cuda=False), BackgroundCheckpointIO)
    assert isinstance(checkpoint_io_for("background", on_cuda=False), BackgroundCheckpointIO)
    with pytest.raises(ValueError, match="checkpoint_writes must be one of"):
        checkpoint_io_for("sometimes", on_cuda=False)
