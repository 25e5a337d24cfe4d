"""The embedded target: built by the project in the real layout, with a pretrained native MTP."""
import hashlib
import json

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from dmtp.families.mtp_loading import load_native_mtp
from dmtp.models.target import TargetModel
from dmtp.tiny.targets import build_tiny_target


@pytest.mark.slow
def test_build_micro_from_scratch_save_reload_and_load_mtp(tmp_path):
    path = build_tiny_target("micro", tmp_path / "micro", progress=False)
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["mtp_num_hidden_layers"] == 1
    # The causal LM alone in model.safetensors, listed by the index (what vLLM and transformers load);
    # the MTP apart in mtp.safetensors, under the Qwen3.5 names.
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert not any(k.startswith("mtp.") for k in keys) and "lm_head.weight" in keys
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {k: "model.safetensors" for k in keys}
    with safe_open(str(path / "mtp.safetensors"), "pt") as f:
        mtp_keys = set(f.keys())
    assert all(k.startswith("mtp.") for k in mtp_keys)
    for name in ("mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight",
                 "mtp.norm.weight", "mtp.layers.0.self_attn.q_proj.weight", "mtp.layers.0.mlp.down_proj.weight"):
        assert name in mtp_keys
    hf, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.mask_token == "<|mask|>" and tok.chat_template
    target = TargetModel(hf, str(path))
    mtp = load_native_mtp(path, target.embed_tokens, target.lm_head)
    assert mtp.fc.weight.shape == (config["hidden_size"], 2 * config["hidden_size"])
    report = json.loads((path / "build_report.json").read_text())
    assert set(report["heldout"]) == {"code", "prose", "math"}
    # provenance: the same recipe under another torch trains other weights, and the report says which these are
    assert report["built_with"]["torch"] == torch.__version__
    assert set(report["weights_sha256"]) == {"model.safetensors", "mtp.safetensors"}
    assert report["weights_sha256"]["mtp.safetensors"] == hashlib.sha256((path / "mtp.safetensors").read_bytes()).hexdigest()


def _heldout_ids(tokenizer, n=6, length=96):
    from dmtp.data.corpora import texts

    rows = []
    for domain in ("code", "math", "prose"):
        for text in texts(domain, "validation")[:n]:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"][:length]
            if len(ids) == length:
                rows.append(ids)
    return torch.tensor(rows)


def _mtp_top1(mtp, ids, hidden):
    g = mtp.forward_teacher(ids, hidden)
    return (mtp.logits(g[:, 1:-1]).argmax(-1) == ids[:, 2:]).float().mean().item()


@torch.no_grad()
def test_mtp_is_pretrained_and_reads_the_post_norm_hidden_embedding_first(micro_target_dir, micro_target, micro_mtp):
    tok = AutoTokenizer.from_pretrained(micro_target_dir)
    ids = _heldout_ids(tok)
    out = micro_target(ids)
    good = _mtp_top1(micro_mtp, ids, out.last_hidden)
    unigram = (ids[:, 2:] == torch.bincount(ids.flatten()).argmax()).float().mean().item()
    assert good > 0.3 and good > 4 * unigram, (good, unigram)

    # The runtime feeds the MTP the POST-norm state: last_hidden == final_norm(last layer's raw output).
    raw = micro_target.hf(ids, output_hidden_states=True)
    h = raw.hidden_states[0]
    pos = torch.arange(ids.shape[1])[None]
    emb = micro_target.hf.model.rotary_emb(h, pos)
    mask = torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool).tril()[None, None]
    for layer in micro_target.hf.model.layers:
        h = layer(h, attention_mask=mask, position_embeddings=emb, position_ids=pos)
        h = h[0] if isinstance(h, tuple) else h
    assert torch.allclose(micro_target.hf.model.norm(h), out.last_hidden, atol=1e-4)
    assert not torch.allclose(h, out.last_hidden, atol=1e-2)
    # Swapping the two halves of fc (hidden first instead of embedding first) collapses the MTP.
    half = micro_mtp.fc.weight.shape[1] // 2
    saved = micro_mtp.fc.weight.clone()
    micro_mtp.fc.weight.copy_(torch.cat([saved[:, half:], saved[:, :half]], dim=1))
    try:
        swapped = _mtp_top1(micro_mtp, ids, out.last_hidden)
    finally:
        micro_mtp.fc.weight.copy_(saved)
    # Measured on the micro target: good ~0.30, swapped ~0.01.
    assert swapped < 0.3 * good, (good, swapped)


def test_heldout_windows_cover_the_whole_stream_without_overlap():
    from dmtp.tiny.pretrain import spread_windows

    stream = torch.arange(1000)
    windows = spread_windows(stream, 50, 8)
    assert windows.shape == (8, 50)
    assert windows[0, 0] == 0 and windows[-1, -1] == 999          # from the first token to the last
    starts = windows[:, 0]
    assert (starts[1:] - starts[:-1] >= 50).all()                  # never overlapping
    assert spread_windows(stream, 300, 8).shape == (3, 300)         # capped by what fits
    assert spread_windows(stream[:40], 50, 8) is None
    assert torch.equal(spread_windows(stream[:50], 50, 8)[0], stream[:50])


def test_reevaluate_rewrites_the_heldout_figures_of_a_built_target(micro_target_dir, tmp_path):
    import shutil

    from dmtp.tiny.build import main as build_main
    from dmtp.tiny.targets import reevaluate_target

    path = shutil.copytree(micro_target_dir, tmp_path / "micro")
    report = json.loads((path / "build_report.json").read_text())
    report["heldout"] = {}
    (path / "build_report.json").write_text(json.dumps(report))
    build_main(["--preset", "micro", "--out", str(path), "--evaluate"])
    heldout = json.loads((path / "build_report.json").read_text())["heldout"]
    assert set(heldout) == {"code", "prose", "math"}
    for figures in heldout.values():
        assert figures["mtp_top1"] > 1.5 * figures["unigram_top1"], figures   # micro: ~2-4x
    with pytest.raises(FileNotFoundError, match="not a built dmtp target"):
        reevaluate_target(tmp_path)
