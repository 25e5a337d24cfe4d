"""vLLM interop tests: run inside .venv-vllm (`bash tools/env/vllm_env.sh && .venv-vllm/bin/python -m pytest -q
tests/vllm_interop`); each module skips with one line where vLLM is not importable (the main suite).

vLLM runs in this process (no engine-core subprocess: faster start, no spawn of the test runner),
offline, with a 1 GiB KV cache: the served target is the micro_vllm embedded one (head_dim 32, the
smallest vLLM's CPU attention takes)."""
from __future__ import annotations

import pytest

import tests.vllm_interop.common  # noqa: F401  (the environment vLLM reads, set before it is imported)


@pytest.fixture(scope="session")
def vllm_target_dir():
    from tests.built_targets import built_target

    return built_target("micro_vllm")


@pytest.fixture(scope="session")
def vllm_target(vllm_target_dir):
    from dmtp.models.target import TargetModel

    return TargetModel.from_pretrained(vllm_target_dir)


@pytest.fixture(scope="session")
def vllm_tokenizer(vllm_target_dir):
    from dmtp.models.target import load_tokenizer

    return load_tokenizer(vllm_target_dir)


@pytest.fixture(scope="session")
def interop_prompts(vllm_tokenizer):
    """8 held-out prompts of 32 tokens, half code, half math."""
    from dmtp.data.prompts import held_out_prompts

    return [p for domain in ("code", "math") for p in held_out_prompts(vllm_tokenizer, domain, "validation", 4, 32)]


@pytest.fixture(scope="session")
def dmtp_drafter_dir(tmp_path_factory, vllm_target_dir):
    """A two-layer dual_anchor_zero_init drafter with an MTP correction, trained 40 steps on the target's greedy
    responses (two layers: vLLM computes every layer's context K/V in one fused pass, which a single layer leaves
    untested; vLLM 0.32's CPU kernel normalised them all with layer 1's weight)."""
    from tests.vllm_interop.common import train_interop_drafter

    # With an MTP correction (rank 8): vLLM proposes T1 through it as dmtp's loop does, which the per-position
    # acceptance comparison checks (a T1 from the uncorrected MTP would be accepted at other rounds).
    return train_interop_drafter(tmp_path_factory, "dual_anchor_zero_init", num_layers=2,
                                 overrides=("drafter.mtp_correction_rank=8",))
