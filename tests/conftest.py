"""Shared fixtures: the `micro` embedded target, built once and cached under $DMTP_HOME."""
from __future__ import annotations

import pytest
import torch

from dmtp.tiny.build import ensure_tiny_target


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def micro_target_dir():
    """Path of the micro target (Qwen3 + `mtp.*`), built in well under a minute the first time."""
    return ensure_tiny_target("micro", progress=False)


@pytest.fixture(scope="session")
def micro_target(micro_target_dir):
    from dmtp.models.target import TargetModel

    return TargetModel.from_pretrained(micro_target_dir)


@pytest.fixture(scope="session")
def micro_mtp(micro_target_dir, micro_target):
    from dmtp.models.mtp_loading import load_native_mtp

    return load_native_mtp(micro_target_dir, micro_target.embed_tokens, micro_target.lm_head)
