"""Shared fixtures: the `micro` embedded target, built once and cached under $DMTP_HOME."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

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


@pytest.fixture(scope="session")
def no_mtp_target(micro_target_dir, tmp_path_factory):
    """The micro target without its MTP tensors (a checkpoint that ships none)."""
    root = tmp_path_factory.mktemp("no_mtp")
    for f in Path(micro_target_dir).iterdir():
        if f.is_file() and f.name != "mtp.safetensors":   # the MTP's own file
            shutil.copy(f, root / f.name)
    state = load_file(str(root / "model.safetensors"))
    save_file({k: v for k, v in state.items() if not k.startswith("mtp.")}, str(root / "model.safetensors"),
              metadata={"format": "pt"})
    config = json.loads((root / "config.json").read_text())
    config.pop("mtp_num_hidden_layers", None)
    (root / "config.json").write_text(json.dumps(config))
    return root
