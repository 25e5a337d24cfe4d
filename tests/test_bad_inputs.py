"""Bad input to the decoding commands, and a directory the machine will not let them write: one line each, naming
what is wrong and what to do (issue 65, items 3 and 6), where a traceback or a misleading line used to be."""
from __future__ import annotations

import errno
import importlib.util
import os
import subprocess

import pytest
import torch

from cli_runner import infer_cli, run_command
from dmtp.errors import environment_fault


def _one_line(module, args, tmp_path, monkeypatch, capsys):
    if module == "dmtp.infer":
        return infer_cli(args, tmp_path / "run", monkeypatch, capsys)
    return run_command(module, args, tmp_path / "run", monkeypatch, capsys)


NO_CUDA = "device=cuda but this machine has no CUDA device (use device=auto or device=cpu)"


@pytest.mark.parametrize("module", ["dmtp.infer", "dmtp.regime"])
@pytest.mark.parametrize("arg,message", [
    ("device=bogus", "device must be auto, cpu, cuda or cuda:<N>, got 'bogus'"),
    ("device=meta", "device must be auto, cpu, cuda or cuda:<N>, got 'meta'"),
    pytest.param("device=cuda", NO_CUDA,
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")),
])
def test_a_device_this_machine_lacks_is_one_line(module, arg, message, tmp_path, micro_target_dir, monkeypatch,
                                                 capsys):
    """An AssertionError ("Torch not compiled with CUDA enabled") or torch's RuntimeError before (issue 65)."""
    code, line, _ = _one_line(module, [f"target.path={micro_target_dir}", "methods=[ar]" if module == "dmtp.infer"
                                       else "num_prompts=1", arg], tmp_path, monkeypatch, capsys)
    assert (code, line) == (2, f"{module}: error: {message}")


@pytest.mark.parametrize("arg", ["batch_size=0", "num_prompts=0", "max_new_tokens=-1", "eval.prompt_tokens=0"])
def test_regime_counts_below_one_are_one_line_before_the_target_loads(arg, tmp_path, monkeypatch, capsys):
    """batch_size=0 said "range() arg 3 must not be zero" after the target had loaded (issue 65)."""
    key, value = arg.split("=")
    code, line, _ = run_command("dmtp.regime", ["target.path=/no/such/target", arg], tmp_path / "run", monkeypatch,
                                capsys)
    assert (code, line) == (2, f"dmtp.regime: error: {key} must be an integer >= 1, got {value}")


def test_regime_on_a_target_without_an_mtp_says_what_regime_needs(tmp_path, no_mtp_target, monkeypatch, capsys):
    """It said "use a variant that does not need MTP": regime has no variant (issue 65)."""
    code, line, _ = run_command("dmtp.regime", [f"target.path={no_mtp_target}", "num_prompts=1"], tmp_path / "run",
                                monkeypatch, capsys)
    assert code == 2 and line.startswith("dmtp.regime: error: dmtp.regime measures the target's MTP (its agreement "
                                         f"and MTP415's acceptance), which did not load: checkpoint {no_mtp_target} "
                                         "has no MTP layer"), line
    assert line.endswith("place a target that has one (target=<preset> or target.path=<dir>)") and "variant" not in line


def test_no_drafter_to_decode_is_bad_input_naming_the_default_training_command(tmp_path, monkeypatch, capsys):
    """Exit status 1 and a hint naming injection=dual_anchor_zero_init before (issue 65)."""
    monkeypatch.chdir(tmp_path)
    code, line, _ = infer_cli(["target=micro"], tmp_path / "run", monkeypatch, capsys)
    assert (code, line) == (2, "dmtp.infer: error: no trained drafter found under ./outputs or ./logs; train one "
                               "first: python -m dmtp.train target=micro (or pass drafter=<dir>)")
    from dmtp.inference.drafter_choice import NO_DRAFTER_MESSAGE, train_command
    from omegaconf import OmegaConf

    assert train_command(OmegaConf.create({"path": None, "preset": "assistant"})) == "python -m dmtp.train"
    assert NO_DRAFTER_MESSAGE.endswith("train one first: python -m dmtp.train (or pass drafter=<dir>)")


def test_a_missing_drafter_is_said_before_the_target_loads(tmp_path, monkeypatch, capsys):
    """It was said only once the target had loaded (issue 65): here the target does not exist at all."""
    missing = tmp_path / "no_drafter"
    code, line, _ = infer_cli([f"drafter={missing}", "target.path=/no/such/target"], tmp_path / "run", monkeypatch,
                              capsys)
    assert (code, line) == (2, f"dmtp.infer: error: drafter directory not found: {missing}")
    missing.mkdir()
    code, line, _ = infer_cli([f"drafter={missing}", "target.path=/no/such/target"], tmp_path / "run", monkeypatch,
                              capsys)
    assert (code, line) == (2, f"dmtp.infer: error: drafter file not found: {missing / 'config.json'}")


@pytest.mark.parametrize("code,text,expected", [
    (errno.EACCES, "permission denied", "permission denied on /out/run"),
    (errno.EPERM, "operation not permitted", "operation not permitted on /out/run"),
])
def test_a_path_this_user_may_not_write_is_an_environment_fault(code, text, expected):
    line = environment_fault(PermissionError(code, os.strerror(code), "/out/run"))
    assert line == (f"{expected} ({os.strerror(code)}); give this user access there or point the command elsewhere "
                    "(hydra.run.dir=<dir>, DMTP_HOME=<dir>)")
    assert environment_fault(RuntimeError("403: Permission denied")) is None   # a server's refusal: not this machine


@pytest.fixture
def unwritable(tmp_path):
    """A directory this process may not write into: immutable for root (chattr +i), read-only for another user."""
    folder = tmp_path / "locked"
    folder.mkdir()
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i is not available here")
    else:
        folder.chmod(0o555)
    yield folder
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(folder)], capture_output=True)
    else:
        folder.chmod(0o755)


@pytest.mark.parametrize("module", ["dmtp.train", "dmtp.infer"])
def test_an_output_directory_the_process_may_not_write_is_one_line(module, unwritable, micro_target_dir,
                                                                   monkeypatch, capsys):
    """PermissionError tracebacks before (issue 65: EPERM with chattr +i; EACCES for another user)."""
    args = ["debug=tiny_budget"] if module == "dmtp.train" else [f"target.path={micro_target_dir}", "methods=[ar]"]
    code, line, _ = run_command(module, args, unwritable / "run", monkeypatch, capsys)
    said = "operation not permitted" if os.geteuid() == 0 else "permission denied"
    assert code == 1 and line.startswith(f"{module}: error: {said} on {unwritable / 'run'} ("), line
    assert line.endswith("give this user access there or point the command elsewhere (hydra.run.dir=<dir>, "
                         "DMTP_HOME=<dir>)")


# -- the extra hostile tries of issue 65: each once a traceback or a silent acceptance -----------------------------

TRAIN = ["debug=tiny_budget", "logger=none", "callbacks=none", "model.val_walk=false"]


@pytest.mark.parametrize("module,args,message", [
    ("dmtp.train", ["model.num_anchors=0"], "model.num_anchors must be an integer >= 1 (blocks drawn per row), got 0"),
    ("dmtp.train", ["data.batch_size=0"], "data.batch_size must be an integer >= 1, got 0"),
    ("dmtp.train", ["data.val_prompts=0"], "data.val_prompts must be an integer >= 1, got 0 (no validation: "
                                           "data.val_domains=[] and no data.val_sets)"),
    ("dmtp.train", ["+trainer.max_epochs=0"], "+trainer.max_epochs=... adds an option, but trainer.max_epochs is one "
                                              "already: set it with trainer.max_epochs=... (no +)"),
    ("dmtp.train", ["data.vllm_engine_args={tensor_parallel_size: 2}"],
     "data.vllm_engine_args are vLLM's engine options (data.regen_engine=vllm); data.regen_engine=dmtp takes none"),
    ("dmtp.train", ["decode_eval.enabled=true", "decode_eval.speed_profile=bogus"],
     "decode_eval.speed_profile=bogus: no such speed profile"),
    ("dmtp.infer", ["speed_profile=bogus"], "speed_profile=bogus: no such speed profile"),
    ("dmtp.infer", ["vllm_engine_args={tensor_parallel_size: 2}"],
     "vllm_engine_args are vLLM's engine options (engine=vllm); engine=dmtp takes none"),
    ("dmtp.infer", ["eval.domains=[]"], "eval.domains is empty: name at least one workload, e.g. eval.domains=[code]"),
    ("dmtp.regime", ["eval.domains=[]"], "eval.domains is empty: name at least one workload, e.g. eval.domains=[code]"),
    ("dmtp.regime", ["target=nope"], "target=nope is not a choice of target; choose from assistant, "),
])
def test_a_bad_option_found_by_the_extra_tries_is_one_line_before_anything_loads(module, args, message, tmp_path,
                                                                                 monkeypatch, capsys):
    import dmtp.training.job as job

    monkeypatch.setattr(job, "build_components", lambda cfg: pytest.fail("the target loaded before the refusal"))
    common = TRAIN if module == "dmtp.train" else ["target.path=/no/such/target"]
    code, line, _ = _one_line(module, [*common, *args, *(["methods=[ar]"] if module == "dmtp.infer" else [])],
                              tmp_path, monkeypatch, capsys)
    assert code == 2 and line.startswith(f"{module}: error: {message}"), line
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_the_vllm_engine_where_vllm_is_not_installed_is_one_line_before_anything_loads(tmp_path, monkeypatch, capsys):
    from dmtp.serving.vllm.engine import VLLM_MISSING

    code, line, _ = infer_cli(["engine=vllm", "methods=[ar]", "target.path=/no/such/target"], tmp_path / "run",
                              monkeypatch, capsys)
    assert (code, line) == (2, f"dmtp.infer: error: {VLLM_MISSING}")


def test_rows_shorter_than_a_block_and_a_decode_past_the_targets_positions_are_one_line(tmp_path, micro_target_dir,
                                                                                      monkeypatch, capsys):
    """data.seq_len=2 trained on a token or two per block and regime max_new_tokens=100000 ran for good (issue 65)."""
    code, line, _ = _one_line("dmtp.train", [*TRAIN, "data.seq_len=2"], tmp_path, monkeypatch, capsys)
    assert (code, line) == (2, "dmtp.train: error: data.seq_len=2 is shorter than one block of the drafter (8 "
                               "positions): use data.seq_len >= 8")
    code, line, _ = _one_line("dmtp.regime", [f"target.path={micro_target_dir}", "max_new_tokens=100000"], tmp_path,
                              monkeypatch, capsys)
    assert (code, line) == (2, f"dmtp.regime: error: max_new_tokens=100000 leaves no room for a prompt on "
                               f"{micro_target_dir}: 4096 positions (max_position_embeddings) - max_new_tokens 100000 "
                               "- a verify block of 5")


def test_a_run_directory_that_is_a_file_and_ctrl_c_are_one_line(tmp_path, monkeypatch, capsys):
    from dmtp.cli import hydra_faults_one_line

    afile = tmp_path / "afile"
    afile.write_text("")
    for where in (afile, afile / "sub"):
        code, line, _ = run_command("dmtp.train", TRAIN, where, monkeypatch, capsys)
        assert (code, line) == (2, f"dmtp.train: error: cannot make the directory {where}: {afile} is a file (is "
                                   "hydra.run.dir, or a directory above it, a file?)")
    with pytest.raises(SystemExit) as ended:
        with hydra_faults_one_line("dmtp.train"):
            raise KeyboardInterrupt
    assert ended.value.code == 130 and capsys.readouterr().err == "dmtp.train: interrupted\n"
