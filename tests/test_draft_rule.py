"""The draft rule per slot source (the MTP's, the block drafter's: sample from q, or its argmax with q one-hot):
how it is chosen, refused and read from the configs. Its exactness (the target's distribution, every
verification mode) is tests/test_decode_sampling.py's chi-square cases."""
from types import SimpleNamespace

import pytest
import torch

from dmtp.decode import SamplingConfig
from dmtp.decode.proposers import pick_tokens
from dmtp.decode.sampling import draft_rules
from dmtp.training.evaluate import mode_name, sampling_of


def _state(sampling):
    return SimpleNamespace(sampling=sampling, generator=torch.Generator().manual_seed(0))


def test_argmax_rule_drafts_the_argmax_with_a_one_hot_q():
    logits = torch.randn(3, 4, 11)
    st = _state(SamplingConfig(temperature=1.0, verification="rejection", block_draft="argmax"))
    token, q = pick_tokens(logits, st, "block")
    assert torch.equal(token, logits.argmax(-1))
    assert torch.equal(q, torch.nn.functional.one_hot(token, 11).float())
    # The other source keeps sampling from its own q: a distribution over the vocabulary, not a one-hot.
    _, q_mtp = pick_tokens(logits, st, "mtp")
    assert torch.allclose(q_mtp.sum(-1), torch.ones(3, 4)) and (q_mtp < 1).all()


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=1.0),
                                      SamplingConfig(verification="block", mtp_draft="sample")])
def test_target_only_and_greedy_always_draft_the_argmax(sampling):
    logits = torch.randn(2, 5, 7)
    for source in ("mtp", "block"):
        assert sampling.draft_rule(source) == "argmax"
        token, q = pick_tokens(logits, _state(sampling), source)
        assert torch.equal(token, logits.argmax(-1)) and q is None


def test_an_unknown_rule_or_source_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"draft_rule.block must be one of \('sample', 'argmax'\), got 'top1'"):
        SamplingConfig(temperature=1.0, verification="rejection", block_draft="top1")
    with pytest.raises(ValueError, match="unknown slot source 'drafter'"):
        draft_rules({"drafter": "argmax"})


def test_the_rule_is_part_of_the_sampling_key_and_of_a_training_eval_mode():
    base = SamplingConfig(temperature=1.0, verification="rejection")
    assert base.key() != SamplingConfig(temperature=1.0, verification="rejection", mtp_draft="argmax").key()
    mode = {"temperature": 1.0, "verification": "block", "draft_rule": {"block": "argmax"}}
    assert sampling_of(mode) == SamplingConfig(temperature=1.0, verification="block", block_draft="argmax")
    assert mode_name(mode) == "T=1 block block=argmax"


def test_infer_reads_the_rule_from_its_config():
    from dmtp.configs import compose_config
    from dmtp.inference.options import decode_options

    cfg = compose_config("infer", ["temperature=1", "verification=rejection", "draft_rule.block=argmax"])
    assert decode_options(cfg) == SamplingConfig(temperature=1.0, verification="rejection", block_draft="argmax")
