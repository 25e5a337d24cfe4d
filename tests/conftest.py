"""Shared fixtures: the `micro` embedded target, built once and cached under $DMTP_HOME."""
from __future__ import annotations

import os

import pytest
import torch

from built_targets import built_target


# The intra-op threads of the test process. The test models are tiny: extra threads only add OpenMP overhead (and
# contention when another process shares the cores), so 1 by default; tests/test_thread_independence.py runs the
# numerical tests again at 2 (and beside a busy core) to show that no assertion depends on the count.
TEST_THREADS = int(os.environ.get("DMTP_TEST_THREADS", "1"))


def pytest_configure(config):
    torch.set_num_threads(TEST_THREADS)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if item.get_closest_marker("gpu"):   # not `"gpu" in item.keywords`: a folder gpu/ matches that
            item.add_marker(skip)


@pytest.fixture(scope="session")
def micro_target_dir():
    """Path of the micro target (Qwen3 + `mtp.*`), built in well under a minute the first time."""
    return built_target("micro")


@pytest.fixture(scope="session")
def micro_target(micro_target_dir):
    from dmtp.models.target import TargetModel

    return TargetModel.from_pretrained(micro_target_dir)


@pytest.fixture(scope="session")
def micro_mtp(micro_target_dir, micro_target):
    from dmtp.families.mtp_loading import load_native_mtp

    return load_native_mtp(micro_target_dir, micro_target.embed_tokens, micro_target.lm_head)
