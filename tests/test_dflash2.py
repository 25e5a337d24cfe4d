"""DFlash2 drafter: identity at init (== DFlash), published checkpoint layout, causal and block-local
convolutions, the selector's greedy recursion and sampling, the selector loss and its schedule, and
training every injection variant with `drafter=dflash2` on the micro target."""
import itertools
import json
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file, save_file

from dmtp.drafters.dflash2 import (SHAPE_KEYS, TRAINING_KEYS, DFlash2Config, DFlash2Drafter, GroupedDynamicCausalConv,
                                   causal_conv_taps, walk_candidates)
from dmtp.drafters.checkpoint import load_drafter, save_drafter
from dmtp.drafters.dflash import DFlashConfig, DFlashDrafter, default_sampler
from tests.test_drafter import blocks, run  # the same flattened multi-block inputs as the v1 tests

H, V, BS, S, K = 32, 40, 4, 20, 4
ANCHORS = [3, 8, 14]
DFLASH2 = dict(conv_kernel_size=2, conv_group_size=8, selector_rank=6, selector_top_k=K)


def make_config(**kw) -> DFlash2Config:
    base = dict(hidden_size=H, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, vocab_size=V, num_target_layers=6, target_layer_ids=[1, 4],
                mask_token_id=V - 1, block_size=BS, **DFLASH2)
    base.update(kw)
    return DFlash2Config(**base)


def make_drafter(seed=0, trained=False, **kw) -> DFlash2Drafter:
    """trained=False: fresh DFlash2 (identity convs, zero successor codebook) with non-trivial norms;
    trained=True: every DFlash2 parameter randomised too."""
    torch.manual_seed(seed)
    d = DFlash2Drafter(make_config(**kw)).eval()
    with torch.no_grad():
        for name, p in d.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
            elif trained and ("_conv." in name or name.startswith("candidate_selector.")):
                p.add_(0.3 * torch.randn_like(p))
    return d


def inputs(d, batch=1, seed=1):
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(batch, S, d.config.context_dim, generator=g)
    noise = torch.randn(batch, len(ANCHORS) * BS, H, generator=g)
    return feats, torch.arange(S).expand(batch, -1), noise


V1_KEYS = {"fc.weight", "hidden_norm.weight", "norm.weight"} | {
    f"layers.{i}.{n}.weight" for i in range(2) for n in [
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "self_attn.q_norm",
        "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
        "post_attention_layernorm"]}
DFLASH2_KEYS = V1_KEYS | {f"layers.{i}.{c}.{n}" for i in range(2) for c in ("attention_conv", "mlp_conv")
                          for n in ("base_kernel", "kernel_projection.weight")} | {
    "candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook",
    "candidate_selector.hidden_projection.weight"}


# 1. a fresh DFlash2 is DFlash ------------------------------------------------------------------------------

def test_fresh_dflash2_is_exactly_dflash():
    d2 = make_drafter()
    for layer in d2.layers:
        for conv in (layer.attention_conv, layer.mlp_conv):
            assert conv.base_kernel[:, 0].eq(1).all() and conv.base_kernel[:, 1:].eq(0).all()
            assert torch.count_nonzero(conv.kernel_projection.weight) == 0
    sel = d2.candidate_selector
    assert torch.count_nonzero(sel.successor_codebook) == 0
    assert 0.01 < sel.predecessor_codebook.std().item() < 0.03
    v1_cfg = {k: v for k, v in vars(d2.config).items() if k not in DFLASH2 and not k.startswith("selector_")}
    d1 = DFlashDrafter(DFlashConfig(**v1_cfg)).eval()
    assert set(d1.state_dict()) == V1_KEYS
    d1.load_state_dict({k: v for k, v in d2.state_dict().items() if k in V1_KEYS}, strict=True)

    feats, ctx_pos, noise = inputs(d2, batch=2)
    pos, bid, lim = blocks(ANCHORS, batch=2)
    h1, h2 = run(d1, feats, ctx_pos, noise, pos, bid, lim), run(d2, feats, ctx_pos, noise, pos, bid, lim)
    assert torch.equal(h1, h2)
    lm_head = torch.randn(V, H)
    assert torch.equal(d1.logits(h1, lm_head), d2.logits(h2, lm_head))
    hid = h2.view(2, len(ANCHORS), BS, H)[:, :, 1:]              # [B, N, n_pred, H]
    first = torch.randint(0, V, (2, len(ANCHORS)))
    t1, q1 = d1.propose(hid, lm_head, first)
    t2, q2 = d2.propose(hid, lm_head, first)
    assert q1 is None and q2 is None and torch.equal(t1, t2)
    assert torch.equal(t2, d2.logits(hid, lm_head).argmax(-1))
    # v1's generic hooks: no auxiliary loss, and temperature sampling from softmax(logits / T).
    labels = torch.randint(0, V, hid.shape[:-1])
    assert d1.auxiliary_loss(hid, lm_head, labels, labels, torch.ones(labels.shape)).item() == 0.0
    assert d1.auxiliary_loss_name is None and d2.auxiliary_loss_name == "selector_loss"
    tok, q = d1.propose(hid, lm_head, first, temperature=0.7, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(q, torch.softmax(d1.logits(hid, lm_head) / 0.7, -1))
    assert tok.shape == hid.shape[:-1]


# 2. checkpoints --------------------------------------------------------------------------------------------

def test_round_trip_keeps_names_config_and_outputs(tmp_path):
    d = make_drafter(trained=True, layer_types=["sliding_attention"] * 2, sliding_window=6, is_causal=False,
                     output_multiplier=0.5, final_logit_softcapping=3.0, selector_gold_outside_topk="skip",
                     selector_warmup_steps=3)
    save_drafter(tmp_path, d, extra_tensors={"dmtp_injection.w": torch.ones(2)}, extra_config={"x": 1})
    assert set(load_file(str(tmp_path / "model.safetensors"))) == DFLASH2_KEYS | {"dmtp_injection.w"}
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["DFlash2DraftModel"]
    dc = cfg["dflash_config"]
    assert (dc["conv_kernel_size"], dc["conv_group_size"], dc["selector_rank"], dc["selector_top_k"]) == (2, 8, 6, K)
    assert (dc["output_multiplier"], dc["final_logit_softcapping"]) == (0.5, 3.0)
    d2, extras, meta = load_drafter(tmp_path)
    # The selector's training schedule is not part of the export: it loads as the defaults.
    assert type(d2) is DFlash2Drafter and d2.config == replace(d.config, selector_gold_outside_topk="replace",
                                                               selector_warmup_steps=0)
    assert meta == {"x": 1} and set(extras) == {"dmtp_injection.w"}
    feats, ctx_pos, noise = inputs(d)
    pos, bid, lim = blocks(ANCHORS)
    lm_head = torch.randn(V, H)
    a, b = run(d, feats, ctx_pos, noise, pos, bid, lim), run(d2, feats, ctx_pos, noise, pos, bid, lim)
    assert torch.equal(d.logits(a, lm_head), d2.logits(b, lm_head))
    first = torch.tensor([5])
    assert torch.equal(d.propose(a[:, 1:BS], lm_head, first)[0], d2.propose(b[:, 1:BS], lm_head, first)[0])


def test_published_dflash2_checkpoint_loads(tmp_path):
    """A checkpoint written the way the published DFlash2 drafters are: BF16 tensors under the published
    names, a config with only the published dflash_config keys (no dmtp training options)."""
    src = make_drafter(trained=True)
    tensors = {k: v.to(torch.bfloat16) for k, v in src.state_dict().items()}
    assert tensors["layers.0.attention_conv.kernel_projection.weight"].shape == (2 * 2 * (H // 8), H)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    config = {
        "architectures": ["DFlash2DraftModel"], "model_type": "qwen3", "hidden_size": H, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "vocab_size": V, "rms_norm_eps": 1e-6, "rope_theta": 1e6, "num_target_layers": 6, "is_causal": False,
        "layer_types": ["sliding_attention"] * 2, "sliding_window": 2048, "tie_word_embeddings": False,
        "dflash_config": {"block_size": BS, "conv_group_size": 8, "conv_kernel_size": 2,
                          "final_logit_softcapping": 20.0, "mask_token_id": V - 1, "output_multiplier": 0.25,
                          "selector_rank": 6, "selector_top_k": K, "target_layer_ids": [1, 4]}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    d, _, _ = load_drafter(tmp_path)
    c = d.config
    assert type(d) is DFlash2Drafter and (c.selector_alpha, c.selector_gold_outside_topk) == (1.0, "replace")
    assert (c.output_multiplier, c.final_logit_softcapping, c.is_causal) == (0.25, 20.0, False)
    assert set(d.state_dict()) == DFLASH2_KEYS
    assert all(torch.equal(d.state_dict()[k], v.float()) for k, v in tensors.items())
    # Re-saving keeps the published names (and adds only dmtp's own dflash_config keys).
    save_drafter(tmp_path / "again", d)
    assert set(load_file(str(tmp_path / "again" / "model.safetensors"))) == DFLASH2_KEYS


def test_training_schedule_is_not_exported_but_old_exports_still_load(tmp_path):
    """The selector's training schedule configures training only: config.json never carries it. An older
    dmtp export that wrote it under dflash_config still loads, with its values."""
    d = make_drafter(selector_alpha=0.5, selector_warmup_steps=3, selector_ramp_steps=4,
                     selector_gold_outside_topk="skip")
    save_drafter(tmp_path / "new", d)
    cfg = json.loads((tmp_path / "new" / "config.json").read_text())
    assert not set(TRAINING_KEYS) & (set(cfg) | set(cfg["dflash_config"]))
    assert set(SHAPE_KEYS) <= set(cfg["dflash_config"])
    cfg["dflash_config"].update(selector_alpha=0.5, selector_warmup_steps=3, selector_ramp_steps=4,
                                selector_gold_outside_topk="skip")
    (tmp_path / "new" / "config.json").write_text(json.dumps(cfg))
    old, _, _ = load_drafter(tmp_path / "new")
    assert old.config == d.config


def test_architecture_mismatches_fail_clearly(tmp_path):
    d = make_drafter()
    save_drafter(tmp_path / "v2", d)
    cfg = json.loads((tmp_path / "v2" / "config.json").read_text())
    del cfg["dflash_config"]["selector_top_k"]
    (tmp_path / "v2" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="selector_top_k"):
        load_drafter(tmp_path / "v2")
    # A DFlash v1 config over DFlash2 tensors: the extra drafter tensors are an error, not "extras".
    save_drafter(tmp_path / "v1", d)
    cfg = json.loads((tmp_path / "v1" / "config.json").read_text())
    cfg["architectures"] = ["DFlashDraftModel"]
    (tmp_path / "v1" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="unexpected drafter tensor"):
        load_drafter(tmp_path / "v1")
    with pytest.raises(ValueError, match="must divide"):
        make_config(conv_group_size=5)
    with pytest.raises(ValueError, match="replace"):
        make_config(selector_gold_outside_topk="nope")


# 3. the convolution: causal, block-local, grouped ------------------------------------------------------------

def naive_conv(conv: GroupedDynamicCausalConv, u, z, side, block_ids):
    """The definition, one slot and channel at a time."""
    b, t, h = z.shape
    d = conv.kernel_projection(u).view(b, t, 2, conv.kernel_size, conv.num_groups)
    out = torch.zeros_like(z)
    for i in range(b):
        for s in range(t):
            for c in range(h):
                for o in range(conv.kernel_size):
                    if s - o >= 0 and block_ids[i, s - o] == block_ids[i, s]:
                        w = conv.base_kernel[side, o, c] + d[i, s, side, o, c // conv.group_size]
                        out[i, s, c] += w * z[i, s - o, c]
    return out


@pytest.mark.parametrize("kernel_size", [2, 3])
def test_conv_matches_definition_and_is_causal_and_block_local(kernel_size):
    torch.manual_seed(0)
    h, t = 8, 7
    conv = GroupedDynamicCausalConv(h, kernel_size, group_size=4)
    with torch.no_grad():
        conv.base_kernel.normal_()
        conv.kernel_projection.weight.normal_()
    u, z = torch.randn(2, t, h), torch.randn(2, t, h)
    block_ids = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0]])
    taps = causal_conv_taps(block_ids, kernel_size)

    def apply(u, z):
        with torch.no_grad():
            kern = conv.kernels(u)
            return torch.stack([conv.mix(z, kern[:, :, side], taps) for side in (0, 1)])

    base = apply(u, z)
    with torch.no_grad():
        for side in (0, 1):
            torch.testing.assert_close(base[side], naive_conv(conv, u, z, side, block_ids))
    for j in range(t):
        u2, z2 = u.clone(), z.clone()
        u2[:, j] += 1.0
        z2[:, j] += 1.0
        out = apply(u2, z2)
        assert torch.equal(out[:, :, :j], base[:, :, :j])          # earlier slots never see slot j
        assert not torch.allclose(out[:, :, j], base[:, :, j])
        if j < 3:   # row 0's second block (slots 3..6) never sees its first block
            assert torch.equal(out[:, 0, 3:], base[:, 0, 3:])
    # ... and equals that block run alone (to rounding: a forward of another shape may sum in another order).
    with torch.no_grad():
        kern = conv.kernels(u[:1, 3:])
        alone = conv.mix(z[:1, 3:], kern[:, :, 1], causal_conv_taps(torch.zeros(1, 4, dtype=torch.long), kernel_size))
    torch.testing.assert_close(alone, base[1, :1, 3:], rtol=1e-5, atol=1e-6)


def test_layer_with_causal_attention_is_causal_through_the_convs():
    d = make_drafter(trained=True, is_causal=True, conv_kernel_size=3)
    feats, ctx_pos, noise = inputs(d)
    pos, bid, lim = blocks(ANCHORS)
    base = run(d, feats, ctx_pos, noise, pos, bid, lim)
    for j in range(1, BS):
        changed = noise.clone()
        changed[:, BS + j] += 1.0
        out = run(d, feats, ctx_pos, changed, pos, bid, lim)
        assert torch.equal(out[:, :BS + j], base[:, :BS + j])       # earlier slots and the previous block
        assert torch.equal(out[:, 2 * BS:], base[:, 2 * BS:])       # the next block
        assert not torch.allclose(out[:, BS + j], base[:, BS + j])


@pytest.mark.parametrize("kw", [{}, {"is_causal": True, "conv_kernel_size": 3}])
def test_flattened_blocks_equal_single_block_calls(kw):
    d = make_drafter(trained=True, **kw)
    batch = 2
    feats, ctx_pos, noise = inputs(d, batch=batch)
    anchors = [ANCHORS, [2, 9, 16]]
    pos = torch.stack([blocks(a)[0][0] for a in anchors])
    bid = torch.stack([blocks(a)[1][0] for a in anchors])
    lim = torch.stack([blocks(a)[2][0] for a in anchors])
    flat = run(d, feats, ctx_pos, noise, pos, bid, lim)
    for j in range(len(ANCHORS)):
        sl = slice(j * BS, (j + 1) * BS)
        zeros = torch.zeros(batch, BS, dtype=torch.long)
        alone = run(d, feats, ctx_pos, noise[:, sl], pos[:, sl], zeros, lim[:, sl])
        torch.testing.assert_close(alone, flat[:, sl], atol=1e-5, rtol=1e-5)


# 4. the selector ----------------------------------------------------------------------------------------------

def selector_case(seed=0, v=20, k=4, n=3, batch=4):
    """A selector whose pairwise term is as large as the gaps between unary scores, so that the choice
    at each slot really depends on the predecessor."""
    torch.manual_seed(seed)
    d = make_drafter(seed=seed, trained=True, vocab_size=v, mask_token_id=v - 1, selector_top_k=k)
    with torch.no_grad():
        d.candidate_selector.predecessor_codebook.normal_()
        d.candidate_selector.successor_codebook.normal_()
    return d, torch.randn(batch, n, H), torch.randn(v, H) / 3, torch.randint(0, v, (batch,))


def test_greedy_selector_path_is_the_greedy_recursion_over_the_lattice():
    d, hidden, lm_head, first = selector_case()
    k, n = d.config.selector_top_k, hidden.shape[1]
    with torch.no_grad():
        tokens, q = d.propose(hidden, lm_head, first)
        assert q is None
        u, cand = d.logits(hidden, lm_head).topk(k, dim=-1)
        sel = d.candidate_selector
        proj = hidden @ sel.hidden_projection.weight.T
        for b in range(hidden.shape[0]):
            def step_scores(i, prev):  # the K scores of slot i given predecessor token `prev`
                return torch.stack([u[b, i, j] + (sel.predecessor_codebook[prev] * proj[b, i]
                                                  * sel.successor_codebook[cand[b, i, j]]).sum() for j in range(k)])
            consistent = []
            for path in itertools.product(range(k), repeat=n):   # all K^n candidate paths
                prev, ok = int(first[b]), True
                for i, j in enumerate(path):
                    ok &= int(step_scores(i, prev).argmax()) == j
                    prev = int(cand[b, i, j])
                if ok:
                    consistent.append([int(cand[b, i, j]) for i, j in enumerate(path)])
            assert consistent == [tokens[b].tolist()]
        # The case is sensitive: the path differs from the unary argmax, and from the choices made with
        # the first predecessor kept for every slot (a recursion that forgot its previous choice).
        assert not torch.equal(tokens, cand[..., 0])
        stale = torch.stack([sel.scores(u[:, i], cand[:, i], first, sel.query(hidden[:, i])).argmax(-1)
                             for i in range(n)], -1)
        assert not torch.equal(tokens, cand.gather(-1, stale[..., None])[..., 0])


def test_a_rank_indexed_score_table_walks_to_the_same_path():
    """vLLM's proposer scores every (slot, previous rank, candidate) at once and walks the table by rank; dmtp
    scores slot by slot from the previous token. Both go through `walk_candidates`: the same tokens."""
    d, hidden, lm_head, first = selector_case(seed=4)
    k, n = d.config.selector_top_k, hidden.shape[1]
    with torch.no_grad():
        tokens, _ = d.propose(hidden, lm_head, first)
        u, cand = d.candidates(d.logits(hidden, lm_head))
        sel = d.candidate_selector
        query = sel.query(hidden)
        table = torch.zeros(hidden.shape[0], n, k, k)   # [B, slot, previous rank, candidate]
        for i in range(n):
            for r in range(k):   # slot 1's rows are all the anchor's
                prev = first if i == 0 else cand[:, i - 1, r]
                table[:, i, r] = sel.scores(u[:, i], cand[:, i], prev, query[:, i])
        rows = torch.arange(hidden.shape[0])
        walked, probs = walk_candidates(cand, lambda i, _tok, rank: table[rows, i, rank], first, default_sampler())
    assert probs is None and torch.equal(walked, tokens)
    assert not torch.equal(tokens, cand[..., 0])   # the selector moves the path off the unary argmax here


def test_zero_successor_codebook_gives_the_unary_argmax():
    d, hidden, lm_head, first = selector_case(seed=1)
    with torch.no_grad():
        d.candidate_selector.successor_codebook.zero_()
        tokens, _ = d.propose(hidden, lm_head, first)
    assert torch.equal(tokens, d.logits(hidden, lm_head).argmax(-1))


def test_sampling_scatters_the_selector_distribution_over_the_vocabulary():
    d, hidden, lm_head, first = selector_case(seed=2)
    temp = 0.8
    with torch.no_grad():
        tokens, q = d.propose(hidden, lm_head, first, temperature=temp, generator=torch.Generator().manual_seed(3))
        again, _ = d.propose(hidden, lm_head, first, temperature=temp, generator=torch.Generator().manual_seed(3))
        assert torch.equal(tokens, again)
        u, cand = d.logits(hidden, lm_head).topk(d.config.selector_top_k, dim=-1)
        sel = d.candidate_selector
        prev = first
        for i in range(hidden.shape[1]):
            expected = torch.softmax(sel.scores(u[:, i], cand[:, i], prev, sel.query(hidden[:, i])) / temp, -1)
            torch.testing.assert_close(q[:, i].gather(-1, cand[:, i]), expected)
            torch.testing.assert_close(q[:, i].sum(-1), torch.ones(hidden.shape[0]))
            assert (cand[:, i] == tokens[:, i, None]).any(-1).all()      # a sampled token is a candidate
            prev = tokens[:, i]


def loss_case(mode="replace", **kw):
    d = make_drafter(trained=True, selector_gold_outside_topk=mode, **kw).train()
    g = torch.Generator().manual_seed(5)
    hidden, lm_head = torch.randn(6, 5, H, generator=g), torch.randn(V, H, generator=g)
    labels = torch.randint(0, V, (6, 5), generator=g)
    prev = torch.cat([torch.randint(0, V, (6, 1), generator=g), labels[:, :-1]], 1)
    weights = torch.exp(-torch.arange(5.0) / 4).expand(6, -1).clone()
    weights[0, 3:] = 0
    return d, hidden, lm_head, labels, prev, weights


def test_selector_loss_is_finite_learns_and_follows_its_definition():
    d, hidden, lm_head, labels, prev, weights = loss_case(selector_alpha=0.5)
    sel = d.candidate_selector
    loss = d.auxiliary_loss(hidden, lm_head, labels, prev, weights)
    assert torch.isfinite(loss) and loss > 0
    # By hand: gold outside the top-K takes the weakest slot with its own unary score.
    with torch.no_grad():
        logits = d.logits(hidden, lm_head)
        u, cand = logits.topk(K, -1)
        total = 0.0
        for b, i in itertools.product(range(6), range(5)):
            c, s, gold = cand[b, i].clone(), u[b, i].clone(), int(labels[b, i])
            if gold not in c.tolist():
                c[-1], s[-1] = gold, logits[b, i, gold]
            scores = sel.scores(s, c, prev[b, i], sel.query(hidden[b, i]))
            total += weights[b, i] * -torch.log_softmax(scores, -1)[c.tolist().index(gold)]
        torch.testing.assert_close(loss.detach(), 0.5 * total / weights.sum())
    opt = torch.optim.Adam(sel.parameters(), lr=3e-2)
    losses = []
    for _ in range(25):
        loss = d.auxiliary_loss(hidden, lm_head, labels, prev, weights)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < 0.5 * losses[0], losses


def test_skip_mode_ignores_gold_outside_top_k():
    d, hidden, lm_head, labels, prev, weights = loss_case(mode="skip")
    with torch.no_grad():
        logits = d.logits(hidden, lm_head)
        outside = logits.topk(V - K, -1, largest=False).indices[..., 0]     # surely not in the top-K
        assert d.auxiliary_loss(hidden, lm_head, outside, prev, weights).item() == 0.0
        d.config.selector_gold_outside_topk = "replace"
        assert d.auxiliary_loss(hidden, lm_head, outside, prev, weights).item() > 0.0


def test_selector_alpha_warm_up_and_ramp():
    d, hidden, lm_head, labels, prev, weights = loss_case(selector_alpha=2.0, selector_warmup_steps=3,
                                                          selector_ramp_steps=4)
    assert [d.selector_alpha_at(s) for s in range(9)] == [0, 0, 0, 0.5, 1.0, 1.5, 2.0, 2.0, 2.0]
    assert d.selector_alpha_at(None) == 2.0
    zero = d.auxiliary_loss(hidden, lm_head, labels, prev, weights, step=2)
    assert zero.item() == 0.0 and not zero.requires_grad
    full = d.auxiliary_loss(hidden, lm_head, labels, prev, weights, step=100)
    half = d.auxiliary_loss(hidden, lm_head, labels, prev, weights, step=4)
    torch.testing.assert_close(half, full / 2)


# 5. training with drafter=dflash2 ------------------------------------------------------------------------------

def test_dflash2_config_composes_and_every_variant_trains():
    from dmtp.configs import compose_train
    from dmtp.injection import VARIANTS
    from dmtp.training.components import build_components

    for name in sorted(VARIANTS):
        torch.manual_seed(0)
        cfg = compose_train([f"injection={name}", "drafter=dflash2", "drafter.num_layers=1"])
        assert cfg.drafter.architecture == "dflash2"
        _, _, _, module = build_components(cfg)
        drafter, inj = module.drafter.backbone, module.drafter.injection
        assert type(drafter) is DFlash2Drafter and drafter.config.conv_group_size == 16
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(10, 400, (2, 48), generator=g)
        mask = torch.ones_like(ids)

        seen = {}
        original = drafter.auxiliary_loss

        def spy(hidden, lm_head_weight, labels, prev_tokens, weights, **kw):
            seen.update(labels=labels, prev=prev_tokens)
            return original(hidden, lm_head_weight, labels, prev_tokens, weights, **kw)

        drafter.auxiliary_loss = spy
        opt = torch.optim.AdamW(list(drafter.parameters()) + list(inj.parameters()), lr=1e-3)
        for step in range(2):
            loss, acc, n = module.block_loss(ids, mask, generator=torch.Generator().manual_seed(step), step=step)
            opt.zero_grad()
            loss.backward()
            assert torch.isfinite(loss) and n > 0 and module.last_auxiliary_loss > 0, name
            assert drafter.candidate_selector.successor_codebook.grad.abs().sum() > 0, name
            assert drafter.layers[0].mlp_conv.kernel_projection.weight.grad.abs().sum() > 0, name
            opt.step()
        # Teacher-forced predecessors: the data token one position before each predicted slot.
        labels, prev = seen["labels"], seen["prev"]
        assert torch.equal(prev[..., 1:], labels[..., :-1])
        anchors, keep = sample_anchors_for(module, ids, mask, step=1)
        first_pos = anchors + inj.first_slot_offset + inj.first_predicted_slot - 1   # A or T1
        assert torch.equal(prev[..., 0][keep], ids.gather(1, first_pos)[keep]), name


def test_init_from_a_dflash2_export_trains_on_the_runs_selector_schedule(tmp_path):
    """An export carries no training schedule: continuing one (`init_from`) takes the run's drafter options."""
    from dmtp.configs import compose_train
    from dmtp.training.components import build_components

    _, _, _, module = build_components(compose_train(["drafter=dflash2", "drafter.num_layers=1"]))
    save_drafter(tmp_path / "export", module.drafter.backbone)
    cfg = compose_train(["drafter=dflash2", "drafter.selector_warmup_steps=7", "drafter.selector_alpha=0.25",
                         f"init_from={tmp_path / 'export'}"])
    _, _, _, module = build_components(cfg)
    backbone = module.drafter.backbone
    assert (backbone.config.selector_warmup_steps, backbone.config.selector_alpha) == (7, 0.25)
    assert backbone.selector_alpha_at(6) == 0.0 and backbone.selector_alpha_at(7) == 0.25


def sample_anchors_for(module, ids, mask, step):
    from dmtp.training.blocks import sample_anchors, valid_anchors

    return sample_anchors(valid_anchors(module.drafter.injection, mask), module.num_anchors,
                          torch.Generator().manual_seed(step))


@pytest.mark.parametrize("name", ["raw_dflash", "dual_anchor_zero_init"])
def test_dflash2_decoding_is_lossless_and_uses_the_selector(micro_target, micro_mtp, name):
    """DFlash2 inside the one loop: exact greedy output at batch 1, 3 and 8, selector path included."""
    from dmtp.drafters.block_drafter import BlockDrafter
    from dmtp.decode import build_proposer
    from dmtp.families.decoding import spec_decoder
    from dmtp.injection.catalogue import make_injection
    from dmtp.drafters.dflash2 import DFlash2Config, DFlash2Drafter
    from dmtp.drafters.dflash import build_target_layer_ids

    cfg = micro_target.config
    ids = build_target_layer_ids(cfg.num_hidden_layers, 1)
    inj = make_injection(name, cfg.hidden_size, len(ids), 3, 8)
    dcfg = DFlash2Config(hidden_size=cfg.hidden_size, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
                         head_dim=cfg.head_dim, vocab_size=cfg.vocab_size, num_target_layers=cfg.num_hidden_layers,
                         target_layer_ids=ids, mask_token_id=3, context_dim=inj.context_dim,
                         conv_kernel_size=2, conv_group_size=16, selector_rank=8, selector_top_k=4)
    torch.manual_seed(0)
    drafter = BlockDrafter(DFlash2Drafter(dcfg), inj).eval()
    with torch.no_grad():
        drafter.backbone.candidate_selector.successor_codebook.normal_(std=0.5)   # make the selector matter
    prompts = [[5 + i, 40 + 3 * i, 77, 12 + i, 9] for i in range(8)]
    ref = spec_decoder(micro_target, build_proposer("ar", micro_target)).generate(prompts, max_new_tokens=20)
    proposer = build_proposer("drafter", micro_target, mtp=micro_mtp, drafter=drafter)
    for batch in (1, 3, 8):
        res = spec_decoder(micro_target, proposer).generate(prompts, max_new_tokens=20, batch_size=batch)
        assert res.tokens == ref.tokens
