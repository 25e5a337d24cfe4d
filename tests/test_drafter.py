"""DFlash v1 drafter: checkpoint format, mask semantics, and many-blocks == one-block equivalence."""
import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from dmtp.drafters.checkpoint import load_drafter, save_drafter
from dmtp.drafters.dflash import DFlashConfig, DFlashDrafter, build_target_layer_ids, dflash_attention_mask

H, V, BS, S = 32, 64, 4, 20


ANCHORS = [3, 8, 14]


def make_config(**kw) -> DFlashConfig:
    base = dict(hidden_size=H, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, vocab_size=V, num_target_layers=6, target_layer_ids=[1, 4],
                mask_token_id=V - 1, block_size=BS)
    base.update(kw)
    return DFlashConfig(**base)


def make_drafter(seed=0, **kw) -> DFlashDrafter:
    torch.manual_seed(seed)
    d = DFlashDrafter(make_config(**kw)).eval()
    with torch.no_grad():  # non-trivial norm weights so a wrong name/shape would show up
        for name, p in d.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
    return d


def blocks(anchors, batch=1):
    """Flattened multi-block inputs: positions a+k, block ids j, limits a, all [batch, N*BS]."""
    pos = torch.tensor([a + k for a in anchors for k in range(BS)]).expand(batch, -1)
    bid = torch.tensor([j for j in range(len(anchors)) for _ in range(BS)]).expand(batch, -1)
    lim = torch.tensor([a for a in anchors for _ in range(BS)]).expand(batch, -1)
    return pos, bid, lim


def run(d, feats, ctx_pos, noise, pos, bid, lim):
    with torch.no_grad():
        ctx_kv = d.context_kv(d.project_context(feats), ctx_pos)
        return d(noise, pos, ctx_kv, ctx_pos, lim, bid)


def inputs(d, batch=1, seed=1):
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(batch, S, d.config.context_dim, generator=g)
    ctx_pos = torch.arange(S).expand(batch, -1)
    noise = torch.randn(batch, len(ANCHORS) * BS, H, generator=g)
    return feats, ctx_pos, noise


def block_slice(j):
    return slice(j * BS, (j + 1) * BS)


REFERENCE_KEYS = {"fc.weight", "hidden_norm.weight", "norm.weight"} | {
    f"layers.{i}.{n}.weight" for i in range(2) for n in [
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "self_attn.q_norm",
        "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
        "post_attention_layernorm"]}


# 1. checkpoint round trip ---------------------------------------------------------------------------------

def test_save_load_round_trip(tmp_path):
    d = make_drafter(layer_types=["sliding_attention", "full_attention"], sliding_window=6, is_causal=False,
                     output_multiplier=0.5, final_logit_softcapping=3.0, context_dim=48)
    extra = {"dmtp_injection.gate.weight": torch.randn(3, 5)}
    save_drafter(tmp_path, d, extra_tensors=extra, extra_config={"variant": "gated", "k": [1, 2]})

    assert set(load_file(str(tmp_path / "model.safetensors"))) == REFERENCE_KEYS | set(extra)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert cfg["tie_word_embeddings"] is False and cfg["is_causal"] is False and cfg["use_sliding_window"] is True
    dc = cfg["dflash_config"]
    assert (dc["mask_token_id"], dc["target_layer_ids"], dc["block_size"], dc["context_dim"]) == (V - 1, [1, 4], BS, 48)

    d2, extra2, extra_cfg = load_drafter(tmp_path)
    assert d2.config == d.config
    assert extra_cfg == {"variant": "gated", "k": [1, 2]}
    assert set(extra2) == set(extra) and torch.equal(extra2["dmtp_injection.gate.weight"], extra["dmtp_injection.gate.weight"])
    assert set(d2.state_dict()) == REFERENCE_KEYS

    feats, ctx_pos, noise = inputs(d)
    pos, bid, lim = blocks(ANCHORS)
    lm_head = torch.randn(V, H)
    a = d.logits(run(d, feats, ctx_pos, noise, pos, bid, lim), lm_head)
    b = d2.logits(run(d2, feats, ctx_pos, noise, pos, bid, lim), lm_head)
    assert torch.equal(a, b)
    assert a.abs().max() <= 3.0  # soft-capped


def test_default_context_dim_not_written_and_logit_scaling(tmp_path):
    d = make_drafter(output_multiplier=2.0)
    assert "context_dim" not in d.config.to_hf_config()["dflash_config"]
    assert "is_causal" not in d.config.to_hf_config()
    h, w = torch.randn(2, 3, H), torch.randn(V, H)
    assert torch.allclose(d.logits(h, w), 2.0 * h @ w.T)
    emb = torch.randn(V, H)
    assert torch.equal(d.embed_noise(torch.tensor([[1, V - 1]]), emb), emb[[1, V - 1]][None])


# 2. mask semantics ----------------------------------------------------------------------------------------

def test_context_visibility_is_strictly_before_anchor_per_block():
    d = make_drafter()
    feats, ctx_pos, noise = inputs(d)
    pos, bid, lim = blocks(ANCHORS)
    base = run(d, feats, ctx_pos, noise, pos, bid, lim)

    later = feats.clone()
    later[:, ANCHORS[1]:] += 1.0  # the anchor itself and everything after it
    out = run(d, later, ctx_pos, noise, pos, bid, lim)
    for j in (0, 1):
        assert torch.equal(out[:, block_slice(j)], base[:, block_slice(j)])
    assert not torch.allclose(out[:, block_slice(2)], base[:, block_slice(2)])

    before = feats.clone()
    before[:, ANCHORS[1] - 1] += 1.0
    out = run(d, before, ctx_pos, noise, pos, bid, lim)
    assert torch.equal(out[:, block_slice(0)], base[:, block_slice(0)])
    assert not torch.allclose(out[:, block_slice(1)], base[:, block_slice(1)])


def test_blocks_do_not_see_each_other_and_are_bidirectional_by_default():
    d = make_drafter()
    feats, ctx_pos, noise = inputs(d)
    pos, bid, lim = blocks(ANCHORS)
    base = run(d, feats, ctx_pos, noise, pos, bid, lim)
    other = noise.clone()
    other[:, block_slice(2)] += 1.0
    out = run(d, feats, ctx_pos, other, pos, bid, lim)
    assert torch.equal(out[:, :2 * BS], base[:, :2 * BS])
    last = noise.clone()
    last[:, BS + BS - 1] += 1.0  # last slot of block 1 changes its first slot (bidirectional)
    out = run(d, feats, ctx_pos, last, pos, bid, lim)
    assert not torch.allclose(out[:, BS], base[:, BS])


def test_causal_option_hides_later_slots():
    d = make_drafter(is_causal=True)
    assert all(d.config.is_causal_for(i) for i in range(2))
    feats, ctx_pos, noise = inputs(d)
    pos, bid, lim = blocks(ANCHORS)
    base = run(d, feats, ctx_pos, noise, pos, bid, lim)
    changed = noise.clone()
    changed[:, BS + 2] += 1.0
    out = run(d, feats, ctx_pos, changed, pos, bid, lim)
    assert torch.equal(out[:, BS:BS + 2], base[:, BS:BS + 2])
    assert not torch.allclose(out[:, BS + 3], base[:, BS + 3])


def test_sliding_window_limits_context_and_defaults_to_causal():
    w = 4
    d = make_drafter(layer_types=["sliding_attention"] * 2, sliding_window=w)
    assert d.config.is_causal_for(0) and d.config.window_for(0) == w
    feats, ctx_pos, noise = inputs(d)
    pos, bid, lim = blocks(ANCHORS)
    base = run(d, feats, ctx_pos, noise, pos, bid, lim)
    a = ANCHORS[2]
    far = feats.clone()
    far[:, :a - w + 1] += 1.0  # the anchor row (position a) sees context a-w+1 .. a-1 only
    out = run(d, far, ctx_pos, noise, pos, bid, lim)
    assert torch.equal(out[:, block_slice(2)], base[:, block_slice(2)])
    near = feats.clone()
    near[:, a - w + 1] += 1.0
    out = run(d, near, ctx_pos, noise, pos, bid, lim)
    assert not torch.allclose(out[:, 2 * BS], base[:, 2 * BS])


def test_mask_builder_explicit():
    pos = torch.tensor([[5, 6, 7, 9, 10, 11]])
    bid = torch.tensor([[0, 0, 0, 1, 1, 1]])
    lim = torch.tensor([[5, 5, 5, 9, 9, 9]])
    ctx = torch.tensor([[0, 3, 4, 5, 8, 10 ** 6]])  # last slot is padding
    m = dflash_attention_mask(pos, ctx, lim, bid, causal=True, window=3)[0, 0].int()
    expected = torch.tensor([
        # ctx: 0 3 4 5 8 pad | block: 5 6 7 9 10 11
        [0, 1, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0],
        [0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0],
        [0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0],
        [0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 0],
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1]])
    assert torch.equal(m, expected)
    full = dflash_attention_mask(pos, ctx, lim, bid)[0, 0].int()
    assert full[:3, :6].tolist() == [[1, 1, 1, 0, 0, 0]] * 3 and full[0, 6:].tolist() == [1, 1, 1, 0, 0, 0]


def test_padding_context_slots_are_invisible():
    d = make_drafter()
    feats, ctx_pos, noise = inputs(d)
    pos, bid, lim = blocks(ANCHORS)
    base = run(d, feats, ctx_pos, noise, pos, bid, lim)
    pad_feats = torch.cat([feats, 100 * torch.randn(1, 3, feats.shape[-1])], dim=1)
    pad_pos = torch.cat([ctx_pos, torch.full((1, 3), 10 ** 6)], dim=1)
    out = run(d, pad_feats, pad_pos, noise, pos, bid, lim)
    assert torch.allclose(out, base, atol=1e-6)


# 3. many blocks in one call == one block per call ---------------------------------------------------------

@pytest.mark.parametrize("kw", [{}, {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 5}])
def test_flattened_blocks_equal_single_block_calls(kw):
    d = make_drafter(**kw)
    batch = 2
    feats, ctx_pos, noise = inputs(d, batch=batch)
    anchors = [ANCHORS, [2, 9, 16]]  # each batch row has its own anchors
    pos = torch.stack([blocks(a)[0][0] for a in anchors])
    bid = torch.stack([blocks(a)[1][0] for a in anchors])
    lim = torch.stack([blocks(a)[2][0] for a in anchors])
    flat = run(d, feats, ctx_pos, noise, pos, bid, lim)
    for j in range(len(ANCHORS)):
        sl = block_slice(j)
        zeros = torch.zeros(batch, BS, dtype=torch.long)
        alone = run(d, feats, ctx_pos, noise[:, sl], pos[:, sl], zeros, lim[:, sl])
        torch.testing.assert_close(alone, flat[:, sl], atol=1e-5, rtol=1e-5)
        for b in range(batch):  # decoding: the context is exactly the tokens before the anchor
            a = anchors[b][j]
            crop = run(d, feats[b:b + 1, :a], ctx_pos[b:b + 1, :a], noise[b:b + 1, sl], pos[b:b + 1, sl],
                       zeros[:1], lim[b:b + 1, sl])
            torch.testing.assert_close(crop, flat[b:b + 1, sl], atol=1e-5, rtol=1e-5)


# 4. load errors ------------------------------------------------------------------------------------------

def _one_line_error(exc_type, path, match):
    with pytest.raises(exc_type) as e:
        load_drafter(path)
    msg = str(e.value)
    assert "\n" not in msg and match in msg, msg


def test_load_errors(tmp_path):
    d = make_drafter()
    good = tmp_path / "good"
    save_drafter(good, d)
    weights = load_file(str(good / "model.safetensors"))

    _one_line_error(FileNotFoundError, tmp_path / "nope", "nope")
    for name in ("config.json", "model.safetensors"):
        broken = tmp_path / f"no_{name}"
        save_drafter(broken, d)
        os.remove(broken / name)
        _one_line_error(FileNotFoundError, broken, name)

    def variant(name, tensors):
        p = tmp_path / name
        save_drafter(p, d)
        save_file(tensors, str(p / "model.safetensors"))
        return p

    missing = dict(weights)
    del missing["layers.1.self_attn.k_norm.weight"]
    _one_line_error(ValueError, variant("missing", missing), "layers.1.self_attn.k_norm.weight")
    shape = dict(weights, **{"fc.weight": torch.zeros(H, 7)})
    _one_line_error(ValueError, variant("shape", shape), "fc.weight")
    unexpected = dict(weights, **{"layers.0.attention_conv.base_kernel": torch.zeros(2)})
    _one_line_error(ValueError, variant("unexpected", unexpected), "layers.0.attention_conv.base_kernel")
    with pytest.raises(ValueError):
        save_drafter(tmp_path / "clash", d, extra_tensors={"layers.9.x": torch.zeros(1)})


# 5. config formats and default taps ----------------------------------------------------------------------

def test_from_hf_config_formats():
    c = make_config(layer_types=["sliding_attention", "full_attention"], sliding_window=8)
    assert DFlashConfig.from_hf_config(c.to_hf_config()) == c
    assert not c.is_causal_for(1) and c.window_for(1) is None and c.is_causal_for(0)

    old = {k: v for k, v in c.to_hf_config().items() if k != "dflash_config"}
    old.update(block_size=16, mask_token_id=7, target_layer_ids=[0, 5])
    o = DFlashConfig.from_hf_config(old)
    assert (o.block_size, o.mask_token_id, o.target_layer_ids, o.context_dim) == (16, 7, [0, 5], 2 * H)

    no_ids = {k: v for k, v in old.items() if k != "target_layer_ids"}
    no_ids["num_target_layers"] = 36
    assert DFlashConfig.from_hf_config(no_ids).target_layer_ids == build_target_layer_ids(36, 2) == [1, 33]
    with pytest.raises(ValueError, match="mask_token_id"):
        DFlashConfig.from_hf_config({k: v for k, v in old.items() if k != "mask_token_id"})


def test_build_target_layer_ids():
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert build_target_layer_ids(64, 5) == [1, 16, 31, 46, 61]
    assert build_target_layer_ids(52, 5) == [1, 13, 25, 37, 49]
    assert build_target_layer_ids(36, 1) == [18]
    for t in range(1, 9):
        for n in range(1, 6):
            ids = build_target_layer_ids(t, n)
            assert len(ids) == n and all(0 <= i < t for i in ids)
            if t <= 4:  # small targets: evenly spread over 0..T-1, distinct whenever n <= T
                assert len(set(ids)) == min(n, t) and (n == 1 or (ids[0], ids[-1]) == (0, t - 1))
    assert build_target_layer_ids(4, 3) == [0, 2, 3]
