"""Adaptive multi-step MTP before the block (multi_mtp_zero_init): m = 1 is dual_anchor_zero_init,
the training chain is decoding's chain, m varies per request on the device and decoding stays
lossless (greedy tokens, sampling distribution), bad options are one-line errors."""
from collections import Counter

import pytest
import torch

from dmtp.configs import compose_train
from dmtp.decode import SamplingConfig, build_proposer
from dmtp.families.decoding import spec_decoder
from dmtp.drafters.block_drafter import BlockDrafter, fresh_drafter_for, load_block_drafter
from dmtp.injection.catalogue import make_injection
from dmtp.models.mtp_chain import TeacherChain
from dmtp.training.blocks import sample_anchors, valid_anchors
from dmtp.training.draws import BatchDraws
from dmtp.training.components import build_components
from tests.test_decode_loop import MAX_NEW, prompts, tokenizer  # noqa: F401
from tests.test_decode_sampling import N_SAMPLES, STEPS, _chi2_pvalue, _exact_probs

THRESHOLD = 0.4   # about the micro MTP's median top-1 probability: adaptive m really varies


@pytest.fixture(scope="module")
def refs(micro_target, prompts):  # noqa: F811
    """The target's greedy outputs (its AR decoding through the loop, itself tested against transformers')."""
    return spec_decoder(micro_target, build_proposer("ar", micro_target), eos_token_id=None).generate(
        prompts, max_new_tokens=MAX_NEW, batch_size=len(prompts)).tokens


def _multi(target, perturb=True, **options):
    return fresh_drafter_for(target, "multi_mtp_zero_init", 3, seed=0, perturb=0.05 if perturb else 0.0, **options)


def _decode(target, mtp, drafter, prompts, eos, **kw):
    proposer = build_proposer("drafter", target, mtp=mtp, drafter=drafter)
    return spec_decoder(target, proposer, eos_token_id=eos).generate(prompts, **kw)


def _recording_m(inj) -> list:
    """Record every m the decoding loop chooses (the injection's own method, wrapped)."""
    seen, choose = [], inj.choose_num_mtp
    inj.choose_num_mtp = lambda logits: seen.append(choose(logits).clone()) or seen[-1]
    return seen


def test_m1_is_dual_anchor_zero_init(micro_target, micro_mtp, prompts, refs):  # noqa: F811
    """Same weights, m fixed at 1: the same slots and, round by round, the same accepted counts."""
    eos = None
    dual_drafter = fresh_drafter_for(micro_target, "dual_anchor_zero_init", 3, seed=0, perturb=0.05)
    dual = dual_drafter.injection
    multi = make_injection("multi_mtp_zero_init", micro_target.hidden_size, 1, 3, 8, num_mtp_tokens=1).eval()
    multi.load_state_dict(dual.state_dict(), strict=True)
    embed = micro_target.embed_tokens
    anchor, tokens = torch.tensor([5, 9]), torch.tensor([[11, 12, 13], [21, 22, 23]])
    hidden = torch.randn(2, 3, micro_target.hidden_size)
    expected = dual.build_slots(embed, anchor, tokens[:, 0], hidden[:, 0])
    assert torch.equal(multi.build_block(embed, anchor, tokens[:, :1], hidden[:, :1], None), expected)
    # Three chained tokens, m = 1: the same slots (the fusion runs on 3 rows per block: rounding only).
    torch.testing.assert_close(multi.build_block(embed, anchor, tokens, hidden, torch.ones(2, dtype=torch.long)),
                               expected, atol=1e-6, rtol=1e-6)
    multi_drafter = BlockDrafter(dual_drafter.backbone, multi)   # the same backbone, the multi-step injection
    a = _decode(micro_target, micro_mtp, dual_drafter, prompts, eos, max_new_tokens=MAX_NEW, batch_size=4)
    b = _decode(micro_target, micro_mtp, multi_drafter, prompts, eos, max_new_tokens=MAX_NEW, batch_size=4)
    assert a.tokens == b.tokens == refs
    assert a.accepted_raw == b.accepted_raw and any(x > 0 for r in a.accepted_raw for x in r)


def test_merge_takes_the_first_m_candidates_from_the_mtp():
    inj = make_injection("multi_mtp_zero_init", 16, 1, 3, 8)
    mtp = torch.tensor([[10, 11, 12]] * 3)
    drafted = torch.arange(20, 26).expand(3, -1)     # the drafter's candidates 2..7
    merged = inj.merge_candidates(mtp, drafted, torch.tensor([1, 2, 3]))
    assert merged.tolist() == [[10, 20, 21, 22, 23, 24, 25], [10, 11, 21, 22, 23, 24, 25], [10, 11, 12, 22, 23, 24, 25]]
    assert inj.drafter_slot_mask(torch.tensor([1, 3])).tolist() == [[True] * 6, [False, False] + [True] * 4]
    logits = torch.full((2, 3, 5), -9.0)
    logits[0, :, 0] = 9.0          # request 0: every step confident
    logits[1, 1, 0] = 9.0          # request 1: step 2 confident, step 3 not
    assert make_injection("multi_mtp_zero_init", 16, 1, 3, 8, mtp_threshold=0.5).choose_num_mtp(logits).tolist() == [3, 2]
    assert inj.choose_num_mtp(logits).tolist() == [3, 3]   # no threshold: fixed m = num_mtp_tokens (M)


def test_training_chain_is_decodings_chain(micro_target, micro_mtp):
    """TeacherChain gives each anchor's chain row the keys decoding's MTP step sees (rows 1..a of the
    cache, then the chain's own rows)."""
    torch.manual_seed(0)
    ids = torch.randint(10, 400, (2, 40))
    anchors = torch.tensor([[3, 20, 37], [6, 7, 30]])
    with torch.no_grad():
        hidden = micro_target(ids).last_hidden
        g = micro_mtp.forward_teacher(ids, hidden)
        chain = TeacherChain(micro_mtp, ids, hidden, anchors, 2)
        h1 = g.gather(1, anchors[..., None].expand(-1, -1, g.shape[-1]))
        t1 = micro_mtp.logits(h1).argmax(-1)
        h2 = chain.step(1, t1, h1)
        h3 = chain.step(2, micro_mtp.logits(h2).argmax(-1), h2)
        for b in range(2):
            for n, a in enumerate(anchors[b].tolist()):
                cache = micro_mtp.new_cache(1, 64)
                rows = micro_mtp.forward_rows(ids[b:b + 1, 1:a + 1], hidden[b:b + 1, :a], torch.arange(1, a + 1)[None],
                                              cache)
                x = micro_mtp.forward_rows(t1[b:b + 1, n:n + 1], rows[:, -1:], torch.tensor([[a + 1]]), cache)
                y = micro_mtp.forward_rows(micro_mtp.logits(x).argmax(-1), x, torch.tensor([[a + 2]]), cache)
                torch.testing.assert_close(x[0, 0], h2[b, n], atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(y[0, 0], h3[b, n], atol=1e-5, rtol=1e-5)


def test_training_samples_m_and_leaves_mtp_slots_unsupervised():
    cfg = compose_train(["injection=multi_mtp_zero_init", "injection.max_mtp_tokens=3"])
    _, _, _, module = build_components(cfg)
    inj = module.drafter.injection
    m = inj.sample_num_mtp((4000,), BatchDraws(torch.Generator().manual_seed(0)))
    assert torch.bincount(m, minlength=4)[1:].min() > 1200 and int(m.min()) == 1 and int(m.max()) == 3
    ids = torch.randint(10, 400, (2, 48))
    mask = torch.ones_like(ids)
    supervised = {}
    for fixed in (1, 3):
        inj.sample_num_mtp = lambda shape, generator=None, device=None: torch.full(shape, fixed, dtype=torch.long)
        loss, _, n = module.block_loss(ids, mask, generator=torch.Generator().manual_seed(0))
        assert torch.isfinite(loss)
        supervised[fixed] = int(n)
    # The same anchors both times; m = 3 supervises candidates 4..7 only: 2 slots fewer per block
    # (1 fewer where candidate 3 lies past the sequence's end).
    anchors, keep = sample_anchors(valid_anchors(inj, mask), module.num_anchors, torch.Generator().manual_seed(0))
    fewer = int(keep.sum()) + int((keep & (anchors + 3 < ids.shape[1])).sum())
    assert supervised[1] - supervised[3] == fewer > 0


@pytest.mark.parametrize("batch", [1, 4])
def test_adaptive_m_is_lossless_and_varies_per_request(micro_target, micro_mtp, prompts, refs, batch):  # noqa: F811
    eos = None
    drafter = _multi(micro_target, mtp_threshold=THRESHOLD)
    seen = _recording_m(drafter.injection)
    res = _decode(micro_target, micro_mtp, drafter, prompts, eos, max_new_tokens=MAX_NEW, batch_size=batch)
    assert res.tokens == refs
    chosen = torch.cat(seen)
    assert set(chosen.tolist()) == {1, 2, 3}
    if batch > 1:   # one round mixes requests with different m
        assert any(len(set(m.tolist())) > 1 for m in seen)


def test_saved_options_and_decoding_overrides(tmp_path, micro_target):
    drafter = _multi(micro_target, mtp_threshold=0.6)
    drafter.save(tmp_path / "d")
    loaded = load_block_drafter(tmp_path / "d")[0].injection
    assert (loaded.mtp_threshold, loaded.mtp_steps, loaded.max_mtp_tokens) == (0.6, 3, 3)
    fixed = load_block_drafter(tmp_path / "d", options={"mtp_threshold": None, "num_mtp_tokens": 2})[0].injection
    assert (fixed.mtp_threshold, fixed.mtp_steps) == (None, 2)
    assert torch.equal(fixed.fusion.proj.weight, drafter.injection.fusion.proj.weight)


@pytest.mark.parametrize("options,match", [
    ({"max_mtp_tokens": 0}, "max_mtp_tokens must be an integer in 1..7"),
    ({"max_mtp_tokens": 8}, "max_mtp_tokens must be an integer in 1..7"),
    ({"num_mtp_tokens": 4}, r"num_mtp_tokens must be an integer in 1..max_mtp_tokens=3"),
    ({"num_mtp_tokens": 0}, r"num_mtp_tokens must be an integer in 1..max_mtp_tokens=3"),
    ({"mtp_threshold": 1.0}, r"mtp_threshold must be in \(0, 1\)"),
    ({"mtp_threshold": -0.2}, r"mtp_threshold must be in \(0, 1\)"),
    ({"mtp_treshold": 0.5}, "'mtp_treshold' is not an option of injection multi_mtp_zero_init"),
])
def test_bad_options_are_one_line_errors(options, match):
    with pytest.raises(ValueError, match=match) as err:
        make_injection("multi_mtp_zero_init", 16, 1, 3, 8, **options)
    assert "\n" not in str(err.value)


def test_adaptive_m_keeps_the_target_distribution(micro_target, micro_mtp, tokenizer):  # noqa: F811
    """q of each candidate comes from whichever proposer made it: exact sampling at temperature 1
    (block verification; giving candidates 2..m the drafter's q instead fails this with p ~ 1e-33)."""
    from dmtp.data.corpora import documents

    prompt = tokenizer(documents("prose", "test")[1].text[:200], add_special_tokens=False)["input_ids"][:10]
    drafter = fresh_drafter_for(micro_target, "multi_mtp_zero_init", 3, seed=3, mtp_threshold=0.2)
    seen = _recording_m(drafter.injection)
    sampling = SamplingConfig(temperature=1.0, top_k=4, verification="block")
    res = _decode(micro_target, micro_mtp, drafter, [prompt] * N_SAMPLES, [], max_new_tokens=STEPS,
                  sampling=sampling, batch_size=N_SAMPLES, seed=123)
    seqs = [tuple(t) for t in res.tokens]
    counts = Counter(seqs)
    probs = _exact_probs(micro_target, prompt, list(counts), sampling)
    assert all(p > 0 for p in probs.values())
    assert _chi2_pvalue(counts, probs, N_SAMPLES) > 1e-3
    assert len(set(torch.cat(seen).tolist())) > 1                           # m differed between requests
    assert any(a > 1 for acc in res.accepted_raw for a in acc)              # MTP tokens past T1 were accepted
