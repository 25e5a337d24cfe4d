"""A hybrid target (Qwen3.5 text: gated DeltaNet + full attention, its MTP in `mtp.safetensors`) served by
vLLM with a raw DFlash export: the target's greedy tokens, acceptance per position equal to dmtp's loop.

GPU only. vLLM 0.32's CPU build cannot run it:
- its Qwen3.5 model imports torchvision, which .venv-vllm leaves out (PyPI's build is CUDA's and breaks
  `from vllm import LLM`; seen 2026-12-04: "Model architectures ['Qwen3_5ForCausalLM'] failed to be
  inspected ... No module named 'torchvision'");
- speculative decoding over gated DeltaNet state needs a Triton kernel (`mamba_utils.py`) that has no
  CPU path.
`tools/env/gpu_check.sh` runs tests/vllm_interop wherever a CUDA build of vLLM is installed.
"""
from __future__ import annotations

import json
import shutil

import pytest

from tests.vllm_interop.common import ENGINE_ARGS, NEW_TOKENS, SKIP_REASON

pytest.importorskip("vllm", reason=SKIP_REASON)

import torch  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("hybrid targets in vLLM are GPU-only (vLLM's CPU build: no torchvision here, no CPU gated-DeltaNet "
                "speculation kernel)", allow_module_level=True)

from dmtp.decode import build_proposer  # noqa: E402
from dmtp.families.decoding import spec_decoder  # noqa: E402
from dmtp.drafters.block_drafter import fresh_drafter_for, load_block_drafter  # noqa: E402
from dmtp.models.target import TargetModel  # noqa: E402
from dmtp.serving.vllm.engine import generate, make_llm, sampling_params, shutdown, spec_decode_counts  # noqa: E402
from dmtp.tiny.architectures import build_model  # noqa: E402
from dmtp.tiny.presets import HybridPreset  # noqa: E402
from dmtp.tiny.targets import save_target  # noqa: E402

K = 7
# micro_hybrid's layout with every head 32 wide (vLLM's attention and gated-DeltaNet kernels take 32, 64, ...).
PRESET = HybridPreset(name="hybrid_vllm", vocab_size=512, hidden_size=64, num_layers=4, num_heads=2, num_kv_heads=1,
                      head_dim=32, intermediate_size=192, seq_len=128, batch_size=8, steps=0, lr=0.0,
                      linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=32,
                      linear_value_head_dim=32)


@pytest.fixture(scope="module")
def hybrid_dirs(tmp_path_factory, vllm_target_dir):
    """A random-weight hybrid target with micro_vllm's tokenizer, and an untrained raw DFlash drafter. Its
    drafts are almost never accepted (dmtp's loop on CPU: none in 210 rounds, 8 prompts x 32 tokens), so the acceptance
    check below is weak; the point is that vLLM verifies DFlash blocks over gated-DeltaNet state
    losslessly (rejected drafts must roll that state back)."""
    root = tmp_path_factory.mktemp("hybrid_vllm")
    target_dir = root / "target"
    target_dir.mkdir()
    eos = json.loads((vllm_target_dir / "config.json").read_text())["eos_token_id"]
    torch.manual_seed(0)
    model, mtp = build_model(PRESET, PRESET.vocab_size, eos)
    save_target(model, mtp, target_dir, mtp_apart=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (vllm_target_dir / name).exists():
            shutil.copy(vllm_target_dir / name, target_dir / name)
    target = TargetModel.from_pretrained(target_dir, device="cuda")
    fresh_drafter_for(target, "raw_dflash", PRESET.vocab_size - 1).save(root / "drafter")
    return target_dir, root / "drafter", target, eos


def test_hybrid_target_with_raw_dflash_in_vllm(hybrid_dirs, interop_prompts):
    target_dir, drafter_dir, target, eos = hybrid_dirs
    drafter, _ = load_block_drafter(drafter_dir)
    drafter = drafter.to("cuda")
    ar = spec_decoder(target, build_proposer("ar", target), eos_token_id=eos).generate(
        interop_prompts, max_new_tokens=NEW_TOKENS, batch_size=8)
    ours = spec_decoder(target, build_proposer("drafter", target, drafter=drafter), eos_token_id=eos).generate(
        interop_prompts, max_new_tokens=NEW_TOKENS, batch_size=8)
    llm = make_llm(target_dir, ENGINE_ARGS, speculative_config={"method": "dflash", "model": str(drafter_dir),
                                                                "num_speculative_tokens": K})
    try:
        tokens, _ = generate(llm, interop_prompts, sampling_params(NEW_TOKENS, [eos]))
        drafts, per_pos = spec_decode_counts(llm)
    finally:
        shutdown(llm)
    assert ours.tokens == ar.tokens
    assert tokens == ar.tokens
    expected = [sum(a > k for rounds in ours.accepted_raw for a in rounds) for k in range(K)]
    assert (drafts, per_pos) == (sum(len(r) for r in ours.accepted_raw), expected)
