"""The fast loop (SpecDecoder: static caches, batched rounds, device-side acceptance) equals the
readable reference round (dmtp/decode/reference.py: full-context forwards, one request at a time):
the same tokens and the same accepted length in every round, for every method, at blocks of 4, 8 and
16 slots (the drafter's block_size), and for a block-16 drafter verified with a shorter block."""
import pytest

from dmtp.decode import build_proposer
from dmtp.families.decoding import spec_decoder
from dmtp.decode.reference import reference_generate, reference_proposal
from dmtp.drafters.block_drafter import fresh_drafter_for, load_block_drafter
from dmtp.injection import VARIANTS

MAX_NEW = 24
PROMPTS = [[17, 45, 300, 12, 9, 81, 77, 5, 40], [210, 11, 61, 400, 8], [33, 90, 120, 7, 64, 15, 300],
           [250, 251, 252, 253, 254, 255, 256, 257, 258, 259, 260, 261]]


# Every method; the multi-step variant also with an adaptive m (chosen per request and round).
METHODS = {"ar": {}, "mtp415": {}, **{name: {} for name in VARIANTS},
           "multi_mtp_zero_init@adaptive": {"mtp_threshold": 0.3}}
# Every drafter at every tested block width (ar and mtp415 have no block).
CASES = [("ar", 8), ("mtp415", 8)] + [(m, b) for b in (4, 8, 16) for m in METHODS if m not in ("ar", "mtp415")]


def _proposer(target, mtp, method, block_size=8):
    name = method.split("@")[0]
    if name in VARIANTS:   # a random drafter whose injected paths all matter (perturbed zero-init weights)
        drafter = fresh_drafter_for(target, name, 3, perturb=0.05, block_size=block_size, **METHODS[method])
        assert drafter.block_size == block_size and drafter.injection.num_slots == block_size - \
            drafter.injection.first_slot_offset
        return build_proposer("drafter", target, mtp=mtp, drafter=drafter, name=name)
    return build_proposer(method, target, mtp=mtp)


@pytest.fixture(scope="module")
def eos(micro_target):
    """A stop token that the target emits mid-way for some prompts and not for others, so that rounds
    are cut by EOS as well as by the budget."""
    ar = reference_proposal(build_proposer("ar", micro_target))
    outputs = [reference_generate(micro_target, ar, p, MAX_NEW)[0] for p in PROMPTS]
    for token in sorted({t for out in outputs for t in out[2:]}):
        if 0 < sum(token in out[2:] for out in outputs) < len(outputs):
            return [token]
    raise AssertionError("no token ends some outputs but not others")


def _assert_equal_to_reference(target, proposer, eos, method):
    fast = spec_decoder(target, proposer, eos_token_id=eos).generate(PROMPTS, max_new_tokens=MAX_NEW, batch_size=4)
    propose = reference_proposal(proposer)
    for i, prompt in enumerate(PROMPTS):
        tokens, accepted = reference_generate(target, propose, prompt, MAX_NEW, eos_ids=eos)
        assert fast.tokens[i] == tokens, f"request {i}"
        assert fast.accepted[i] == accepted, f"request {i}"
    assert {out[-1] in eos for out in fast.tokens} == {True, False}   # EOS and the budget both end requests
    if method != "ar":
        assert any(a > 0 for acc in fast.accepted for a in acc)   # proposals were accepted, not only corrections
    return fast


@pytest.mark.parametrize("method,block_size", CASES, ids=[f"{m}-B{b}" for m, b in CASES])
def test_fast_loop_equals_the_reference_round(micro_target, micro_mtp, eos, method, block_size):
    proposer = _proposer(micro_target, micro_mtp, method, block_size)
    assert proposer.num_candidates == {"ar": 0, "mtp415": 4}.get(method, block_size - 1)
    fast = _assert_equal_to_reference(micro_target, proposer, eos, method)
    assert fast.num_candidates == proposer.num_candidates
    assert len(fast.summary()["p_len_ge"]) == proposer.num_candidates   # P(L>=k) for k = 1..K (= B - 1)


@pytest.mark.parametrize("name", ["raw_dflash", "dual_anchor_zero_init", "multi_mtp_zero_init"])
def test_a_block16_drafter_verified_with_a_shorter_block(micro_target, micro_mtp, eos, tmp_path, name):
    """drafter.block_size=<b> at decoding time (dmtp.infer, bench_decode's DIR@block_size=b): a block-16
    drafter drafts and verifies blocks of b; longer than trained is refused in one line."""
    fresh_drafter_for(micro_target, name, 3, perturb=0.05, block_size=16).save(tmp_path)
    drafter, _ = load_block_drafter(tmp_path, block_size=6)
    assert (drafter.config.block_size, drafter.block_size, drafter.num_candidates) == (16, 6, 5)
    proposer = build_proposer("drafter", micro_target, mtp=micro_mtp, drafter=drafter, name=name)
    _assert_equal_to_reference(micro_target, proposer, eos, name)
    with pytest.raises(ValueError, match="was trained with block_size 16: it can verify a block of 2..16, not 17"):
        load_block_drafter(tmp_path, block_size=17)
    with pytest.raises(ValueError, match=r"block_size must be an integer in 2\.\.32"):
        load_block_drafter(tmp_path, block_size=1)
