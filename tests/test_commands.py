"""The commands are thin: `--help` / `--cfg job` compose and answer before torch, transformers or Lightning
load (the work lives in dmtp.training.job / dmtp.inference.compare, imported once Hydra has composed)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _run(args, cwd):
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, env=ENV, timeout=120)


@pytest.mark.parametrize("command,overrides,expect", [
    ("dmtp.train", ["injection=token_only", "target=micro"], {"target": {"preset": "micro"}}),
    ("dmtp.infer", ["target.preset=tiny_hybrid", "eval.name=prompts", "eval.path=p.jsonl"],
     {"target": {"preset": "tiny_hybrid"}, "eval": {"name": "prompts", "path": "p.jsonl"}}),
    ("dmtp.regime", ["target=assistant", "num_prompts=4"], {"target": {"preset": "assistant"}}),
])
def test_cfg_job_prints_the_composed_config(command, overrides, expect, tmp_path):
    proc = _run(["-m", command, *overrides, "--cfg", "job"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    cfg = yaml.safe_load(proc.stdout)
    for group, fields in expect.items():
        for key, value in fields.items():
            assert cfg[group][key] == value
    if command == "dmtp.train":
        assert cfg["injection"]["_target_"].endswith("TokenOnly")
    assert not list(tmp_path.iterdir())   # nothing ran: no run directory


@pytest.mark.parametrize("command", ["dmtp.train", "dmtp.infer", "dmtp.prepare", "dmtp.regime"])
def test_command_modules_load_no_heavy_library(command, tmp_path):
    heavy = ("torch", "transformers", "lightning")
    proc = _run(["-c", f"import sys, {command}; print(sorted(m for m in {heavy!r} if m in sys.modules))"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_train_help_answers(tmp_path):
    proc = _run(["-m", "dmtp.train", "--help"], tmp_path)
    assert proc.returncode == 0 and "injection" in proc.stdout
