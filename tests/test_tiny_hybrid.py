"""The embedded hybrid target: the Qwen3.5 text architecture (gated DeltaNet : gated attention, 3:1)
with its own `mtp.*` layer, pretrained jointly like `tiny`; here its test size, `micro_hybrid`."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3_5ForCausalLM

from dmtp.configs import compose_train
from dmtp.decode.loop import build_proposer
from dmtp.families.decoding import spec_decoder
from dmtp.drafters.block_drafter import fresh_drafter_for, load_block_drafter
from dmtp.families.catalogue import make_target_runner
from dmtp.families.hybrid import HybridTargetRunner, Qwen35MTPBlock
from dmtp.families.mtp_loading import load_native_mtp
from dmtp.models.target import TargetModel
from built_targets import built_target
from dmtp.training.job import train
from test_tiny_target import _heldout_ids, _mtp_top1


@pytest.fixture(scope="session")
def micro_hybrid_dir():
    """Built once (76 s on one core of a loaded 2-core machine) and cached under $DMTP_HOME, like `micro`.
    On one thread (tests/built_targets.py)."""
    return built_target("micro_hybrid")


@pytest.fixture(scope="module")
def hybrid(micro_hybrid_dir):
    target = TargetModel.from_pretrained(micro_hybrid_dir)
    return target, load_native_mtp(micro_hybrid_dir, target.embed_tokens, target.lm_head)


def test_checkpoint_is_the_qwen35_layout_and_loads_with_transformers_and_the_strict_mtp_loader(micro_hybrid_dir):
    config = json.loads((micro_hybrid_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5ForCausalLM"] and config["model_type"] == "qwen3_5_text"
    assert config["mtp_num_hidden_layers"] == 1 and config["mtp_use_dedicated_embeddings"] is False
    assert config["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    with safe_open(str(micro_hybrid_dir / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        gated_q = f.get_slice("mtp.layers.0.self_attn.q_proj.weight").get_shape()
    for name in ("mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight",
                 "mtp.norm.weight", "mtp.layers.0.self_attn.q_norm.weight", "mtp.layers.0.mlp.down_proj.weight",
                 "model.layers.0.linear_attn.in_proj_qkv.weight", "model.layers.3.self_attn.q_proj.weight"):
        assert name in keys, name
    assert gated_q[0] == 2 * config["num_attention_heads"] * config["head_dim"]   # per head [query | gate]

    hf, info = AutoModelForCausalLM.from_pretrained(micro_hybrid_dir, output_loading_info=True)
    assert isinstance(hf, Qwen3_5ForCausalLM) and not info["missing_keys"]
    assert AutoTokenizer.from_pretrained(micro_hybrid_dir).mask_token == "<|mask|>"
    target = TargetModel.from_pretrained(micro_hybrid_dir)
    mtp = load_native_mtp(micro_hybrid_dir, target.embed_tokens, target.lm_head)
    assert isinstance(mtp.layers[0], Qwen35MTPBlock) and mtp.spec.zero_centered_norm
    assert isinstance(make_target_runner(target), HybridTargetRunner)      # runner=auto, no fallback
    report = json.loads((micro_hybrid_dir / "build_report.json").read_text())
    assert report["architecture"] == "Qwen3_5ForCausalLM" and set(report["heldout"]) == {"code", "prose", "math"}


@torch.no_grad()
def test_mtp_is_pretrained_with_zero_centred_norms(micro_hybrid_dir, hybrid):
    target, mtp = hybrid
    ids = _heldout_ids(AutoTokenizer.from_pretrained(micro_hybrid_dir))
    hidden = target(ids).last_hidden
    good = _mtp_top1(mtp, ids, hidden)
    unigram = (ids[:, 2:] == torch.bincount(ids.flatten()).argmax()).float().mean().item()
    assert good > 0.3 and good > 4 * unigram, (good, unigram)
    # Read as x*w instead of x*(1+w), the trained norms collapse it (reference/mtp.md §7).
    norms = [m for m in mtp.modules() if getattr(m, "zero_centered", False)]
    for m in norms:
        m.zero_centered = False
    try:
        plain = _mtp_top1(mtp, ids, hidden)
    finally:
        for m in norms:
            m.zero_centered = True
    assert plain < 0.5 * good, (good, plain)


def _prompts(tokenizer) -> list[list[int]]:
    """Held-out text of different lengths, from the middle of documents (code, prose, math)."""
    from dmtp.data.corpora import texts

    prompts = []
    for domain, n in (("code", 23), ("prose", 17), ("math", 30)):
        ids = tokenizer(texts(domain, "validation")[3], add_special_tokens=False)["input_ids"]
        prompts.append(ids[len(ids) // 3: len(ids) // 3 + n])
    return prompts


@pytest.mark.parametrize("method", ["ar", "mtp415", "drafter"])
def test_greedy_decoding_equals_transformers_cached_generate(micro_hybrid_dir, hybrid, method):
    target, mtp = hybrid
    tokenizer = AutoTokenizer.from_pretrained(micro_hybrid_dir)
    prompts, new = _prompts(tokenizer), 24
    refs = []
    for prompt in prompts:   # transformers' own cache: the recurrent states advance token by token
        ids = torch.tensor([prompt])
        out = target.hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                                 eos_token_id=None, pad_token_id=tokenizer.pad_token_id)
        refs.append(out[0, len(prompt):].tolist())
    drafter = None
    if method == "drafter":
        drafter = fresh_drafter_for(target, "dual_anchor_zero_init", tokenizer.mask_token_id, perturb=0.5)
    proposer = build_proposer(method, target, mtp=mtp, drafter=drafter)
    result = spec_decoder(target, proposer, eos_token_id=[]).generate(prompts, max_new_tokens=new)
    assert result.tokens == refs
    if method == "mtp415":   # the pretrained MTP gets drafts both accepted and rejected: rollback is exercised
        rounds = [a for per_request in result.accepted for a in per_request[:-1]]
        assert sum(rounds) > 0 and min(rounds) < 4, rounds


def test_train_composes_and_runs_two_steps_on_micro_hybrid(micro_hybrid_dir, tmp_path):
    cfg = compose_train(["target.preset=micro_hybrid", "injection=dual_anchor_zero_init", "trainer.max_steps=2", "trainer.val_check_interval=2",
                         "data.max_examples=8", "data.val_prompts=1", "data.val_new_tokens=8",
                         "decode_eval.enabled=false"], output_dir=tmp_path)
    assert cfg.target.preset == "micro_hybrid"
    summary = train(cfg)
    assert summary["global_step"] == 2
    drafter, meta = load_block_drafter(tmp_path / "drafter")
    assert meta["injection"] == "dual_anchor_zero_init" and drafter.injection.uses_mtp
    assert drafter.config.hidden_size == json.loads((micro_hybrid_dir / "config.json").read_text())["hidden_size"]
