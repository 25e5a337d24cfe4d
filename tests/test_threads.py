"""The thread policy (dmtp/threads.py, issue 24 item 6): the commands claim the process before torch loads
(OpenMP's wait policy is read once, then), print what they chose, and take threads=auto|N; called from
Python (as these tests do), auto leaves the caller's threads alone, so no test depends on the load."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from dmtp import threads
from dmtp.configs import compose_config


def test_physical_cores_are_within_the_affinity():
    assert 1 <= threads.physical_cores() <= len(os.sched_getaffinity(0))


@pytest.mark.parametrize("setting,expected", [("auto", None), (None, None), (2, 2), ("3", 3)])
def test_threads_setting(setting, expected):
    assert threads.parse_threads(setting) == expected


@pytest.mark.parametrize("setting", [0, -1, "many", 1.5, True])
def test_a_bad_threads_setting_is_one_line(setting):
    with pytest.raises(ValueError, match="threads must be auto or an integer >= 1, got "):
        threads.parse_threads(setting)


def test_in_process_auto_leaves_the_callers_threads(monkeypatch):
    monkeypatch.delenv("DMTP_THREADS", raising=False)
    monkeypatch.setitem(threads._claim, "owned", False)   # called from Python: no command claimed this process
    before = torch.get_num_threads()
    line = threads.apply_threads("auto")
    assert torch.get_num_threads() == before and line.startswith(f"[dmtp] threads: {before} (auto: the calling ")
    try:
        assert threads.apply_threads(2).startswith("[dmtp] threads: 2 (threads=2)") and torch.get_num_threads() == 2
        monkeypatch.setenv("DMTP_THREADS", "3")
        assert threads.apply_threads("auto").startswith("[dmtp] threads: 3 (threads=3)")
    finally:
        torch.set_num_threads(before)


def test_both_commands_have_the_option():
    assert compose_config("train", []).threads == "auto"
    assert compose_config("infer", ["output_dir=/tmp/x"]).threads == "auto"


def test_a_command_claims_the_process_before_torch_loads(micro_target_dir, tmp_path):
    """As `python -m dmtp.infer` runs: the run header names the threads and a wait policy that was in the
    environment before torch loaded (the command then stops at an option check, before decoding)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "DMTP_THREADS")}
    done = subprocess.run([sys.executable, "-m", "dmtp.infer", f"target.path={micro_target_dir}", "methods=[mtp:0]",
                           f"hydra.run.dir={tmp_path}", "hydra.output_subdir=null"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    header = [line for line in done.stdout.splitlines() if line.startswith("[dmtp] threads: ")]
    assert len(header) == 1 and "(auto: " in header[0], done.stdout
    assert header[0].endswith("OpenMP wait policy: PASSIVE"), header
