"""Shared fixtures: the `micro` embedded target, built once and cached under $DMTP_HOME."""
from __future__ import annotations

import os

import pytest
import torch

from dmtp.tiny.targets import ensure_tiny_target


def pytest_configure(config):
    # The test models are tiny: extra intra-op threads only add OpenMP overhead (and contention when
    # another process shares the cores). Building the micro target is the exception (see below).
    torch.set_num_threads(1)


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
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    try:
        return ensure_tiny_target("micro", progress=False)
    finally:
        torch.set_num_threads(1)


@pytest.fixture(scope="session")
def micro_target(micro_target_dir):
    from dmtp.models.target import TargetModel

    return TargetModel.from_pretrained(micro_target_dir)


@pytest.fixture(scope="session")
def micro_mtp(micro_target_dir, micro_target):
    from dmtp.families.mtp_loading import load_native_mtp

    return load_native_mtp(micro_target_dir, micro_target.embed_tokens, micro_target.lm_head)
