"""The fast loop (SpecDecoder: static caches, batched rounds, device-side acceptance) equals the
readable reference round (dmtp/decode/reference.py: full-context forwards, one request at a time):
the same tokens and the same accepted length in every round, for every method."""
import pytest

from dmtp.block_drafter import fresh_drafter_for
from dmtp.decode import SpecDecoder, build_proposer
from dmtp.decode.reference import reference_generate, reference_proposal
from dmtp.injection import VARIANTS

MAX_NEW = 24
PROMPTS = [[17, 45, 300, 12, 9, 81, 77, 5, 40], [210, 11, 61, 400, 8], [33, 90, 120, 7, 64, 15, 300],
           [250, 251, 252, 253, 254, 255, 256, 257, 258, 259, 260, 261]]


# Every method; the multi-step variant also with an adaptive m (chosen per request and round).
METHODS = {"ar": {}, "mtp415": {}, **{name: {} for name in VARIANTS},
           "multi_mtp_zero_init@adaptive": {"mtp_threshold": 0.3}}


def _proposer(target, mtp, method):
    name = method.split("@")[0]
    if name in VARIANTS:   # a random drafter whose injected paths all matter (perturbed zero-init weights)
        drafter = fresh_drafter_for(target, name, 3, perturb=0.05, **METHODS[method])
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


@pytest.mark.parametrize("method", list(METHODS))
def test_fast_loop_equals_the_reference_round(micro_target, micro_mtp, eos, method):
    proposer = _proposer(micro_target, micro_mtp, method)
    fast = SpecDecoder(micro_target, proposer, eos_token_id=eos).generate(PROMPTS, max_new_tokens=MAX_NEW,
                                                                         batch_size=4)
    propose = reference_proposal(proposer)
    for i, prompt in enumerate(PROMPTS):
        tokens, accepted = reference_generate(micro_target, propose, prompt, MAX_NEW, eos_ids=eos)
        assert fast.tokens[i] == tokens, f"request {i}"
        assert fast.accepted[i] == accepted, f"request {i}"
    assert {out[-1] in eos for out in fast.tokens} == {True, False}   # EOS and the budget both end requests
    if method != "ar":
        assert any(a > 0 for acc in fast.accepted for a in acc)   # proposals were accepted, not only corrections
