"""The teacher-forced walk behind val/tau reproduces the decoding loop's greedy rounds exactly."""
import pytest
import torch

from dmtp.configs import compose_train
from dmtp.data.corpora import documents
from dmtp.decode import build_proposer
from dmtp.families.decoding import spec_decoder
from dmtp.drafters.block_drafter import fresh_drafter_for
from dmtp.models.target import load_tokenizer
from dmtp.training.blocks import teacher_features
from dmtp.training.components import build_components
from dmtp.training.validation import candidate_matches, exact_acceptance, mtp_chain_matches, walk
from tests.test_decode_loop import make_drafter

MAX_NEW = 40


WALK_CASES = [("raw_dflash", {}), ("token_only", {}), ("dual_anchor_zero_init", {}), ("context_fusion", {}),
              ("multi_mtp_zero_init", {}), ("multi_mtp_zero_init", {"num_mtp_tokens": 2}),
              ("multi_mtp_zero_init", {"mtp_threshold": 0.4})]   # fixed m = 3, fixed m = 2, adaptive m


@pytest.mark.parametrize("name,options", WALK_CASES, ids=[n + "".join(f"-{k}={v}" for k, v in o.items())
                                                           for n, o in WALK_CASES])
def test_walk_equals_loop(micro_target_dir, micro_target, micro_mtp, name, options):
    tok = load_tokenizer(micro_target_dir)
    prompts = []
    for domain in ("math", "code", "prose"):
        for doc in documents(domain, "test")[:2]:
            prompts.append(tok(doc.text, add_special_tokens=False)["input_ids"][:24])
    drafter = fresh_drafter_for(micro_target, name, 3, perturb=0.05, **options)
    proposer = build_proposer("drafter", micro_target, mtp=micro_mtp, drafter=drafter)
    res = spec_decoder(micro_target, proposer, eos_token_id=None).generate(prompts, max_new_tokens=MAX_NEW, batch_size=3)
    total_loop = total_walk = 0
    for prompt, tokens, accepted in zip(prompts, res.tokens, res.accepted):
        # The loop's output is the target's greedy continuation (lossless). Candidates compared past
        # the budget never count (the last round is clamped), so any padding works.
        seq = torch.tensor([prompt + tokens + [0] * 8])
        matches = candidate_matches(micro_target, micro_mtp, drafter, seq)[0]
        rounds = walk(matches, len(prompt), MAX_NEW - 1)
        assert rounds == list(accepted), (rounds, list(accepted))
        total_loop += sum(a + 1 for a in accepted)
        total_walk += sum(a + 1 for a in rounds)
    assert total_loop == total_walk
    assert any(a > 0 for r in res.accepted for a in r) or name == "raw_dflash"
    steps = drafter.injection.mtp_steps
    if steps > 1:   # the MTP's chained tokens (T2, T3) were accepted: the chain is compared too
        assert any(a >= steps for r in res.accepted for a in r)


def test_exact_acceptance_counts(micro_target, micro_mtp):
    drafter = make_drafter(micro_target, "dual_anchor_zero_init", perturb=True)
    ids = torch.randint(10, 400, (2, 40))
    out = exact_acceptance(micro_target, micro_mtp, drafter, ids, torch.tensor([10, 12]), torch.tensor([40, 30]))
    assert out["walk_rounds"] == int(out["hist"].sum()) and out["walk_tokens"] >= out["walk_rounds"]
    assert out["anchor_count"] == (40 - 10 - 7) + (30 - 12 - 7)


@pytest.mark.parametrize("steps", [4, 2])
def test_mtp_chain_walk_equals_the_mtp_chain_loop(micro_target_dir, micro_target, micro_mtp, steps):
    """The run-end table's MTP-chain columns: the walk of the MTP chained alone accepts, round by round,
    what the decoding loop's mtp415 (mtp:<k>) accepts."""
    tok = load_tokenizer(micro_target_dir)
    prompts = [tok(doc.text, add_special_tokens=False)["input_ids"][:24]
               for domain in ("math", "code", "prose") for doc in documents(domain, "test")[:2]]
    method = "mtp415" if steps == 4 else f"mtp:{steps}"
    res = spec_decoder(micro_target, build_proposer(method, micro_target, mtp=micro_mtp), eos_token_id=None).generate(
        prompts, max_new_tokens=MAX_NEW, batch_size=3)
    assert any(a > 1 for r in res.accepted for a in r)   # the chain's later tokens are accepted too
    drafter = make_drafter(micro_target, "dual_anchor_zero_init")
    for prompt, tokens, accepted in zip(prompts, res.tokens, res.accepted):
        seq = torch.tensor([prompt + tokens + [0] * 8])
        matches = mtp_chain_matches(micro_mtp, teacher_features(micro_target, micro_mtp, drafter, seq), steps)[0]
        assert walk(matches, len(prompt), MAX_NEW - 1) == list(accepted)
    ids = torch.tensor([prompts[0] + res.tokens[0][:MAX_NEW - 1] + [0] * 8])
    length = torch.tensor([len(prompts[0]) + MAX_NEW - 1 + 7])
    out = exact_acceptance(micro_target, micro_mtp, drafter, ids, torch.tensor([len(prompts[0])]), length,
                           mtp_chain_steps=steps)
    assert out["mtp_chain"]["per_request"] == [list(res.accepted[0])]
    raw = make_drafter(micro_target, "raw_dflash")   # no MTP in use: no chain walked
    assert "mtp_chain" not in exact_acceptance(micro_target, None, raw, ids, torch.tensor([len(prompts[0])]), length,
                                               mtp_chain_steps=steps)


@pytest.mark.parametrize("value", [-1, 8, 2.5, True])
def test_bad_mtp_chain_steps_is_one_line(value):
    with pytest.raises(ValueError, match=r"^val_mtp_chain_steps must be an integer in 0\.\.7, got") as err:
        build_components(compose_train([f"model.val_mtp_chain_steps={value}"]))
    assert "\n" not in str(err.value)
