"""Faults of the machine never cost a good checkpoint: a save killed mid-write or stopped by a full disk
leaves the previous checkpoint intact (and no temporary after the next start), a full disk is one line
(exit status 1) naming the file, and `resume=<run dir>` continues the run from itself: its newest
checkpoint that loads, its own config, and only the options a resume may change."""
from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cli_runner import run_command
from dmtp.configs import compose_train
from dmtp.training.job import train

QUIET = ["model.val_walk=false", "trainer.enable_progress_bar=false"]
# A micro run checkpointing every step, as a user would start it (no .hydra record: the run must carry its config).
MICRO_RUN = ["debug=tiny_budget", "logger=none", "callbacks=default", "~callbacks.lr_monitor",
             "callbacks.model_checkpoint.every_n_train_steps=1", "data.max_examples=40", *QUIET]


def train_cli(args, run_dir, monkeypatch, capsys):
    return run_command("dmtp.train", args, run_dir, monkeypatch, capsys)


def _step_of(ckpt: Path) -> int:
    return torch.load(ckpt, weights_only=True)["global_step"]


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs whose size the test sets (`resize`), or None where this process cannot mount one."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    mounted = os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)],
                                                   capture_output=True).returncode == 0
    yield mnt if mounted else None
    if mounted:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _resize(mnt: Path, size: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(mnt)], check=True, capture_output=True)


def _used(mnt: Path) -> int:
    stat = os.statvfs(mnt)
    return (stat.f_blocks - stat.f_bfree) * stat.f_frsize


class _FullDiskFile:
    """A file whose writes stop half-way with ENOSPC (where no tmpfs can be mounted)."""

    def __init__(self, f):
        self.f = f

    def write(self, data):
        self.f.write(bytes(data)[:len(data) // 2])
        raise OSError(28, os.strerror(28))

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def test_a_full_disk_is_one_line_and_the_last_good_checkpoint_survives(small_disk, tmp_path, monkeypatch, capsys):
    run_dir = (small_disk or tmp_path) / "run"
    code, _, _ = train_cli([*MICRO_RUN, "trainer.max_steps=1"], run_dir, monkeypatch, capsys)
    last = run_dir / "checkpoints" / "last.ckpt"
    assert code == 0 and _step_of(last) == 1
    good = last.read_bytes()
    if small_disk is not None:   # room for less than one more checkpoint
        _resize(small_disk, _used(small_disk) + len(good) // 2)
    else:   # the checkpoints' disk is full
        import dmtp.atomic_io as atomic_io

        def full_disk_open(file, *args, **kwargs):
            f = open(file, *args, **kwargs)
            return _FullDiskFile(f) if Path(file).parent == last.parent else f

        monkeypatch.setattr(atomic_io, "open", full_disk_open, raising=False)
    resume = [*MICRO_RUN, f"resume={run_dir}", "trainer.max_steps=3"]
    code, line, _ = train_cli(resume, tmp_path / "unused", monkeypatch, capsys)
    assert code == 1, line
    # The one wording of an environment fault (dmtp.errors.fault_line), dmtp's own writes included.
    assert line == (f"dmtp.train: error: disk full writing {run_dir / 'checkpoints' / 'step000002.ckpt'} "
                    f"({os.strerror(errno.ENOSPC)}); the previous step000002.ckpt, if any, is left as it was; "
                    "free space or fix the filesystem and rerun")
    assert last.read_bytes() == good
    assert not [p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".")]
    if small_disk is not None:
        _resize(small_disk, 64 << 20)
    else:
        monkeypatch.undo()
    code, _, _ = train_cli(resume, tmp_path / "unused", monkeypatch, capsys)
    assert code == 0 and _step_of(last) == 3


KILLED_SAVE = """
import os, signal, sys, torch
import dmtp.atomic_io as atomic_io
from dmtp.runs.checkpoint_io import AtomicCheckpointIO

class Dying:   # writes half of the file, then the process is killed (no cleanup runs)
    def __init__(self, f): self.f = f
    def write(self, data):
        self.f.write(bytes(data)[:len(data) // 2]); self.f.flush(); os.kill(os.getpid(), signal.SIGKILL)
    def __getattr__(self, name): return getattr(self.f, name)
    def __enter__(self): return self
    def __exit__(self, *exc): self.f.close()

state = torch.load(sys.argv[1], weights_only=True)
state["global_step"] += 1
atomic_io.open = lambda *a, **k: Dying(open(*a, **k))
AtomicCheckpointIO().save_checkpoint(state, sys.argv[1])
"""


def test_a_save_killed_mid_write_leaves_the_checkpoint_and_the_next_start_cleans_up(tmp_path, capsys):
    run_dir = tmp_path / "run"
    train(compose_train(MICRO_RUN + ["trainer.max_steps=2"], output_dir=run_dir))
    last = run_dir / "checkpoints" / "last.ckpt"
    good = last.read_bytes()
    killed = subprocess.run([sys.executable, "-c", KILLED_SAVE, str(last)], capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert last.read_bytes() == good
    left = [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".last.ckpt.tmp-")]
    assert len(left) == 1 and 0 < left[0].stat().st_size < len(good)
    summary = train(compose_train(MICRO_RUN + [f"resume={run_dir}", "trainer.max_steps=3"]))
    assert summary["global_step"] == 3 and not left[0].exists()
    assert "skipped" not in capsys.readouterr().out


def test_resume_uses_the_newest_checkpoint_that_loads_and_names_the_one_it_skipped(tmp_path, capsys):
    run_dir = tmp_path / "run"
    train(compose_train(MICRO_RUN + ["trainer.max_steps=2"], output_dir=run_dir))
    last, step2 = run_dir / "checkpoints" / "last.ckpt", run_dir / "checkpoints" / "step000002.ckpt"
    with open(last, "r+b") as f:   # damaged outside dmtp (another tool, a disk fault)
        f.truncate(os.path.getsize(last) // 3)
    os.utime(last)   # and newer than every other checkpoint
    capsys.readouterr()
    summary = train(compose_train(MICRO_RUN + [f"resume={run_dir}", "trainer.max_steps=3"]))
    out = [line for line in capsys.readouterr().out.splitlines() if "skipped" in line]
    assert out == [f"[dmtp] resume: skipped last.ckpt, which is not a readable Lightning checkpoint written by dmtp "
                   f"(PytorchStreamReader failed reading zip archive: failed finding central directory); resuming "
                   f"from {step2}"]
    assert summary["global_step"] == 3 and _step_of(last) == 3


def test_resume_from_the_run_alone_restores_its_config_and_refuses_what_would_change_it(tmp_path, monkeypatch,
                                                                                         capsys):
    import dmtp.tiny.targets as targets

    def only_micro(preset, *args, **kwargs):
        raise AssertionError(f"a resumed micro run built the {preset} target")

    monkeypatch.setattr(targets, "build_tiny_target", only_micro)
    run_dir = tmp_path / "run"
    code, _, _ = train_cli([*MICRO_RUN, "trainer.max_steps=2"], run_dir, monkeypatch, capsys)
    assert code == 0
    # As the README shows it: resume=<run dir> and nothing else (today's defaults are the tiny target).
    code, line, out = train_cli([f"resume={run_dir}"], tmp_path / "unused", monkeypatch, capsys)
    assert code == 0, line
    metrics = (run_dir / "train_metrics.json").read_text()
    assert "micro-" in metrics and f"exported to {run_dir / 'drafter'}" in out
    # What a resume may change: the run's length, its logger and progress.
    code, line, _ = train_cli([f"resume={run_dir}", "trainer.max_steps=3", "logger=csv",
                               "trainer.enable_progress_bar=false"], tmp_path / "unused", monkeypatch, capsys)
    assert code == 0 and _step_of(run_dir / "checkpoints" / "last.ckpt") == 3
    # What would make it another run: one line, nothing run.
    before = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    for override, key, change in [("target=tiny", "target.preset", "'micro' -> 'tiny'"),
                                  ("model.loss_gamma=2.0", "model.loss_gamma", "4.0 -> 2.0"),
                                  ("seed=1", "seed", "0 -> 1"),
                                  ("injection=raw_dflash", "injection._target_", "")]:
        code, line, _ = train_cli([f"resume={run_dir}", override], tmp_path / "unused", monkeypatch, capsys)
        assert code == 2 and line.startswith(f"dmtp.train: error: resume={run_dir}: {override} would change the run's "
                                             f"{key} ({change}"), line
        assert "a resumed run keeps its model, data and seed (it may change only trainer.max_steps" in line
    # A preset of the global package sets keys all over the config: named itself, with the first key it changes.
    code, line, _ = train_cli([f"resume={run_dir}", "debug=fdr"], tmp_path / "unused", monkeypatch, capsys)
    assert code == 2 and line.startswith(f"dmtp.train: error: resume={run_dir}: debug=fdr would change the run's "), line
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == before
    # An option that repeats the run's own value is no change.
    code, line, _ = train_cli([f"resume={run_dir}", "target=micro", "seed=0"], tmp_path / "unused", monkeypatch, capsys)
    assert code == 0, line


def test_a_run_from_before_the_config_record_resumes_from_hydras_record(tmp_path):
    from omegaconf import OmegaConf

    from dmtp.runs.recorded_config import RECORD_KEY, recorded_config

    with pytest.raises(ValueError, match=f"resume={tmp_path}: the run records no config .*ckpt_path="):
        recorded_config(tmp_path, {"state_dict": {}})
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text("seed: 3\ntarget:\n  preset: micro\n")
    assert OmegaConf.to_container(recorded_config(tmp_path, {})) == {"seed": 3, "target": {"preset": "micro"}}
    assert recorded_config(tmp_path, {RECORD_KEY: "seed: 5\n"}).seed == 5   # the checkpoint's own record first


def test_a_run_recorded_before_an_entry_point_moved_resumes_with_the_new_one(tmp_path):
    """conf/target's loader moved from dmtp.models.target to dmtp.tiny.targets (issue 26): a run that recorded
    the old name resumes with the new one, which exists, and compares equal to today's config."""
    import importlib

    from dmtp.runs.recorded_config import RECORD_KEY, recorded_config

    old = "seed: 5\ntarget:\n  _target_: dmtp.models.target.load_target\n  preset: micro\n"
    restored = recorded_config(tmp_path, {RECORD_KEY: old})
    module, _, name = restored.target._target_.rpartition(".")
    assert restored.target._target_ == "dmtp.tiny.targets.load_target" and restored.target.preset == "micro"
    assert callable(getattr(importlib.import_module(module), name))


def test_every_moved_entry_point_exists_and_a_run_recorded_before_the_data_records_resumes(tmp_path):
    """The data module's Hydra entry became `data_module` (its flat options grouped into records, issue 35): a
    run recorded with `DraftDataModule` and flat options builds its data module again."""
    import importlib

    from omegaconf import OmegaConf

    from dmtp.configs import compose_train, instantiate
    from dmtp.training.datamodule import DraftDataModule
    from dmtp.runs.recorded_config import MOVED_TARGETS, RECORD_KEY, recorded_config

    for new in MOVED_TARGETS.values():
        module, _, name = new.rpartition(".")
        assert callable(getattr(importlib.import_module(module), name)), new
    data = OmegaConf.to_container(compose_train([]).data, resolve=True)
    data["_target_"] = "dmtp.training.datamodule.DraftDataModule"
    restored = recorded_config(tmp_path, {RECORD_KEY: OmegaConf.to_yaml({"seed": 5, "data": data})})
    assert restored.data._target_ == "dmtp.training.datamodule.data_module"
    built = instantiate(restored.data)(tokenizer=None, target=None)
    assert type(built) is DraftDataModule and built.loader.seq_len == data["seq_len"]


# A 2-rank FSDP run whose rank 0 is killed (SIGKILL, no cleanup) half-way through writing its step-2 checkpoint.
KILLED_AT_STEP_2 = """
import os, signal, sys
import dmtp.atomic_io as atomic_io

class Dying:
    def __init__(self, f): self.f = f
    def write(self, data):
        self.f.write(bytes(data)[:len(data) // 2]); self.f.flush(); os.kill(os.getpid(), signal.SIGKILL)
    def __getattr__(self, name): return getattr(self.f, name)
    def __enter__(self): return self
    def __exit__(self, *exc): self.f.close()

def dying_open(file, *args, **kwargs):
    f = open(file, *args, **kwargs)
    return Dying(f) if os.path.basename(str(file)).startswith(".step000002.ckpt.tmp-") else f

atomic_io.open = dying_open
from dmtp.threads import claim_process
from dmtp.train import main
claim_process()
main()
"""
FSDP_RUN = ["debug=tiny_budget", "logger=none", "callbacks=default", "~callbacks.lr_monitor",
            "callbacks.model_checkpoint.every_n_train_steps=1", "callbacks.model_checkpoint.save_top_k=-1",
            "data.max_examples=40", "data.val_domains=[]", "model.val_walk=false", "trainer.enable_progress_bar=false",
            "trainer.precision=32-true", "trainer=fsdp", "trainer.accelerator=cpu", "data.batch_size=2",
            "trainer.max_steps=3"]
DIST_ENV = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE")


@pytest.mark.slow
def test_a_two_rank_fsdp_run_killed_mid_checkpoint_resumes_at_one_rank(tmp_path, micro_target_dir):
    """Rank 0 dies writing step 2's checkpoint (its other rank is killed with it, as a scheduler would): the step-1
    checkpoint is whole, the half-written temporary is the only trace, and `resume=<run>` on one rank continues
    from step 1, says so in one line, removes the temporary and finishes the run."""
    run_dir = tmp_path / "run"
    script = tmp_path / "killed_at_step_2.py"
    script.write_text(KILLED_AT_STEP_2)
    # A cache of its own (the targets shared): both ranks meet at its lock, and no other run on the machine does.
    home = tmp_path / "home"
    home.mkdir()
    os.symlink(micro_target_dir.parent, home / "targets")
    env = {k: v for k, v in os.environ.items() if k not in DIST_ENV} | {"OMP_NUM_THREADS": "1", "DMTP_HOME": str(home),
                                                                         "HYDRA_MAIN_MODULE": "__main__"}
    log = tmp_path / "killed.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, str(script), *FSDP_RUN, "trainer.devices=2",
                                 f"hydra.run.dir={run_dir}"], stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            proc.wait(timeout=300)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)   # rank 1 goes with it (its own session: nothing else)
            except ProcessLookupError:
                pass
    assert proc.returncode == -signal.SIGKILL, log.read_text()[-3000:]
    waits = [s for s in log.read_text().splitlines() if "waiting for" in s]   # a rank waits for its other rank
    assert all("[dmtp] waiting for this run's rank (pid " in s for s in waits), waits
    checkpoints = run_dir / "checkpoints"
    left = sorted(p.name for p in checkpoints.iterdir())
    assert left[0].startswith(".step000002.ckpt.tmp-") and left[1:] == ["last.ckpt", "step000001.ckpt"], left
    assert _step_of(checkpoints / "last.ckpt") == 1 and not (run_dir / "drafter").exists()

    env.pop("HYDRA_MAIN_MODULE")
    resumed = subprocess.run([sys.executable, "-m", "dmtp.train", f"resume={run_dir}", "trainer.devices=1"],
                             capture_output=True, text=True, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    line = [s for s in resumed.stdout.splitlines() if s.startswith("[dmtp] resume:")]
    assert line == [f"[dmtp] resume: continuing from {checkpoints / 'last.ckpt'} (step 1) with the run's recorded "
                    "config; changed now: trainer.devices 2 -> 1"], resumed.stdout[-3000:]
    assert sorted(p.name for p in checkpoints.iterdir()) == ["last.ckpt", "step000001.ckpt", "step000002.ckpt",
                                                             "step000003.ckpt"]
    assert _step_of(checkpoints / "last.ckpt") == 3 and (run_dir / "drafter" / "model.safetensors").is_file()


def _dspark_export(target, target_dir, path: Path) -> Path:
    """A raw DSpark drafter exported in vLLM's layout (markov_head.*, confidence_head.proj.*), trained for
    `target_dir`."""
    from dmtp.drafters.block_drafter import fresh_drafter_for

    fresh_drafter_for(target, "raw_dflash", 3, backbone={"architecture": "dspark"}).save(path, target=str(target_dir))
    return path


def _edit_tensors(path: Path, edit) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(path / "model.safetensors"))


def _edit_config(path: Path, both: bool = False, **changes) -> None:
    """config.json's top level changed (`both`: its dflash_config too)."""
    import json

    config = json.loads((path / "config.json").read_text())
    if both:
        config["dflash_config"] = {**config["dflash_config"], **changes}
    (path / "config.json").write_text(json.dumps({**config, **changes}))


def _truncate(path: Path) -> None:
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[:len(data) // 2])


def _nan(tensors):
    tensors["confidence_head.proj.weight"][0, 0] = float("nan")


def _narrow(tensors):
    tensors["markov_head.markov_w1.weight"] = tensors["markov_head.markov_w1.weight"][:, :5].contiguous()


CORRUPTED_DSPARK = {
    "truncated": (_truncate, "model.safetensors is not a readable safetensors file"),
    "markov tensor missing": (lambda p: _edit_tensors(p, lambda t: t.pop("markov_head.markov_w2.weight")),
                              "model.safetensors: missing drafter tensor markov_head.markov_w2.weight"),
    "markov rank changed": (lambda p: _edit_tensors(p, _narrow),
                            "model.safetensors: tensor markov_head.markov_w1.weight has shape (512, 5), expected "
                            "(512, 32)"),
    "confidence head NaN": (lambda p: _edit_tensors(p, _nan), "model.safetensors: tensor confidence_head.proj.weight "
                                                              "has non-finite values"),
    # vLLM reads DSpark's fields at config.json's top level, dmtp reads dflash_config first: they must agree
    "top level contradicts dflash_config": (lambda p: _edit_config(p, markov_rank=7),
                                            "config.json: markov_rank is 7 at the top level but 32 in dflash_config"),
    "unknown markov head": (lambda p: _edit_config(p, both=True, markov_head_type="lstm"),
                            "markov_head_type must be one of vanilla, gated, rnn, got 'lstm'"),
}


@pytest.mark.parametrize("damage", list(CORRUPTED_DSPARK))
def test_a_corrupted_dspark_export_is_one_line_and_nothing_is_written(damage, tmp_path, micro_target, micro_target_dir,
                                                                      monkeypatch, capsys):
    from cli_runner import infer_cli

    corrupt, said = CORRUPTED_DSPARK[damage]
    drafter = _dspark_export(micro_target, micro_target_dir, tmp_path / "dspark")
    corrupt(drafter)
    files = {p.name: p.read_bytes() for p in drafter.iterdir()}
    code, line, _ = infer_cli([f"target.path={micro_target_dir}", f"drafter={drafter}", "methods=[ar,drafter]",
                               "num_prompts=1", "eval.domains=[code]", "max_new_tokens=4", "eval.prompt_tokens=8",
                               "confidence_threshold=0.5"], tmp_path / "run", monkeypatch, capsys)
    assert code == 2 and line.startswith("dmtp.infer: error: ") and said in line, line
    assert not (tmp_path / "run" / "metrics.json").exists()
    assert {p.name: p.read_bytes() for p in drafter.iterdir()} == files   # its card included


def test_results_against_another_target_than_the_drafters_say_so_with_the_table(tmp_path, micro_target,
                                                                                  micro_target_dir, monkeypatch,
                                                                                  capsys):
    """The drafter recorded a target whose digests differ from the one decoded now (another config.json; the same
    config.json with another MTP): the warning line is printed with the results table (table.txt) and recorded in
    metrics.json as run.target_mismatch; against its own target, null."""
    import json

    from safetensors.torch import load_file, save_file

    from cli_runner import infer_cli
    from dmtp.drafters.block_drafter import fresh_drafter_for

    def other_target(name, config_note=None, mtp_nudge=False):
        other = tmp_path / name
        other.mkdir()
        for f in micro_target_dir.iterdir():
            if not (config_note and f.name == "config.json") and not (mtp_nudge and f.name == "mtp.safetensors"):
                os.symlink(f, other / f.name)
        if config_note:
            config = json.loads((micro_target_dir / "config.json").read_text())
            (other / "config.json").write_text(json.dumps({**config, "note": config_note}))
        if mtp_nudge:
            tensors = load_file(str(micro_target_dir / "mtp.safetensors"))
            first = sorted(tensors)[0]
            tensors[first] = tensors[first] + 1e-3
            save_file(tensors, str(other / "mtp.safetensors"))
        return other

    for other, digest in [(other_target("finetuned", config_note="fine-tuned"), "config.json sha256 "),
                          (other_target("retrained_mtp", mtp_nudge=True), "MTP sha256 mtp.safetensors "),
                          (micro_target_dir, None)]:
        drafter = tmp_path / f"drafter_{other.name}"
        fresh_drafter_for(micro_target, "dual_anchor_zero_init", 3).save(drafter, target=str(other))
        run = tmp_path / f"run_{other.name}"
        code, line, out = infer_cli([f"target.path={micro_target_dir}", f"drafter={drafter}", "methods=[ar,drafter]",
                                     "num_prompts=1", "eval.domains=[code]", "max_new_tokens=4",
                                     "eval.prompt_tokens=8"], run, monkeypatch, capsys)
        assert code == 0, line
        recorded = json.loads((run / "metrics.json").read_text())["run"]["target_mismatch"]
        if digest is None:
            assert recorded is None and "warning" not in out
            continue
        assert recorded.startswith(f"[dmtp] warning: drafter {drafter} was trained for {other} ({digest}"), recorded
        assert f"but decodes against {micro_target_dir}" in recorded
        assert (run / "table.txt").read_text().splitlines()[-1] == recorded
        assert out.splitlines().count(recorded) == 2   # when it loads, and with the table


def test_a_regeneration_cache_begun_by_two_workers_is_finished_by_three(micro_target, tmp_path, capsys):
    """A shard belongs to the cache, not to the worker count that wrote it (its prompts and seed come from its
    index): a cache half-written with workers=2 is finished with workers=3, each new worker keeping the shards
    already there and decoding only the rest; a kept shard that was damaged meanwhile is decoded again by its new
    owner; the merge names what is missing by the new count's owners; the result is one worker's bytes."""
    from dmtp.datagen.regenerate import RegenSettings, regen_manifest, write_share
    from dmtp.datagen.shards import Share

    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(5, 500, (6,), generator=gen).tolist() for _ in range(12)]   # 6 shards of 2
    settings = RegenSettings(new_tokens=8, temperature=1.0, top_k=50, seed=7, batch_size=2, shard_size=2)
    root = tmp_path / "cache"
    begun = write_share(micro_target, prompts, settings, Share(2, 0), cache_root=root, progress=False)
    assert begun.decoded == [0, 2, 4]
    with pytest.raises(ValueError, match=r"lacks shards 1, 3, 5 \(workers 0, 1, 2 of 3\)"):
        regen_manifest(micro_target, prompts, settings, cache_root=root, workers=3)

    damaged = begun.cache / "shard-00004.safetensors"
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 0xFF
    damaged.write_bytes(bytes(data))
    kept = {i: (begun.cache / f"shard-{i:05d}.safetensors").stat().st_mtime_ns for i in (0, 2)}
    capsys.readouterr()
    finished = [write_share(micro_target, prompts, settings, Share(3, i), cache_root=root, progress=False)
                for i in range(3)]
    assert [r.decoded for r in finished] == [[3], [1, 4], [5]]
    assert f"{damaged} is damaged" in capsys.readouterr().out
    assert {i: (begun.cache / f"shard-{i:05d}.safetensors").stat().st_mtime_ns for i in (0, 2)} == kept
    assert regen_manifest(micro_target, prompts, settings, cache_root=root, workers=3)["rows"] == 12

    whole = write_share(micro_target, prompts, settings, Share(), cache_root=tmp_path / "whole", progress=False)
    assert whole.decoded == list(range(6))
    for index in range(6):
        name = f"shard-{index:05d}.safetensors"
        assert (begun.cache / name).read_bytes() == (whole.cache / name).read_bytes(), name
