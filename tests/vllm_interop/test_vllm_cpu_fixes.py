"""vLLM's code as it runs here after the plug-in and the platform registered their kernels (worker
start-up order), where vLLM 0.32's CPU stand-ins were wrong (`dmtp.serving.vllm.cpu_fixes`): the
rejection sampler's per-request -> per-draft-token expansion (float outputs never written) and
DFlash's context K norm (every layer normalised with layer 1's weight)."""
from __future__ import annotations

import pytest

from tests.vllm_interop.common import SKIP_REASON

pytest.importorskip("vllm", reason=SKIP_REASON)

import torch  # noqa: E402


@pytest.fixture(scope="module")
def registered():
    from vllm.platforms import current_platform

    from dmtp.serving.vllm.plugin import register

    register()
    current_platform.register_triton_kernel_overrides()


@pytest.fixture(scope="module")
def expand_batch_to_tokens(registered):
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    return expand_batch_to_tokens


@pytest.mark.parametrize("values", [[0.7, 1.0, 1.3, 0.5], [0.9, 0.95, 1.0, 0.25], [5, 0, 40, 7]],
                         ids=["temperature", "top_p", "top_k"])
def test_per_request_values_reach_every_draft_token_in_their_dtype(expand_batch_to_tokens, values):
    x = torch.tensor(values, dtype=torch.int32 if isinstance(values[0], int) else torch.float32)
    cu = torch.tensor([7, 14, 17, 24], dtype=torch.int32)   # 7, 7, 3 and 7 draft tokens
    expected = x.repeat_interleave(torch.tensor([7, 7, 3, 7]))
    for _ in range(3):   # what a fresh buffer holds differs from call to call
        torch.full((24,), 3e-7, dtype=x.dtype).sum()
        out = expand_batch_to_tokens(x, cu, 24, replace_from=-1, replace_to=1)
        assert out.dtype == x.dtype and torch.equal(out, expected), out.tolist()


def test_greedy_temperature_is_replaced_as_the_kernel_does(expand_batch_to_tokens):
    out = expand_batch_to_tokens(torch.tensor([0.0, 0.8]), torch.tensor([2, 4], dtype=torch.int32), 4,
                                 replace_from=0, replace_to=1)
    assert out.tolist() == pytest.approx([1.0, 1.0, 0.8, 0.8])


def test_dflash_context_k_is_normalised_with_each_layers_own_k_norm(registered):
    from types import SimpleNamespace

    from vllm.model_executor.models.qwen3_dflash import DFlashQwen3Model

    gen = torch.Generator().manual_seed(0)
    layers, ctx, kv_heads, head_dim = 3, 5, 1, 32
    k = torch.randn(layers, ctx, kv_heads, head_dim, generator=gen)
    weights = torch.rand(layers, head_dim, generator=gen) + 0.5
    model = SimpleNamespace(_k_norm_weights=weights, _rms_norm_eps=1e-6)
    expected = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + 1e-6) * weights[:, None, None, :]
    assert torch.allclose(DFlashQwen3Model._normalize_context_k(model, k), expected, atol=1e-5)
