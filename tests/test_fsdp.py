"""The production multi-GPU trainer (trainer=fsdp: FSDP2 over the drafter, dmtp.training.fsdp) on CPU ranks
with gloo: 2 ranks train exactly what 1 rank trains on the same global batch (gradient clipping by norm on),
a checkpoint written at 2 ranks resumes at 1, and rank 0 alone exports the full drafter."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from dmtp.configs import compose_train
from dmtp.training.components import target_device
from dmtp.training.export import export_dtype

# Constant learning rate (no schedule), so that a 2-step run continued to 4 steps is the 4-step run; clipping
# at a small norm, so that every step is clipped (a norm of the local shard alone would show).
COMMON = ["debug=tiny_budget", "injection=dual_anchor_zero_init", "recipe=greedy", "logger=csv",
          "~callbacks.lr_monitor", "trainer.precision=32-true",
          "trainer.gradient_clip_val=0.05", "model.scheduler=null", "data.max_examples=40", "model.val_walk=false",
          "trainer.val_check_interval=4", "trainer.max_steps=4", "callbacks.model_checkpoint.every_n_train_steps=2",
          "callbacks.model_checkpoint.save_top_k=-1"]
FSDP_CPU = ["trainer=fsdp", "trainer.accelerator=cpu"]
DIST_ENV = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE")


def _train(run_dir, *args, timeout=600) -> str:
    # A fresh rendezvous: nothing of a process group an earlier in-process test set up (its port) is inherited.
    env = {k: v for k, v in os.environ.items() if k not in DIST_ENV} | {"OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "dmtp.train", *COMMON, *args, f"hydra.run.dir={run_dir}"],
                         capture_output=True, text=True, timeout=timeout, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


@pytest.mark.slow
def test_two_fsdp_ranks_train_and_resume_as_one_rank(tmp_path):
    two = _train(tmp_path / "two", *FSDP_CPU, "trainer.devices=2", "data.batch_size=2")
    assert two.count("exported to") == 1                       # rank 0 alone writes the drafter
    sharded = load_file(tmp_path / "two" / "drafter" / "model.safetensors")
    shutil.copytree(tmp_path / "two" / "drafter", tmp_path / "two_export")
    _train(tmp_path / "one", "trainer=cpu", "data.batch_size=4")   # the single-device trainer, same global batch
    single = load_file(tmp_path / "one" / "drafter" / "model.safetensors")
    assert _max_diff(sharded, single) < 1e-5                   # whole tensors, the same steps
    assert json.loads((tmp_path / "two_export" / "config.json").read_text())["torch_dtype"] == "float32"

    # The 2-rank checkpoint at step 2 holds whole tensors and resumes on one FSDP rank (batch 4: the same rows).
    ckpt = torch.load(tmp_path / "two" / "checkpoints" / "step000002.ckpt", weights_only=True)
    assert not any(k.startswith(("target.", "mtp.")) for k in ckpt["state_dict"])
    shapes = {k: tuple(v.shape) for k, v in single.items()}
    assert tuple(ckpt["state_dict"]["drafter.backbone.fc.weight"].shape) == shapes["fc.weight"]
    _train(tmp_path / "resumed", *FSDP_CPU, "trainer.devices=1", "data.batch_size=4",
           f"ckpt_path={tmp_path / 'two' / 'checkpoints' / 'step000002.ckpt'}")
    resumed = load_file(tmp_path / "two" / "drafter" / "model.safetensors")   # a continued run stays in its dir
    assert _max_diff(resumed, single) < 1e-5


@pytest.mark.slow
def test_fsdp_with_a_sharded_bf16_target_beside_the_fp32_drafter_exports_bf16(tmp_path):
    """The crash of the old strategy: a bf16 frozen target and an fp32 trained drafter in one module."""
    # The target's layers sharded too (shard_target), and the validation walk on (it reads the drafter whole).
    out = _train(tmp_path / "run", *FSDP_CPU, "trainer.devices=2", "data.batch_size=2", "trainer.max_steps=2",
                 "target.dtype=bfloat16", "trainer.precision=bf16-mixed", "trainer.strategy.shard_target=true",
                 "model.val_walk=true", "trainer.val_check_interval=2")
    assert out.count("exported to") == 1 and "final validation walk" in out
    config = json.loads((tmp_path / "run" / "drafter" / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16"                 # export_dtype follows bf16-mixed
    tensors = load_file(tmp_path / "run" / "drafter" / "model.safetensors")
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    assert all(torch.isfinite(t.float()).all() for t in tensors.values())


def test_export_dtype_follows_the_training_precision_unless_given():
    assert export_dtype(compose_train(["trainer.precision=32-true"], tiny=False)) == torch.float32
    assert export_dtype(compose_train(["trainer.precision=bf16-mixed"], tiny=False)) == torch.bfloat16
    assert export_dtype(compose_train(["trainer.precision=bf16-mixed", "export_dtype=float32"], tiny=False)) \
        == torch.float32
    with pytest.raises(ValueError, match="export_dtype must be one of"):
        export_dtype(compose_train(["export_dtype=int8"], tiny=False))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_the_target_follows_the_trainer_and_a_gpu_trainer_without_cuda_is_one_line():
    assert target_device(compose_train(["trainer=cpu"], tiny=False)) == "cpu"
    assert target_device(compose_train(["trainer=gpu", "target.device=cpu"], tiny=False)) == "cpu"   # told so
    for trainer in ("gpu", "fsdp"):
        with pytest.raises(ValueError, match="no CUDA device"):
            target_device(compose_train([f"trainer={trainer}"], tiny=False))


def test_gpu_trainer_on_a_cpu_machine_exits_2(tmp_path, monkeypatch, capsys):
    if torch.cuda.is_available():
        pytest.skip("checks the CPU-only refusal")
    from cli_runner import run_command

    code, line, _ = run_command("dmtp.train", ["debug=tiny_budget", "trainer=gpu"], tmp_path, monkeypatch, capsys)
    assert code == 2 and "no CUDA device" in line and line.startswith("dmtp.train: error:")


@pytest.mark.slow
def test_two_ranks_walk_their_shares_of_the_validation_rows_into_one_table(tmp_path):
    """Each rank walks every other held-out row (3 per domain: 2 on rank 0, 1 on rank 1) and the counts are
    summed: the table is the one a single rank walks over all rows (the learning rate is 0, so both runs hold
    the same drafter)."""
    same = ["model.val_walk=true", "model.optimizer.lr=0.0", "data.val_prompts=3", "trainer.max_steps=2",
            "trainer.val_check_interval=2"]
    _train(tmp_path / "two", *FSDP_CPU, "trainer.devices=2", "data.batch_size=2", *same)
    _train(tmp_path / "one", "trainer=cpu", "data.batch_size=4", *same)
    one = json.loads((tmp_path / "one" / "metrics.json").read_text())
    two = json.loads((tmp_path / "two" / "metrics.json").read_text())
    walk = {k: v for k, v in one.items() if k.startswith("walk/")}
    assert len(walk) > 10 and {k: two[k] for k in walk} == walk


def test_a_validation_batch_is_shared_out_row_by_row_and_a_rank_without_rows_counts_nothing():
    from dmtp.training.validation import empty_walk, merged_walk, walk_share

    shares = [walk_share(3, rank, 2) for rank in range(2)]
    assert [(s.tolist(), counts) for s, counts in shares] == [([0, 2], True), ([1], True)]
    assert [(s.tolist(), counts) for s, counts in (walk_share(1, r, 2) for r in range(2))] == [([0], True), ([0], False)]
    walked = {"walk_tokens": 7, "walk_rounds": 3, "anchor_tokens": 9, "anchor_count": 4,
              "hist": torch.tensor([1, 2, 0]), "per_request": [[1, 2]]}
    walked["mtp_chain"] = dict(walked)
    nothing = empty_walk(walked)
    both, alone = merged_walk([walked, nothing]), merged_walk([walked])
    assert torch.equal(both.pop("hist"), alone.pop("hist")) and both == alone == {
        "walk_tokens": 7, "walk_rounds": 3, "anchor_tokens": 9, "anchor_count": 4}
    chain = nothing["mtp_chain"]
    assert chain["walk_rounds"] == 0 and torch.equal(chain["hist"], torch.zeros(3, dtype=torch.long))


def test_decode_eval_with_a_sharded_target_is_refused_before_anything_runs(tmp_path):
    from dmtp.training.job import train

    cfg = compose_train([*FSDP_CPU, "trainer.strategy.shard_target=true", "decode_eval.enabled=true",
                         f"paths.output_dir={tmp_path / 'run'}"])
    with pytest.raises(ValueError, match=r"^decode_eval.enabled=true decodes through the whole target on rank 0"):
        train(cfg)
    assert not (tmp_path / "run").exists()
