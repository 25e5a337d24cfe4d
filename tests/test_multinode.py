"""Several nodes, tested on one host: the production trainer (trainer=fsdp) launched as 2 nodes x 1 CPU rank on
127.0.0.1 the way a cluster launches it by hand (the same command on each node, Lightning's `trainer.num_nodes`,
NODE_RANK, MASTER_ADDR, MASTER_PORT), fed from the offline feature cache (the target's decoder never loaded),
checkpoints, resumes on 1 node, and trains exactly what one node trains on the same global batch."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from dmtp.configs import compose_config
from dmtp.training.job import train
from dmtp.training.prepare import prepare

ROOT = Path(__file__).resolve().parents[1]
DIST_ENV = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE",
            "SLURM_PROCID")
# test_fsdp.py's run: constant learning rate, every step clipped, checkpoints every 2 steps; here from the cache.
COMMON = ["debug=tiny_budget", "injection=dual_anchor_zero_init", "recipe=greedy", "logger=csv",
          "~callbacks.lr_monitor", "trainer.precision=32-true",
          "trainer.gradient_clip_val=0.05", "model.scheduler=null", "data.max_examples=40", "model.val_walk=false",
          "trainer.val_check_interval=4", "trainer.max_steps=4", "callbacks.model_checkpoint.every_n_train_steps=2",
          "callbacks.model_checkpoint.save_top_k=-1", "data.features=true", "data.feature_codec=fp32"]
FSDP_CPU = ["trainer=fsdp", "trainer.accelerator=cpu", "trainer.devices=1"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(home: Path, **extra) -> dict:
    return {k: v for k, v in os.environ.items() if k not in DIST_ENV} | {
        "OMP_NUM_THREADS": "1", "DMTP_HOME": str(home), "PYTHONPATH": str(ROOT), **extra}


def _train(args, env, cwd) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "dmtp.train", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _done(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return out


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


@pytest.mark.slow
def test_two_nodes_train_checkpoint_and_resume_on_one_node_as_one_node(tmp_path, micro_target_dir, monkeypatch):
    home = tmp_path / "home"
    common = COMMON + [f"target.path={micro_target_dir}"]
    monkeypatch.setenv("DMTP_HOME", str(home))
    prepare(compose_config("prepare", ["step=capture", *common], output_dir=tmp_path / "capture"))

    run = tmp_path / "two_nodes"
    port = str(_free_port())
    nodes = [_train([*common, *FSDP_CPU, "trainer.num_nodes=2", "data.batch_size=2", f"hydra.run.dir={run}"],
                    _env(home, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, NODE_RANK=str(rank)), tmp_path)
             for rank in range(2)]
    outs = [_done(p) for p in nodes]
    assert [o.count("exported to") for o in outs] == [1, 0]            # global rank 0 (node 0) alone exports
    two = load_file(run / "drafter" / "model.safetensors")
    shutil.copytree(run / "drafter", tmp_path / "two_export")

    train(compose_config("train", [*common, "trainer=cpu", "data.batch_size=4"], output_dir=tmp_path / "one_node"))
    one = load_file(tmp_path / "one_node" / "drafter" / "model.safetensors")
    assert _max_diff(two, one) < 1e-5                                  # 2 nodes x batch 2 == 1 node x batch 4

    # The 2-node checkpoint of step 2 continues on one node (the same global batch) to the same drafter.
    _done(_train([*common, *FSDP_CPU, "trainer.num_nodes=1", "data.batch_size=4",
                  f"ckpt_path={run / 'checkpoints' / 'step000002.ckpt'}"], _env(home), tmp_path))
    resumed = load_file(run / "drafter" / "model.safetensors")          # a continued run stays in its directory
    assert _max_diff(resumed, one) < 1e-5
    assert _max_diff(resumed, load_file(tmp_path / "two_export" / "model.safetensors")) < 1e-5


def test_the_rank_before_the_trainer_counts_the_node(monkeypatch):
    from dmtp.configs import compose_train
    from dmtp.training.job import process_rank

    for key in DIST_ENV:
        monkeypatch.delenv(key, raising=False)
    cfg = compose_train(["trainer=fsdp", "trainer.devices=2", "trainer.num_nodes=2"], tiny=False)
    assert process_rank(cfg) == 0
    monkeypatch.setenv("NODE_RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert process_rank(cfg) == 3                                      # node 1's second device
