"""The numerical tests pass whatever the thread count and the machine's load: run again at 1 and 2 intra-op
threads (the suite itself runs at 1, tests/conftest.py), each beside a busy core.

A tolerance below what fp32 sums support, or a result read from a count the thread policy picks, passes on one
machine and fails on the next: these runs are where such a test fails first. The files are the suite's
comparisons of losses, distributions, attention paths and verification statistics; each run reuses the
session's built targets (the same $DMTP_HOME; builds are at a fixed count per preset, tests/built_targets.py)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
NUMERICAL = ["test_losses.py", "test_training_levers.py", "test_block_groups.py", "test_verify_metrics.py",
             "test_gqa_attention.py", "test_mtp_slots.py", "test_block_verification.py", "test_decode_sampling.py",
             "test_intervals.py"]
# A spinning process for at most this long (the test stops it sooner): the bound keeps a killed test run from
# leaving a core busy for good.
BUSY_SECONDS = 600


def _run_numerical(threads: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "DMTP_TEST_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-o", "addopts=",
                           *NUMERICAL], cwd=TESTS, env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture
def busy_core():
    proc = subprocess.Popen([sys.executable, "-c",
                             f"import time\nend = time.time() + {BUSY_SECONDS}\nwhile time.time() < end: pass"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _assert_passed(run: subprocess.CompletedProcess, what: str) -> None:
    tail = "\n".join((run.stdout + run.stderr).strip().splitlines()[-15:])
    assert run.returncode == 0, f"the numerical tests failed {what}:\n{tail}"
    assert " passed" in tail, tail


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
def test_numerical_tests_pass_beside_a_busy_core(threads, busy_core):
    run = _run_numerical(threads)
    assert busy_core.poll() is None, "the busy loop ended before the run did"
    _assert_passed(run, f"at {threads} thread(s) beside a busy core")
