"""A reduced draft vocabulary (dmtp.models.draft_vocab): the drafting heads over the V most frequent tokens of the
drafter's data. Its q is the full one renormalised over V (zero outside), greedy decoding stays the target's
own, and sampled decoding keeps the target's distribution in every verification mode (chi-square, as
tests/test_decode_sampling.py)."""
from collections import Counter

import pytest
import torch

from dmtp.decode import SamplingConfig, build_proposer
from dmtp.decode.verify import probs_from_logits
from dmtp.drafters.block_drafter import fresh_drafter_for
from dmtp.families.decoding import spec_decoder
from dmtp.models.draft_vocab import (DraftVocab, load_token_counts, restricted_mtp, save_token_counts,
                                     token_counts)
from test_decode_sampling import N_SAMPLES, STEPS, _chi2_pvalue, _exact_probs, prompt  # noqa: F401


def test_most_frequent_and_coverage():
    counts = torch.tensor([5, 0, 9, 9, 1, 2])
    v = DraftVocab.most_frequent(counts, 3)
    assert v.ids.tolist() == [0, 2, 3] and v.size == 3   # 9, 9 (lower id first), then 5
    assert v.coverage(counts) == pytest.approx(23 / 26)
    with pytest.raises(ValueError, match="draft_vocab must be an integer in 1..6"):
        DraftVocab.most_frequent(counts, 7)


def test_counts_are_the_supervised_tokens_and_round_trip(tmp_path):
    rows = [{"input_ids": [1, 2, 3, 3], "loss_mask": [0, 1, 1, 1]}, {"input_ids": [0, 3], "loss_mask": [1, 0]}]
    counts = token_counts(rows, 5)
    assert counts.tolist() == [1, 0, 1, 2, 0]
    save_token_counts(tmp_path, counts, "test")
    assert load_token_counts(tmp_path).tolist() == counts.tolist()
    with pytest.raises(FileNotFoundError, match="python -m dmtp.training.draft_vocab"):
        load_token_counts(tmp_path / "none")


def test_q_is_renormalised_over_the_vocabulary():
    torch.manual_seed(0)
    weight, hidden = torch.randn(50, 8), torch.randn(3, 8)
    v = DraftVocab(torch.tensor([4, 7, 11, 30]), 50)
    logits = v.logits(hidden, weight)
    full = hidden @ weight.T
    inside = torch.zeros(50, dtype=torch.bool)
    inside[v.ids] = True
    assert torch.allclose(logits[:, inside], full[:, inside]) and torch.isinf(logits[:, ~inside]).all()
    q = probs_from_logits(logits, 0.7, top_k=3)
    p = probs_from_logits(full[:, inside], 0.7, top_k=3)
    assert torch.allclose(q[:, inside], p, atol=1e-6) and (q[:, ~inside] == 0).all()
    assert (logits.argmax(-1)[:, None] == v.ids[None]).any(-1).all()


def test_the_drafter_head_stays_restricted_with_softcapping(micro_target):
    drafter = fresh_drafter_for(micro_target, "raw_dflash", 3)
    drafter.backbone.config.final_logit_softcapping = 5.0
    v = DraftVocab(torch.arange(10, 40), micro_target.lm_head.weight.shape[0])
    logits = drafter.backbone.logits(torch.randn(2, micro_target.hidden_size), micro_target.lm_head.weight, v)
    assert torch.isinf(logits[:, :10]).all() and torch.isfinite(logits[:, 10:40]).all()


def _vocab(micro_target, micro_mtp, prompt, size):  # noqa: F811
    """A draft vocabulary that leaves out some of what the target samples: the `size` most frequent tokens of its
    own T = 1 samples (so the restriction bites and drafts are still accepted)."""
    dec = spec_decoder(micro_target, build_proposer("ar", micro_target), eos_token_id=[])
    res = dec.generate([prompt] * 200, max_new_tokens=6, batch_size=200, seed=11,
                       sampling=SamplingConfig(temperature=1.0, top_k=8))
    counts = torch.zeros(micro_target.lm_head.weight.shape[0], dtype=torch.long)
    for t in res.tokens:
        counts += torch.bincount(torch.tensor(t), minlength=counts.numel())
    assert (counts > 0).sum() > size   # some sampled tokens lie outside
    return DraftVocab.most_frequent(counts, size)


@pytest.fixture(scope="module")
def vocab(micro_target, micro_mtp, prompt):  # noqa: F811
    return _vocab(micro_target, micro_mtp, prompt, 12)


def _proposer(method, target, mtp, vocab):
    if method in ("mtp415", "mtp:7"):
        return build_proposer(method, target, mtp=mtp, draft_vocab=vocab)
    options = {"multi_mtp_zero_init": {"max_mtp_tokens": 7, "mtp_correction_rank": 4},
               "dspark": {"backbone": {"architecture": "dspark"}}, "dflash2": {"backbone": {"architecture": "dflash2"}}}
    injection = "dual_anchor_zero_init" if method in ("dspark", "dflash2") else method
    drafter = fresh_drafter_for(target, injection, 3, seed=3, **options.get(method, {}))
    return build_proposer("drafter", target, mtp=mtp, drafter=drafter, draft_vocab=vocab)


@pytest.mark.parametrize("method", ["mtp415", "dual_anchor_zero_init", "raw_dflash", "multi_mtp_zero_init", "dspark",
                                    "dflash2"])
def test_greedy_output_is_the_targets(micro_target, micro_mtp, prompt, vocab, method):  # noqa: F811
    prompts = [prompt, prompt[:6], prompt[2:]]
    ar = spec_decoder(micro_target, build_proposer("ar", micro_target), eos_token_id=[]).generate(prompts, 24)
    proposer = _proposer(method, micro_target, micro_mtp, vocab)
    res = spec_decoder(micro_target, proposer, eos_token_id=[]).generate(prompts, 24)
    assert res.tokens == ar.tokens


def test_drafts_come_from_the_vocabulary(micro_target, micro_mtp, prompt, vocab):  # noqa: F811
    """Every MTP proposal (greedy and sampled) is one of the V ids."""
    mtp = restricted_mtp(micro_mtp, vocab)
    g = torch.randn(64, micro_target.hidden_size)
    logits = mtp.logits(g)
    assert torch.isin(logits.argmax(-1), vocab.ids).all()
    q = probs_from_logits(logits, 1.0)
    assert torch.isin(torch.multinomial(q, 4, replacement=True), vocab.ids).all()


CASES = [
    ("mtp415", SamplingConfig(temperature=1.0, top_k=8, verification="rejection")),
    ("mtp415", SamplingConfig(temperature=1.0, top_k=8, verification="block")),
    ("mtp415", SamplingConfig(temperature=1.0, top_k=8)),   # target-only: argmax drafts within V
    ("dual_anchor_zero_init", SamplingConfig(temperature=0.8, top_p=0.9, verification="rejection")),
]


@pytest.mark.parametrize("method,sampling", CASES, ids=[f"{m}-{s.verification}" for m, s in CASES])
def test_sampling_keeps_the_target_distribution(micro_target, micro_mtp, prompt, vocab, method, sampling):  # noqa: F811
    dec = spec_decoder(micro_target, _proposer(method, micro_target, micro_mtp, vocab), eos_token_id=[])
    res = dec.generate([prompt] * N_SAMPLES, max_new_tokens=STEPS, sampling=sampling, batch_size=250, seed=123)
    seqs = [tuple(t) for t in res.tokens]
    counts = Counter(seqs)
    probs = _exact_probs(micro_target, prompt, list(counts), sampling)
    assert all(p > 0 for p in probs.values())
    pvalue = _chi2_pvalue(counts, probs, N_SAMPLES)
    assert pvalue > 1e-3, (pvalue, counts.most_common(8))
    assert any(a > 0 for acc in res.accepted for a in acc)   # drafts within V were accepted
    outside = {tok for s in seqs for tok in s[1:]} - set(vocab.ids.tolist())
    assert outside   # and the target still emitted tokens the drafts could not propose


@pytest.mark.parametrize("method", ["mtp415", "dual_anchor_zero_init"])
def test_the_loop_drafts_what_the_reference_round_drafts(micro_target, micro_mtp, prompt, vocab, method):  # noqa: F811
    """The same accepted lengths as the reference round (no caches) proposing from the same vocabulary."""
    from dmtp.decode.reference import reference_generate, reference_proposal

    proposer = _proposer(method, micro_target, micro_mtp, vocab)
    res = spec_decoder(micro_target, proposer, eos_token_id=[]).generate([prompt], 20)
    tokens, accepted = reference_generate(micro_target, reference_proposal(proposer), prompt, 20)
    assert res.tokens[0] == tokens and res.accepted[0] == accepted


@pytest.mark.parametrize("size", [0, -5, 2.5, True])
def test_a_draft_vocabulary_size_that_is_no_count_of_tokens_is_named(size):
    from dmtp.models.draft_vocab import draft_vocab_for

    with pytest.raises(ValueError, match=f"draft_vocab must be a positive number of tokens .*got {size!r}"):
        draft_vocab_for(size, "/nowhere")
