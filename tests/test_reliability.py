"""Reliability: NaN runs stop, runs never share a directory, resume is exact and in place, bad input is
one line (exit status 2) naming the option or the file, and nothing pickled is read from a user's path.

Command-line checks run `dmtp.train` / `dmtp.infer`'s real `main` in this process (the exit status and
the printed line are what a user meets) instead of paying a Python start-up per case.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from safetensors.torch import load_file, save_file

from cli_runner import infer_cli, run_command
from dmtp.configs import CONF_DIR, compose_train
from dmtp.drafters.block_drafter import fresh_drafter_for, load_block_drafter
from dmtp.drafters.checkpoint import save_drafter
from dmtp.drafters.dflash import DFlashConfig, DFlashDrafter
from dmtp.models.target import TargetModel
from dmtp.data.sources.files import read_files
from dmtp.runs.guards import NonFiniteError
from dmtp.training.components import build_components
from dmtp.training.job import train

QUIET = ["model.val_walk=false", "trainer.enable_progress_bar=false"]


def train_cli(args, run_dir, monkeypatch, capsys):
    return run_command("dmtp.train", ["debug=tiny_budget", "logger=none", "callbacks=none", "data.max_examples=40", *QUIET,
                              *args], run_dir, monkeypatch, capsys)


def _drafter_dir(target, path, name="dual_anchor_zero_init", trained_for=None):
    """`trained_for`: the target path recorded in its config, as dmtp.train records it."""
    extra = {"target": str(trained_for)} if trained_for is not None else {}
    fresh_drafter_for(target, name, 3).save(path, **extra)
    return path


class Marker:
    """A pickle that, when unpickled, creates `path`: the proof that something executed it."""

    def __init__(self, path):
        self.path = Path(path)

    def __reduce__(self):
        return Path.touch, (self.path,)


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    """A 2-step run with a checkpoint at every step: its run directory."""
    run_dir = tmp_path_factory.mktemp("short_run")
    train(compose_train(["callbacks=default", "~callbacks.lr_monitor", "callbacks.model_checkpoint.every_n_train_steps=1",
                         "trainer.max_steps=2", *QUIET], output_dir=run_dir))
    return run_dir


# ---------------------------------------------------------------------------------------------------
# loses data or lies about success
# ---------------------------------------------------------------------------------------------------

def test_nan_training_exits_non_zero_and_exports_nothing(tmp_path, monkeypatch, capsys):
    code, line, _ = train_cli(["model.optimizer.lr=inf"], tmp_path, monkeypatch, capsys)
    assert code == 2
    assert line.startswith("dmtp.train: error: training stopped at step 1: weight ") and "non-finite" in line
    assert "no checkpoint was saved before it" in line
    assert not (tmp_path / "drafter").exists() and not (tmp_path / "train_metrics.json").exists()


class PoisonAt(L.Callback):
    """Turns one trained weight into NaN before optimizer step `step` (1-based)."""

    def __init__(self, step):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step + 1 == self.step:
            with torch.no_grad():
                next(p for p in pl_module.drafter.parameters()).fill_(float("nan"))


def test_nan_loss_names_the_step_and_the_last_good_checkpoint(tmp_path):
    cfg = compose_train(["callbacks=default", "~callbacks.lr_monitor", "callbacks.model_checkpoint.every_n_train_steps=1",
                         *QUIET], output_dir=tmp_path)
    with pytest.raises(NonFiniteError, match=r"stopped at step 3: the loss is nan") as err:
        train(cfg, callbacks=[PoisonAt(3)])
    good = tmp_path / "checkpoints" / "last.ckpt"
    assert f"last good checkpoint: {good}" in str(err.value) and "\n" not in str(err.value)
    state = torch.load(good, weights_only=True)
    assert state["global_step"] == 2 and all(torch.isfinite(t).all() for t in state["state_dict"].values())
    assert not (tmp_path / "drafter").exists()


def test_nonfinite_drafter_is_neither_exported_nor_decoded(tmp_path, micro_target, micro_target_dir, monkeypatch,
                                                            capsys):
    drafter = fresh_drafter_for(micro_target, "dual_anchor_zero_init", 3)
    with torch.no_grad():
        drafter.backbone.fc.weight[0, 0] = float("inf")
    with pytest.raises(ValueError, match="refusing to export .* tensor fc.weight has non-finite values"):
        drafter.save(tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    # A broken drafter written by something else: dmtp.infer refuses it by name.
    good = _drafter_dir(micro_target, tmp_path / "drafter")
    tensors = load_file(str(good / "model.safetensors"))
    tensors["fc.weight"][0, 0] = float("nan")
    save_file(tensors, str(good / "model.safetensors"))
    code, line, _ = infer_cli([f"target.path={micro_target_dir}", f"drafter={good}"], tmp_path / "run", monkeypatch,
                              capsys)
    assert code == 2 and line == (f"dmtp.infer: error: drafter {good / 'model.safetensors'}: tensor fc.weight has "
                                  "non-finite values (NaN/inf); the weights are broken")


def test_runs_started_in_the_same_second_never_share_a_directory(tmp_path):
    dirs = []
    for _ in range(2):
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose("train", return_hydra_config=True)
        dirs.append((cfg.hydra.run.dir, cfg.hydra.sweep.dir))
    (run_a, sweep_a), (run_b, sweep_b) = dirs
    stamp_a, id_a = Path(run_a).name.rsplit("_", 1)
    stamp_b, id_b = Path(run_b).name.rsplit("_", 1)
    assert len(stamp_a) == len("2025-01-01_00-00-00") and id_a != id_b and run_a != run_b and sweep_a != sweep_b
    assert sweep_a.endswith(id_a)   # one id per run, whatever interpolates it
    # A directory given twice explicitly: the second run is refused and the first one's drafter stays.
    first = train(compose_train(["trainer.max_steps=1", *QUIET], output_dir=tmp_path))
    weights = (tmp_path / "drafter" / "model.safetensors").read_bytes()
    with pytest.raises(ValueError, match=f"{tmp_path} already holds another training run"):
        train(compose_train(["trainer.max_steps=1", "injection=raw_dflash", *QUIET], output_dir=tmp_path))
    assert (tmp_path / "drafter" / "model.safetensors").read_bytes() == weights and first["global_step"] == 1


class Trace(L.Callback):
    """(step, loss, batch checksum) after every optimizer step."""

    def __init__(self):
        self.steps = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.steps.append((trainer.global_step, float(outputs["loss"]), int(batch["input_ids"].sum())))


class Crash(RuntimeError):
    pass


class CrashAfter(L.Callback):
    def __init__(self, step):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            raise Crash(f"killed after step {self.step}")


def test_resume_repeats_the_uninterrupted_run_in_its_own_directory(tmp_path, recwarn):
    # 10 batches per epoch; checkpoints at 4, 8, 12; validation at 5 and 10; killed at 13 (epoch 1),
    # i.e. between checkpoints, after an epoch boundary and validations.
    common = ["callbacks=default", "~callbacks.lr_monitor", "callbacks.model_checkpoint.every_n_train_steps=4",
              "trainer.max_steps=15", "trainer.val_check_interval=5", "data.max_examples=12", *QUIET]
    whole = Trace()
    train(compose_train(common, output_dir=tmp_path / "b"), callbacks=[whole])
    killed, resumed = Trace(), Trace()
    with pytest.raises(Crash):
        train(compose_train(common, output_dir=tmp_path / "a"), callbacks=[killed, CrashAfter(13)])
    assert not (tmp_path / "a" / "drafter").exists()
    run_dir = tmp_path / "a"
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):   # Hydra puts the resumed run there too
        hydra_cfg = compose("train", [f"resume={run_dir}"], return_hydra_config=True).hydra
    assert hydra_cfg.run.dir == str(run_dir)
    summary = train(compose_train(common + [f"resume={run_dir}"], output_dir=tmp_path / "elsewhere"),
                    callbacks=[resumed])

    assert [s for s, _, _ in whole.steps] == list(range(1, 16))
    assert [s for s, _, _ in resumed.steps] == [13, 14, 15]                  # from the step-12 checkpoint
    replay = killed.steps[:12] + resumed.steps
    for (step, loss, batch), (_, ref_loss, ref_batch) in zip(replay, whole.steps, strict=True):
        assert batch == ref_batch, f"step {step}: another batch"
        assert abs(loss - ref_loss) <= 1e-6, f"step {step}: loss {loss} vs {ref_loss}"
    assert killed.steps[12] == whole.steps[12]
    assert summary["drafter"] == str(run_dir / "drafter") and (run_dir / "drafter" / "model.safetensors").exists()
    assert not (tmp_path / "elsewhere").exists()
    assert not any("not resumable" in str(w.message) for w in recwarn)
    # What cannot be resumed is one line.
    with pytest.raises(FileNotFoundError, match="no checkpoint under"):
        train(compose_train([f"resume={tmp_path / 'b' / 'drafter'}"], output_dir=tmp_path / "c"))
    with pytest.raises(ValueError, match="not both"):
        train(compose_train([f"resume={run_dir}", f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}"]))


# ---------------------------------------------------------------------------------------------------
# accepted silently before: now one-line errors (exit status 2)
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arg,message", [
    ("batch_size=-1", "batch_size must be an integer >= 1, got -1"),
    ("batch_size=0", "batch_size must be an integer >= 1, got 0"),
    ("max_new_tokens=0", "max_new_tokens must be an integer >= 1, got 0"),
    ("temperature=-1", "temperature must be >= 0 (0 = greedy), got -1"),
    ("top_p=0", "top_p must be in (0, 1] (1 = off), got 0"),
    ("top_p=1.5", "top_p must be in (0, 1] (1 = off), got 1.5"),
    ("top_k=-1", "top_k must be an integer >= 0 (0 = off), got -1"),
    ("eval.truncate=right", "eval.truncate must be null (refuse a prompt the target cannot take) or left, got 'right'"),
])
def test_bad_decoding_options_are_one_line_errors(arg, message, tmp_path, monkeypatch, capsys):
    code, line, _ = infer_cli([arg, "methods=[ar]"], tmp_path, monkeypatch, capsys)
    assert (code, line) == (2, f"dmtp.infer: error: {message}")


def test_prompt_longer_than_the_target_is_refused_or_cut_from_the_left(tmp_path, micro_target_dir, monkeypatch,
                                                                        capsys):
    questions = tmp_path / "gsm8k.jsonl"
    questions.write_text(json.dumps({"question": "Tom has 3 apples and buys 4 more. " * 900, "answer": "7"}) + "\n")
    args = [f"target.path={micro_target_dir}", "methods=[ar]", "eval.name=gsm8k", f"eval.path={questions}",
            "max_new_tokens=4", "batch_size=1"]
    code, line, _ = infer_cli(args, tmp_path / "refused", monkeypatch, capsys)
    assert code == 2 and line.startswith("dmtp.infer: error: prompt 0 of gsm8k has ")
    assert "the target takes at most 4091 (4096 positions (max_position_embeddings) - max_new_tokens 4 - a verify " \
           "block of 1)" in line and line.endswith("pass eval.truncate=left to keep its last 4091 tokens")
    code, _, out = infer_cli(args + ["eval.truncate=left"], tmp_path / "cut", monkeypatch, capsys)
    assert code == 0 and "[dmtp] eval.truncate=left: kept the last 4091 tokens of 1 prompt(s)" in out
    metrics = json.loads((tmp_path / "cut" / "metrics.json").read_text())
    assert metrics["overall"]["ar"]["per_request"][0]["prompt_tokens"] == 4091


def test_a_method_named_by_the_user_runs_or_fails(tmp_path, micro_target, no_mtp_target, monkeypatch, capsys):
    # trained for this target (widths as micro's), so that the default run below picks it
    drafter = _drafter_dir(micro_target, tmp_path / "outputs" / "train" / "runs" / "r" / "drafter",
                           trained_for=no_mtp_target)
    code, line, _ = infer_cli([f"target.path={no_mtp_target}", f"drafter={drafter}"], tmp_path / "a", monkeypatch,
                              capsys)
    assert code == 2 and line.startswith(f"dmtp.infer: error: drafter dual_anchor_zero_init ({drafter}) needs the "
                                         "target's MTP, which did not load: ")
    code, line, _ = infer_cli([f"target.path={no_mtp_target}", "methods=[ar,mtp415]"], tmp_path / "b", monkeypatch,
                              capsys)
    assert code == 2 and line.startswith("dmtp.infer: error: mtp415 needs the target's MTP")
    # The defaults (newest drafter under ./outputs, ar, mtp415): skipped with one line saying so.
    monkeypatch.chdir(tmp_path)
    code, _, out = infer_cli([f"target.path={no_mtp_target}", "num_prompts=1", "eval.domains=[code]",
                              "eval.prompt_tokens=16", "max_new_tokens=4"], tmp_path / "c", monkeypatch, capsys)
    assert code == 0 and "[dmtp] skipping mtp415, drafter (default methods; name them in methods=[...] to require them)" in out
    assert json.loads((tmp_path / "c" / "metrics.json").read_text())["run"]["methods"] == ["ar"]


def test_training_data_errors_name_the_option_or_the_file(tmp_path, monkeypatch, capsys):
    code, line, _ = train_cli(["data=files"], tmp_path / "run", monkeypatch, capsys)
    assert (code, line) == (2, "dmtp.train: error: data=files needs data.files, a list of local JSONL/JSON/Parquet "
                               "files (e.g. 'data.files=[/data/train.jsonl]')")
    empty, binary = tmp_path / "empty.jsonl", tmp_path / "blob.jsonl"
    empty.write_text("\n")
    binary.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ValueError, match=f"training data file {empty} holds no records"):
        read_files([str(empty)])
    with pytest.raises(ValueError, match=f"training data file {binary} is not UTF-8 text"):
        read_files([str(binary)])


# ---------------------------------------------------------------------------------------------------
# tracebacks before: now one-line errors naming the file or the option
# ---------------------------------------------------------------------------------------------------

def _truncate(path: Path, keep: float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.mark.parametrize("keep", [0.5, 0.0])
def test_unreadable_weights_name_their_file(keep, tmp_path, micro_target, micro_target_dir, monkeypatch, capsys):
    drafter = _drafter_dir(micro_target, tmp_path / "drafter")
    _truncate(drafter / "model.safetensors", keep)
    code, line, _ = infer_cli([f"target.path={micro_target_dir}", f"drafter={drafter}"], tmp_path / "run",
                              monkeypatch, capsys)
    assert code == 2 and line.startswith(f"dmtp.infer: error: {drafter / 'model.safetensors'} is not a readable "
                                         "safetensors file")
    with pytest.raises(ValueError, match=f"{drafter / 'model.safetensors'} is not a readable safetensors file"):
        build_components(compose_train([f"init_from={drafter}"]))
    target = tmp_path / "target"
    shutil.copytree(micro_target_dir, target)
    _truncate(target / "model.safetensors", keep)
    with pytest.raises(ValueError, match=f"{target / 'model.safetensors'} is not a readable safetensors file"):
        TargetModel.from_pretrained(target)


def test_drafter_config_that_is_not_json_names_the_file(tmp_path, micro_target, monkeypatch, capsys):
    drafter = _drafter_dir(micro_target, tmp_path / "drafter")
    (drafter / "config.json").write_text('{"architectures": ["DFlashDraftModel"], ')
    code, line, _ = infer_cli([f"drafter={drafter}"], tmp_path / "run", monkeypatch, capsys)
    assert (code, line) == (2, f"dmtp.infer: error: {drafter / 'config.json'} is not valid JSON (Expecting property "
                               "name enclosed in double quotes); is it a drafter config.json?")
    with pytest.raises(ValueError, match=f"{drafter / 'config.json'} is not valid JSON"):
        build_components(compose_train([f"init_from={drafter}"]))


def test_bad_ckpt_path_is_one_line_naming_it(short_run, tmp_path):
    truncated = tmp_path / "truncated.ckpt"
    shutil.copy(short_run / "checkpoints" / "last.ckpt", truncated)
    _truncate(truncated, 0.5)
    with pytest.raises(ValueError, match=f"ckpt_path {truncated} is not a readable Lightning checkpoint"):
        train(compose_train([f"ckpt_path={truncated}"], output_dir=tmp_path / "a"))
    foreign = short_run / "checkpoints" / "last.ckpt"   # a dual_anchor_zero_init run, resumed as raw_dflash
    with pytest.raises(ValueError, match=f"ckpt_path {foreign}.*another target, drafter or injection variant"):
        train(compose_train([f"ckpt_path={foreign}", "injection=raw_dflash"], output_dir=tmp_path / "b"))


class FirstWeights(L.Callback):
    """The drafter's tensors as training starts (after a checkpoint was restored)."""

    def on_train_start(self, trainer, module):
        self.state = {k: v.detach().clone() for k, v in module.drafter.state_dict().items()}


def test_a_checkpoint_from_before_the_one_unit_drafter_resumes_exactly(short_run, tmp_path):
    """Checkpoints written when the module held `drafter` (the backbone) and `injection` apart still resume:
    every tensor and the optimizer's state land where they belong."""
    state = torch.load(short_run / "checkpoints" / "last.ckpt", weights_only=True)
    def old_name(k):   # the MTP correction came later, under today's name (the run's default has one)
        if k.startswith("drafter.injection."):
            return "injection." + k[len("drafter.injection."):]
        return "drafter." + k[len("drafter.backbone."):] if k.startswith("drafter.backbone.") else k
    old = {old_name(k): v for k, v in state["state_dict"].items()}
    assert "drafter.fc.weight" in old and any(k.startswith("injection.") for k in old)
    state["state_dict"] = old
    torch.save(state, tmp_path / "old_layout.ckpt")
    weights = FirstWeights()
    summary = train(compose_train([f"ckpt_path={tmp_path / 'old_layout.ckpt'}", "trainer.max_steps=3", *QUIET],
                                  output_dir=tmp_path / "run"), callbacks=[weights])
    assert summary["global_step"] == 3
    assert torch.equal(weights.state["backbone.fc.weight"], old["drafter.fc.weight"])
    assert all(torch.equal(weights.state["injection." + k[len("injection."):]], v)
               for k, v in old.items() if k.startswith("injection."))


def test_init_from_a_drafter_for_another_target_names_init_from(tmp_path, micro_target):
    cfg = micro_target.config
    deeper = DFlashDrafter(DFlashConfig(hidden_size=cfg.hidden_size, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=cfg.num_attention_heads,
                                        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
                                        vocab_size=cfg.vocab_size, num_target_layers=8, target_layer_ids=[1, 6],
                                        mask_token_id=3))
    save_drafter(tmp_path / "deeper", deeper)
    with pytest.raises(ValueError, match=rf"init_from={tmp_path / 'deeper'} was built for a different target "
                                         r"\(hidden size 64, vocab 512, 8 layers\) than .* \(hidden size 64, "
                                         r"vocab 512, 4 layers\)"):
        build_components(compose_train([f"init_from={tmp_path / 'deeper'}"]))


# ---------------------------------------------------------------------------------------------------
# safe loading: safetensors only from user paths; no pickle from a user's path ever executes
# ---------------------------------------------------------------------------------------------------

def test_target_with_only_pickled_weights_is_refused(tmp_path, micro_target_dir, monkeypatch, capsys):
    target = tmp_path / "bin_only"
    shutil.copytree(micro_target_dir, target)
    torch.save(load_file(str(target / "model.safetensors")), target / "pytorch_model.bin")   # tensors only
    (target / "model.safetensors").unlink()
    (target / "model.safetensors.index.json").unlink()
    code, line, _ = infer_cli([f"target.path={target}", "methods=[ar]"], tmp_path / "run", monkeypatch, capsys)
    assert (code, line) == (2, f"dmtp.infer: error: target checkpoint {target} has no model.safetensors or "
                               "model.safetensors.index.json (found pytorch_model.bin: pickled weights are never "
                               "loaded; convert them to safetensors)")


def test_a_malicious_pickle_never_executes(tmp_path, micro_target, micro_target_dir):
    marker = tmp_path / "EXECUTED"
    evil = tmp_path / "evil.bin"
    torch.save({"weight": Marker(marker)}, evil)
    target = tmp_path / "target"                       # real safetensors + a poisoned pytorch_model.bin
    shutil.copytree(micro_target_dir, target)
    shutil.copy(evil, target / "pytorch_model.bin")
    TargetModel.from_pretrained(target)
    drafter = _drafter_dir(micro_target, tmp_path / "drafter")
    shutil.copy(evil, drafter / "pytorch_model.bin")
    load_block_drafter(drafter)
    build_components(compose_train([f"init_from={drafter}", f"target.path={target}"]))
    only_evil = tmp_path / "only_evil"                 # nothing but the poisoned pickle
    shutil.copytree(micro_target_dir, only_evil)
    (only_evil / "model.safetensors").unlink()
    (only_evil / "model.safetensors.index.json").unlink()
    shutil.copy(evil, only_evil / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match="pickled weights are never loaded"):
        TargetModel.from_pretrained(only_evil)
    with pytest.raises(ValueError, match=f"ckpt_path {evil} is not a readable Lightning checkpoint"):
        train(compose_train([f"ckpt_path={evil}"], output_dir=tmp_path / "run"))
    assert not marker.exists()
    assert os.path.getsize(evil) > 0
