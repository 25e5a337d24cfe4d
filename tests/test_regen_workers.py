"""Regeneration shared out over W workers (`python -m dmtp.prepare step=regen workers=W worker=i`,
dmtp.datagen.regenerate.write_share): 2 worker processes write the very bytes 1 worker writes (sampled, so each
shard's own seed is what makes them equal), the command shares out every cache the run reads and its merge step
verifies the result and names what is missing, and a worker killed mid-shard loses only that shard."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dmtp.configs import compose_config
from dmtp.training.prepare import prepare
from dmtp.datagen.regenerate import RegenSettings, cache_dir_for, regen_manifest, write_share
from dmtp.datagen.shards import Share

ROOT = Path(__file__).resolve().parents[1]
DIST_ENV = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE")
# 16 sampled responses in shards of 4 prompts: 4 shards of the training rows, worker i of 2 writes i and i + 2.
OPTIONS = ["debug=tiny_budget", "logger=none", "callbacks=none", "data=regenerated", "data.regen_sequences=16",
           "data.regen_shard_size=4", "data.regen_temperature=1.0", "data.regen_top_k=50"]


def _env(home: Path) -> dict:
    return {k: v for k, v in os.environ.items() if k not in DIST_ENV} | {
        "OMP_NUM_THREADS": "1", "DMTP_HOME": str(home), "PYTHONPATH": str(ROOT)}


def _shards(home: Path) -> dict[str, bytes]:
    """Every regeneration shard under `home` by cache directory and name (the same target path, prompts and
    settings: the same directory names under any DMTP_HOME)."""
    return {f"{p.parent.name}/{p.name}": p.read_bytes() for p in sorted((home / "cache").glob("regen-*/shard-*"))}


WORKER = """
import json, sys
from dmtp.models.target import TargetModel
from dmtp.datagen.regenerate import RegenSettings, write_share
from dmtp.datagen.shards import Share

target_dir, root, worker = sys.argv[1], sys.argv[2], int(sys.argv[3])
settings = RegenSettings(new_tokens=8, temperature=1.0, top_k=50, seed=5, batch_size=2, shard_size=2)
report = write_share(TargetModel.from_pretrained(target_dir), json.loads(sys.argv[4]), settings, Share(2, worker),
                     cache_root=root, progress=False)
print(json.dumps(report.decoded))
"""


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(5, 500, (6,), generator=gen).tolist() for _ in range(8)]   # 4 shards of 2


def test_two_worker_processes_write_the_bytes_of_one(micro_target, micro_target_dir, tmp_path):
    prompts = _prompts()
    root = tmp_path / "two"
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(micro_target_dir), str(root), str(i),
                               json.dumps(prompts)], env=_env(tmp_path / "home"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    assert [json.loads(o[0]) for o in outs] == [[0, 2], [1, 3]]
    settings = RegenSettings(new_tokens=8, temperature=1.0, top_k=50, seed=5, batch_size=2, shard_size=2)
    one = write_share(micro_target, prompts, settings, Share(), cache_root=tmp_path / "one", progress=False)
    assert one.decoded == [0, 1, 2, 3]
    two = {p.name: p.read_bytes() for p in sorted((root / one.cache.name).glob("shard-*"))}
    assert len(two) == 4 and two == {p.name: p.read_bytes() for p in sorted(one.cache.glob("shard-*"))}


def test_the_prepare_command_shares_out_every_cache_and_merge_names_what_is_missing(micro_target_dir, tmp_path,
                                                                                    monkeypatch):
    options = OPTIONS + [f"target.path={micro_target_dir}"]

    def step(home, *args):
        monkeypatch.setenv("DMTP_HOME", str(tmp_path / home))
        return prepare(compose_config("prepare", [*args, *options], output_dir=tmp_path / "runs" / "_".join(args)))

    reports = [step("two", "step=regen", "workers=2", f"worker={i}")["regen"] for i in range(2)]
    assert [[r.decoded for r in worker] for worker in reports] == [[[0, 2], [0], [0], [0]], [[1, 3], [], [], []]]
    step("one", "step=regen")
    assert _shards(tmp_path / "two") == _shards(tmp_path / "one") and len(_shards(tmp_path / "one")) == 4 + 3

    merged = step("two", "step=merge", "workers=2")
    assert [m["rows"] for m in merged["regen"]] == [16, 2, 2, 2]
    train_cache = reports[0][0].cache
    assert json.loads((train_cache / "manifest.json").read_text())["rows"] == 16
    (train_cache / "shard-00003.safetensors").unlink()
    with pytest.raises(ValueError, match=r"lacks shard 3 \(worker 1 of 2\): run python -m dmtp.prepare step=regen"):
        step("two", "step=merge", "workers=2")


HANGING_WORKER = """
import json, sys, time
import torch
from dmtp.models.target import TargetModel
from dmtp.datagen import regenerate as regen
from dmtp.datagen.regenerate import RegenSettings, write_share
from dmtp.datagen.shards import Share

target_dir, root, marker = sys.argv[1:4]
prompts = json.loads(sys.argv[4])
settings = RegenSettings(new_tokens=8, temperature=1.0, seed=5, batch_size=2, shard_size=2)
make = regen.make_writer

class HangsOnItsSecondShard:   # decodes its first shard, then hangs half-way through its second one
    def __init__(self, *args):
        self.writer, self.calls = make(*args), 0

    def generate(self, prompts, **kwargs):
        self.calls += 1
        if self.calls == 2:
            self.writer.generate(prompts[:1], **kwargs)
            open(marker, "w").close()
            time.sleep(600)
        return self.writer.generate(prompts, **kwargs)

regen.make_writer = HangsOnItsSecondShard
write_share(TargetModel.from_pretrained(target_dir), prompts, settings, Share(2, 0), cache_root=root, progress=False)
"""


def test_a_worker_killed_mid_shard_loses_only_that_shard(micro_target, micro_target_dir, tmp_path):
    prompts = _prompts()
    settings = RegenSettings(new_tokens=8, temperature=1.0, seed=5, batch_size=2, shard_size=2)
    root, marker = tmp_path / "cache", tmp_path / "hanging"
    worker = subprocess.Popen([sys.executable, "-c", HANGING_WORKER, str(micro_target_dir), str(root), str(marker),
                               json.dumps(prompts)], env=_env(tmp_path / "home"), stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not marker.exists():
        assert worker.poll() is None and time.monotonic() < deadline, worker.stderr.read()[-2000:]
        time.sleep(0.2)
    os.kill(worker.pid, signal.SIGKILL)                              # mid-way through its shard 2
    worker.wait()
    cache = cache_dir_for(micro_target, prompts, settings, [micro_target.config.eos_token_id], root)
    assert sorted(p.name for p in cache.glob("shard-*")) == ["shard-00000.safetensors"]
    kept = (cache / "shard-00000.safetensors").stat().st_mtime_ns

    other = write_share(micro_target, prompts, settings, Share(2, 1), cache_root=root, progress=False)
    assert other.decoded == [1, 3]                                   # the other worker was never concerned
    again = write_share(micro_target, prompts, settings, Share(2, 0), cache_root=root, progress=False)
    assert again.decoded == [2]                                      # the lost work: the one shard it was writing
    assert (cache / "shard-00000.safetensors").stat().st_mtime_ns == kept
    whole = write_share(micro_target, prompts, settings, Share(), cache_root=tmp_path / "whole", progress=False)
    assert whole.decoded == [0, 1, 2, 3]
    for index in range(4):
        name = f"shard-{index:05d}.safetensors"
        assert (cache / name).read_bytes() == (whole.cache / name).read_bytes()
    assert regen_manifest(micro_target, prompts, settings, cache_root=root)["rows"] == 8


def test_a_worker_index_outside_the_workers_is_one_line():
    with pytest.raises(ValueError, match=r"worker must be an integer in 0..1 \(one of workers=2\), got 2"):
        Share(2, 2)
    with pytest.raises(ValueError, match="workers must be an integer >= 1"):
        Share(0, 0)


@pytest.mark.parametrize("args,says", [(["step=shuffle"], "step must be one of regen, capture, merge, got 'shuffle'"),
                                       (["step=regen", "workers=2", "worker=2"], "worker must be an integer in 0..1"),
                                       (["step=merge"], "the regeneration cache")])
def test_prepare_refuses_bad_input_in_one_line(args, says, tmp_path, monkeypatch, capsys, micro_target_dir):
    from cli_runner import run_command

    monkeypatch.setenv("DMTP_HOME", str(tmp_path / "home"))
    code, line, _ = run_command("dmtp.prepare", [*args, *OPTIONS, f"target.path={micro_target_dir}"], tmp_path / "run",
                                monkeypatch, capsys)
    assert code == 2 and line.startswith("dmtp.prepare: error: ") and says in line, line
