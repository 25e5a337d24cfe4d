"""DSpark (dmtp/drafters/dspark.py): a fresh drafter is DFlash; the Markov head's sequential proposal equals its
teacher-forced logits on the same path (training and decoding agree) for every head variant; q is the
distribution each candidate was drawn from; the confidence head's BCE; the published vLLM layout round-trips;
every injection variant trains with it; decoding is lossless and equals the reference round."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from dmtp.decode import SamplingConfig, build_proposer
from dmtp.families.decoding import spec_decoder
from dmtp.decode.reference import reference_generate, reference_proposal
from dmtp.drafters.block_drafter import fresh_drafter_for, load_block_drafter
from dmtp.drafters.checkpoint import load_drafter, save_drafter
from dmtp.drafters.dflash import DFlashConfig, DFlashDrafter
from dmtp.drafters.dspark import DSparkConfig, DSparkDrafter, MARKOV_VARIANTS
from dmtp.injection import VARIANTS

V = 50


def make_config(cls=DSparkConfig, **kw):
    base = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, head_dim=16, vocab_size=V, num_target_layers=4, target_layer_ids=[1],
                mask_token_id=3)
    if cls is DSparkConfig:
        base.update(markov_rank=6)
    base.update(kw)
    return cls(**base)


def make_dspark(variant="vanilla", seed=0, trained=True, **kw) -> DSparkDrafter:
    torch.manual_seed(seed)
    d = DSparkDrafter(make_config(markov_head_type=variant, **kw)).eval()
    if trained:   # W2 = 0 in a fresh head: give it (and the confidence head) weights that matter
        with torch.no_grad():
            d.markov_head.markov_w2.weight.normal_(std=1.0)
            if d.confidence_head is not None:
                d.confidence_head.proj.weight.normal_(std=0.3)
    return d


def head_inputs(d, n=5, batch=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, n, d.config.hidden_size, generator=g)
    lm_head = torch.randn(V, d.config.hidden_size, generator=g)
    first = torch.randint(0, V, (batch,), generator=g)
    return hidden, lm_head, first


def test_fresh_dspark_is_exactly_dflash():
    """W2 = 0: the same backbone weights give DFlash's logits and greedy proposals, for every variant."""
    for variant in MARKOV_VARIANTS:
        torch.manual_seed(0)
        dflash = DFlashDrafter(make_config(DFlashConfig)).eval()
        dspark = DSparkDrafter(make_config(markov_head_type=variant)).eval()
        missing = dspark.load_state_dict(dflash.state_dict(), strict=False).missing_keys
        assert missing and all(k.startswith(("markov_head.", "confidence_head.")) for k in missing)
        hidden, lm_head, first = head_inputs(dspark)
        prev = torch.randint(0, V, hidden.shape[:-1])
        torch.testing.assert_close(dspark.block_logits(hidden, lm_head, prev), dflash.logits(hidden, lm_head))
        assert torch.equal(dspark.propose(hidden, lm_head, first)[0], dflash.propose(hidden, lm_head, first)[0])


@pytest.mark.parametrize("variant", MARKOV_VARIANTS)
def test_sequential_proposal_equals_teacher_forced_logits_on_its_own_path(variant):
    """Decoding's scores at slot i are block_logits with the proposed tokens as predecessors: what
    training optimises is what decoding samples from. Greedy = argmax of those; sampled q = their softmax."""
    d = make_dspark(variant)
    hidden, lm_head, first = head_inputs(d)
    tokens, q = d.propose(hidden, lm_head, first)
    prev = torch.cat([first[:, None], tokens[:, :-1]], dim=1)
    logits = d.block_logits(hidden, lm_head, prev)
    assert q is None and torch.equal(tokens, logits.argmax(-1))
    assert not torch.equal(tokens, d.logits(hidden, lm_head).argmax(-1))   # the Markov bias changed the path
    g = torch.Generator().manual_seed(5)
    tokens, q = d.propose(hidden, lm_head, first, temperature=0.7, generator=g)
    prev = torch.cat([first[:, None], tokens[:, :-1]], dim=1)
    torch.testing.assert_close(q, torch.softmax(d.block_logits(hidden, lm_head, prev) / 0.7, -1))
    assert (q.gather(-1, tokens[..., None]) > 0).all()


def test_rnn_state_carries_across_the_block():
    """rnn: slot i's bias depends on tokens before i-1 too; vanilla and gated see x_{i-1} only."""
    hidden_seed = 2
    for variant, carries in (("vanilla", False), ("gated", False), ("rnn", True)):
        d = make_dspark(variant)
        with torch.no_grad():
            if variant == "rnn":
                d.markov_head.markov_recurrence.weight.normal_(std=0.5)
        hidden, lm_head, _ = head_inputs(d, n=3, batch=1, seed=hidden_seed)
        a = torch.tensor([[4, 7, 9]])
        b = torch.tensor([[5, 7, 9]])   # differs two slots before the last
        la, lb = d.block_logits(hidden, lm_head, a), d.block_logits(hidden, lm_head, b)
        assert torch.equal(la[0, 2], lb[0, 2]) is not carries, variant


def test_confidence_loss_is_the_weighted_bce_against_greedy_acceptance():
    d = make_dspark(confidence_loss_weight=2.0)
    hidden, lm_head, _ = head_inputs(d)
    g = torch.Generator().manual_seed(3)
    prev = torch.randint(0, V, hidden.shape[:-1], generator=g)
    logits = d.block_logits(hidden, lm_head, prev)
    labels = torch.where(torch.rand(prev.shape, generator=g) < 0.5, logits.argmax(-1), (logits.argmax(-1) + 1) % V)
    weights = torch.rand(prev.shape, generator=g)
    loss = d.auxiliary_loss(hidden, lm_head, labels, prev, weights)
    conf = d.confidence(hidden, prev)
    hit = (logits.argmax(-1) == labels).float()
    bce = -(hit * conf.log() + (1 - hit) * (1 - conf).log())
    torch.testing.assert_close(loss, 2.0 * (bce * weights).sum() / weights.sum())
    loss.backward()
    assert d.confidence_head.proj.weight.grad.abs().sum() > 0
    no_head = make_dspark(enable_confidence_head=False)
    assert no_head.confidence(hidden, prev) is None and not no_head.has_confidence
    assert no_head.auxiliary_loss(hidden, lm_head, labels, prev, weights).item() == 0.0


@pytest.mark.parametrize("variant", MARKOV_VARIANTS)
def test_export_is_vllms_dspark_layout_and_round_trips(tmp_path, variant):
    d = make_dspark(variant)
    save_drafter(tmp_path, d)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3DSparkModel"]
    assert (cfg["markov_rank"], cfg["markov_head_type"], cfg["enable_confidence_head"],
            cfg["confidence_head_with_markov"], cfg["sample_from_anchor"]) == (6, variant, True, True, False)
    assert cfg["dflash_config"]["mask_token_id"] == 3 and cfg["block_size"] == 8
    names = set(load_file(tmp_path / "model.safetensors"))
    assert {"markov_head.markov_w1.weight", "markov_head.markov_w2.weight", "confidence_head.proj.weight",
            "confidence_head.proj.bias", "fc.weight", "layers.0.self_attn.q_proj.weight"} <= names
    assert ("markov_head.markov_gate.weight" in names) is (variant == "gated")
    assert ("markov_head.markov_recurrence.weight" in names) is (variant == "rnn")
    loaded, _, _ = load_drafter(tmp_path)
    assert type(loaded) is DSparkDrafter and loaded.config.markov_head_type == variant
    hidden, lm_head, first = head_inputs(d)
    assert torch.equal(loaded.propose(hidden, lm_head, first)[0], d.propose(hidden, lm_head, first)[0])
    torch.testing.assert_close(loaded.confidence(hidden, first[:, None].expand(-1, 5)),
                               d.confidence(hidden, first[:, None].expand(-1, 5)))


def test_bad_options_are_one_line():
    with pytest.raises(ValueError, match=r"^markov_head_type must be one of vanilla, gated, rnn, got 'lstm'$"):
        make_config(markov_head_type="lstm")
    with pytest.raises(ValueError, match=r"^markov_rank must be an integer >= 1"):
        make_config(markov_rank=0)
    with pytest.raises(ValueError, match=r"^confidence_loss_weight must be a number >= 0"):
        make_config(confidence_loss_weight=-1)


def test_every_variant_trains_with_drafter_dspark():
    from dmtp.configs import compose_train
    from dmtp.training.components import build_components

    for name in sorted(VARIANTS):
        torch.manual_seed(0)
        cfg = compose_train([f"injection={name}", "drafter=dspark", "drafter.num_layers=1", "model.loss=dspark",
                             "drafter.markov_head_type=gated"])
        _, _, _, module = build_components(cfg)
        backbone = module.drafter.backbone
        assert type(backbone) is DSparkDrafter and module.loss_mix == (0.1, 0.9)
        ids = torch.randint(10, 400, (2, 48), generator=torch.Generator().manual_seed(0))
        loss, _, n = module.block_loss(ids, torch.ones_like(ids), generator=torch.Generator().manual_seed(0))
        loss.backward()
        assert torch.isfinite(loss) and n > 0 and module.last_auxiliary_loss > 0, name
        for p in (backbone.markov_head.markov_w2.weight, backbone.confidence_head.proj.weight, backbone.fc.weight):
            assert p.grad is not None and p.grad.abs().sum() > 0, name


# -- decoding --------------------------------------------------------------------------------------------

PROMPTS = [[17, 45, 300, 12, 9, 81, 77, 5, 40], [210, 11, 61, 400, 8], [33, 90, 120, 7, 64, 15, 300]]


_BIGRAMS = {}


def target_bigrams(target) -> torch.Tensor:
    """[V] the target's greedy next token after each single token: a Markov head that knows it drafts
    tokens the target accepts, so the sequential path is what gets accepted (not only T1)."""
    if id(target) not in _BIGRAMS:
        with torch.no_grad():
            ids = torch.arange(target.config.vocab_size)[:, None]
            _BIGRAMS[id(target)] = target(ids).logits[:, -1].argmax(-1)
    return _BIGRAMS[id(target)]


def dspark_drafter(target, name, variant="vanilla", seed=3, **backbone):
    """A random backbone whose Markov head (rank V, W1 = 3 I) biases each slot by +12 toward the target's
    bigram successor of the token proposed before it; a confidence head that varies with that token."""
    v = target.config.vocab_size
    drafter = fresh_drafter_for(target, name, 3, seed=seed, perturb=0.05,
                                backbone={"architecture": "dspark", "markov_rank": v, "markov_head_type": variant,
                                          **backbone})
    head = drafter.backbone.markov_head
    with torch.no_grad():
        head.markov_w1.weight.copy_(3 * torch.eye(v))
        head.markov_w2.weight.zero_()
        head.markov_w2.weight[target_bigrams(target), torch.arange(v)] = 12.0
        if variant == "gated":
            head.markov_gate.weight.zero_()          # gate = 1/2 everywhere: +6
        # confident after an even token, not after an odd one (reads the Markov code of the previous token)
        conf = drafter.backbone.confidence_head.proj
        conf.weight.zero_()
        conf.weight[0, -v:] = 1.0 - 2.0 * (torch.arange(v) % 2)
        conf.bias.fill_(1.0)
    return drafter


@pytest.mark.parametrize("variant", MARKOV_VARIANTS)
@pytest.mark.parametrize("name", ["raw_dflash", "dual_anchor_zero_init", "multi_mtp_zero_init", "context_fusion"])
def test_fast_loop_equals_the_reference_round(micro_target, micro_mtp, name, variant):
    """Greedy, batch 3: the loop's tokens and accepted lengths per round equal the reference round's, and
    are the target's own greedy tokens; with confidence scheduling too (its reference proposes the
    verified prefix only)."""
    drafter = dspark_drafter(micro_target, name, variant)
    proposer = build_proposer("drafter", micro_target, mtp=micro_mtp, drafter=drafter, name=name)
    ar = spec_decoder(micro_target, build_proposer("ar", micro_target)).generate(PROMPTS, max_new_tokens=20)
    for threshold in (0.0, 0.7):
        res = spec_decoder(micro_target, proposer).generate(
            PROMPTS, max_new_tokens=20, batch_size=3, sampling=SamplingConfig(confidence_threshold=threshold))
        assert res.tokens == ar.tokens
        propose = reference_proposal(proposer, confidence_threshold=threshold)
        for i, prompt in enumerate(PROMPTS):
            tokens, accepted = reference_generate(micro_target, propose, prompt, 20)
            assert (res.tokens[i], res.accepted[i]) == (tokens, accepted), (threshold, i)
        verified = res.summary()["verified_per_round"]
        assert verified == 7 if threshold == 0 else 0 < verified < 7, verified
        assert max(a for acc in res.accepted for a in acc) > 0


def test_confidence_threshold_without_a_confidence_head_is_one_line(micro_target, micro_mtp):
    proposer = build_proposer("mtp415", micro_target, mtp=micro_mtp)
    with pytest.raises(ValueError, match=r"^confidence_threshold=0.5 needs a drafter with a confidence head"):
        spec_decoder(micro_target, proposer).generate(PROMPTS, 8, sampling=SamplingConfig(confidence_threshold=0.5))
    with pytest.raises(ValueError, match=r"^confidence_threshold must be in \[0, 1\]"):
        SamplingConfig(confidence_threshold=1.5)


def test_exported_dmtp_dspark_decodes_the_same(micro_target, micro_mtp, tmp_path):
    drafter = dspark_drafter(micro_target, "dual_anchor_zero_init", "rnn")
    drafter.save(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["DMTPDSparkDraftModel"]
    loaded, _ = load_block_drafter(tmp_path)
    runs = [spec_decoder(micro_target, build_proposer("drafter", micro_target, mtp=micro_mtp, drafter=d))
            .generate(PROMPTS, max_new_tokens=16) for d in (drafter, loaded)]
    assert runs[0].tokens == runs[1].tokens and runs[0].accepted == runs[1].accepted


@pytest.mark.gpu
def test_dspark_round_replays_as_cuda_graphs(micro_target_dir, tmp_path):
    """CUDA graphs of the whole round (sequential Markov slots, confidence-scheduled verification) give
    the eager loop's tokens and accepted lengths, greedy and sampled."""
    from dmtp.families.mtp_loading import load_native_mtp
    from dmtp.models.target import TargetModel

    target = TargetModel.from_pretrained(micro_target_dir).to("cuda")
    mtp = load_native_mtp(micro_target_dir, target.embed_tokens, target.lm_head).to("cuda")
    drafter = dspark_drafter(target, "dual_anchor_zero_init", "rnn").to("cuda")
    proposer = build_proposer("drafter", target, mtp=mtp, drafter=drafter)
    for sampling in (SamplingConfig(confidence_threshold=0.5),
                     SamplingConfig(temperature=1.0, verification="rejection", confidence_threshold=0.3)):
        eager = spec_decoder(target, proposer).generate(PROMPTS, 24, sampling=sampling, batch_size=4, seed=1)
        graphs = spec_decoder(target, proposer, cuda_graphs=True).generate(PROMPTS, 24, sampling=sampling,
                                                                            batch_size=4, seed=1)
        assert graphs.extra["cuda_graphs"]
        if sampling.greedy:
            assert graphs.tokens == eager.tokens and graphs.accepted == eager.accepted
        else:
            assert all(len(t) == 24 for t in graphs.tokens)


# -- sampling: the target's distribution, with the Markov head's sequential q and confidence scheduling --------

SAMPLING_CASES = [
    ("dual_anchor_zero_init", "rnn", SamplingConfig(temperature=1.0, top_k=4, verification="rejection")),
    ("raw_dflash", "vanilla", SamplingConfig(temperature=0.8, top_p=0.7, verification="block")),
    ("dual_anchor_zero_init", "gated", SamplingConfig(temperature=1.0, top_k=4, verification="rejection",
                                                      confidence_threshold=0.7)),
    ("raw_dflash", "vanilla", SamplingConfig(temperature=1.0, top_k=4, verification="block", confidence_threshold=0.7)),
    ("dual_anchor_zero_init", "vanilla", SamplingConfig(temperature=1.0, top_k=4, confidence_threshold=0.7)),
]


@pytest.mark.parametrize("name,variant,sampling", SAMPLING_CASES,
                         ids=[f"{n}-{v}-{s.verification}-c{s.confidence_threshold}" for n, v, s in SAMPLING_CASES])
def test_dspark_sampling_matches_target_distribution(micro_target, micro_mtp, name, variant, sampling):
    from collections import Counter

    from tests.test_decode_sampling import N_SAMPLES, STEPS, _chi2_pvalue, _exact_probs

    prompt = PROMPTS[0]
    proposer = build_proposer("drafter", micro_target, mtp=micro_mtp, drafter=dspark_drafter(micro_target, name, variant))
    res = spec_decoder(micro_target, proposer, eos_token_id=[]).generate(
        [prompt] * N_SAMPLES, max_new_tokens=STEPS, sampling=sampling, batch_size=250, seed=123)
    counts = Counter(tuple(t) for t in res.tokens)
    probs = _exact_probs(micro_target, prompt, list(counts), sampling)
    assert all(p > 0 for p in probs.values())
    pvalue = _chi2_pvalue(counts, probs, N_SAMPLES)
    assert pvalue > 1e-3, (pvalue, counts.most_common(8))
    assert sum(a for acc in res.accepted for a in acc) > N_SAMPLES // 20   # drafts were accepted, often
    if sampling.schedules_verification:
        assert 0 < res.summary()["verified_per_round"] < 7


def test_block_plan_with_a_limit_is_the_plan_of_the_shorter_block():
    from dmtp.decode.verify import accept_rejection_sampling, block_verification_plan

    g = torch.Generator().manual_seed(0)
    b, k, v = 4, 5, 7
    q = torch.softmax(torch.randn(b, k, v, generator=g), -1)
    p = torch.softmax(torch.randn(b, k + 1, v, generator=g), -1)
    cand = torch.multinomial(q.view(-1, v), 1, generator=g).view(b, k)
    for limit in range(k + 1):
        lim = torch.full((b,), limit)
        stops, dists = block_verification_plan(cand, q, p, lim)
        short_stops, short_dists = block_verification_plan(cand[:, :limit], q[:, :limit], p[:, :limit + 1])
        torch.testing.assert_close(stops[:, :limit + 1], short_stops)
        torch.testing.assert_close(dists[:, :limit + 1], short_dists)
        assert (stops[:, limit + 1:] == 0).all()
        _, acc = accept_rejection_sampling(cand, q, p, generator=g, limit=lim)
        assert (acc <= limit).all()


# -- serving ----------------------------------------------------------------------------------------------------

def test_only_a_dmtp_dflash2_export_is_refused_by_the_vllm_plugin_with_its_reason(micro_target, tmp_path):
    """DMTP on DSpark's heads (DMTPDSparkDraftModel) is served by the plug-in and a raw DSpark export by vLLM
    itself: neither is refused. What vLLM builds for DMTPDFlash2DraftModel (either name vLLM asks for) stops
    with one line naming the drafter and what serves it."""
    from types import SimpleNamespace

    from dmtp.serving.vllm.refused import RefusedDraftModel, refusal

    dmtp_dir, raw_dir, dflash2_dir = tmp_path / "dmtp", tmp_path / "raw", tmp_path / "dflash2"
    dspark_drafter(micro_target, "dual_anchor_zero_init").save(dmtp_dir)
    dspark_drafter(micro_target, "raw_dflash").save(raw_dir)
    fresh_drafter_for(micro_target, "dual_anchor_zero_init", 3, backbone={"architecture": "dflash2"}).save(dflash2_dir)
    arch = lambda d: json.loads((d / "config.json").read_text())["architectures"]  # noqa: E731
    assert arch(raw_dir) == ["Qwen3DSparkModel"] and refusal(arch(raw_dir)) is None
    assert arch(dmtp_dir) == ["DMTPDSparkDraftModel"] and refusal(arch(dmtp_dir)) is None
    for served_as in (arch(dflash2_dir), ["DFlash" + arch(dflash2_dir)[0]]):
        draft = SimpleNamespace(model=str(dflash2_dir), hf_config=SimpleNamespace(architectures=served_as))
        config = SimpleNamespace(speculative_config=SimpleNamespace(draft_model_config=draft))
        with pytest.raises(ValueError, match=rf"^drafter {dflash2_dir}: a DMTP drafter on DFlash2's candidate "
                                             r"selector is not served by vLLM.*python -m dmtp.infer"):
            RefusedDraftModel(vllm_config=config)


# -- capturable: the round's stages declare their writes, trace as whole graphs, survive a warm-up ----------------

@pytest.mark.parametrize("sampling", [SamplingConfig(confidence_threshold=0.7),
                                      SamplingConfig(temperature=1.0, verification="rejection", confidence_threshold=0.7),
                                      SamplingConfig(temperature=1.0, verification="block")],
                         ids=["greedy-scheduled", "rejection-scheduled", "block"])
def test_dspark_stages_change_only_what_they_declare(micro_target, micro_mtp, sampling):
    from tests.test_decode_stage_writes import check_rounds

    drafter = dspark_drafter(micro_target, "dual_anchor_zero_init", "rnn")
    dec = spec_decoder(micro_target, build_proposer("drafter", micro_target, mtp=micro_mtp, drafter=drafter),
                      eos_token_id=[], time_stages=False)
    assert check_rounds(dec, sampling) >= 3


@pytest.mark.parametrize("variant", MARKOV_VARIANTS)
def test_dspark_round_compiles_as_one_graph_and_equals_eager(micro_target, micro_mtp, variant):
    """torch.compile(fullgraph=True) of the whole round (the CPU analogue of a CUDA graph capture: no host
    sync, no data-dependent branch, static shapes), with confidence scheduling on."""
    drafter = dspark_drafter(micro_target, "dual_anchor_zero_init", variant)
    proposer = build_proposer("drafter", micro_target, mtp=micro_mtp, drafter=drafter)
    sampling = SamplingConfig(confidence_threshold=0.7)
    eager = spec_decoder(micro_target, proposer, eos_token_id=[]).generate(PROMPTS, 20, sampling=sampling, batch_size=2)
    compiled = spec_decoder(micro_target, proposer, eos_token_id=[], compile="aot_eager")
    res = compiled.generate(PROMPTS, 20, sampling=sampling, batch_size=2)
    assert res.extra["compiled"] and res.tokens == eager.tokens and res.accepted == eager.accepted


def test_dspark_warmup_restore_leaves_decoding_unchanged(micro_target, micro_mtp, monkeypatch):
    import dmtp.decode.execution.graphs as graphs
    from tests.test_decode_graphs import _EagerGraphs

    drafter = dspark_drafter(micro_target, "raw_dflash", "gated")
    proposer = build_proposer("drafter", micro_target, mtp=micro_mtp, drafter=drafter)
    sampling = SamplingConfig(confidence_threshold=0.7)
    ref = spec_decoder(micro_target, proposer, eos_token_id=[]).generate(PROMPTS, 20, sampling=sampling, batch_size=3)
    monkeypatch.setattr(graphs, "RoundGraphs", _EagerGraphs)
    fake = spec_decoder(micro_target, proposer, eos_token_id=[], time_stages=False)
    fake.use_graphs = True
    for _ in range(2):
        out = fake.generate(PROMPTS, 20, sampling=sampling, batch_size=3)
        assert out.tokens == ref.tokens and out.accepted == ref.accepted


@pytest.mark.parametrize("name,first", [("raw_dflash", "anchor"), ("dual_anchor_zero_init", "t1"),
                                        ("fusion_t1", "t1"), ("token_only", "t1")])
def test_the_markov_chain_starts_at_t1_for_dmtp_and_at_a_for_raw_dflash(micro_target, name, first):
    """The first drafted slot's Markov predecessor: the MTP's T1 (DMTP + DSpark heads), A for raw DSpark;
    each later slot's: the candidate the drafter proposed just before it."""
    from dmtp.drafters.block_drafter import MTPBlockInputs

    drafter = dspark_drafter(micro_target, name)
    head = drafter.backbone.markov_head
    seen = []
    original = head.step
    head.step = lambda prev, hidden, state: (seen.append(prev.clone()), original(prev, hidden, state))[1]
    h = micro_target.config.hidden_size
    anchor, t1 = torch.tensor([[11]]), torch.tensor([[77]])
    mtp = MTPBlockInputs(t1[..., None], torch.randn(1, 1, 1, h), torch.ones(1, 1, dtype=torch.long)) \
        if drafter.needs_mtp else None
    ctx = torch.randn(1, 6, drafter.injection.context_dim)
    positions = torch.arange(6)[None]
    block = drafter.draft_block(micro_target.embed_tokens.weight, anchor, torch.tensor([[6]]),
                                drafter.context_kv(drafter.project_context(ctx), positions), positions, mtp,
                                lm_head_weight=micro_target.lm_head.weight)
    n = drafter.injection.num_drafter_candidates
    walk = seen[:n]   # propose's slot-by-slot walk (the confidence of the path is computed after it)
    assert walk[0].item() == (77 if first == "t1" else 11)
    drafted = block.candidates[0, 0, -n:]
    assert [s.item() for s in walk[1:]] == drafted[:-1].tolist()


@pytest.mark.parametrize("architecture", ["dspark", "dflash2"])
def test_multi_step_mtp_tokens_enter_the_sequential_chain(micro_target, architecture):
    """multi_mtp_zero_init with m = 3: candidates 2..3 are the MTP's T2, T3, so the drafter's chain (DSpark's
    Markov head, DFlash2's selector path) walks T1 -> T2 -> T3 -> its own, as training's gold path does."""
    from dmtp.drafters.block_drafter import MTPBlockInputs

    backbone = ({"architecture": "dspark", "markov_rank": 8} if architecture == "dspark" else
                {"architecture": "dflash2", "selector_rank": 4, "selector_top_k": 4, "conv_group_size": 16})
    drafter = fresh_drafter_for(micro_target, "multi_mtp_zero_init", 3, perturb=0.05, backbone=backbone)
    seen = []
    if architecture == "dspark":
        head = drafter.backbone.markov_head
        original = head.step
        head.step = lambda prev, hidden, state: (seen.append(prev.clone()), original(prev, hidden, state))[1]
    else:
        sel = drafter.backbone.candidate_selector
        original = sel.scores
        sel.scores = lambda u, c, prev, q: (seen.append(prev.clone()), original(u, c, prev, q))[1]
    h = micro_target.config.hidden_size
    steps = drafter.injection.mtp_steps
    t = torch.tensor([[[70, 71, 72][:steps]]])
    mtp = MTPBlockInputs(t, torch.randn(1, 1, steps, h), torch.tensor([[3]]))
    ctx = torch.randn(1, 6, drafter.injection.context_dim)
    positions = torch.arange(6)[None]
    block = drafter.draft_block(micro_target.embed_tokens.weight, torch.tensor([[11]]), torch.tensor([[6]]),
                                drafter.context_kv(drafter.project_context(ctx), positions), positions, mtp,
                                lm_head_weight=micro_target.lm_head.weight)
    walk = [s.item() for s in seen[:drafter.injection.num_drafter_candidates]]
    assert walk[:3] == [70, 71, 72]
    assert block.candidates[0, 0, :3].tolist() == [70, 71, 72]
    assert walk[3:] == block.candidates[0, 0, 3:-1].tolist()
