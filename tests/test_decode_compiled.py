"""The compiled round (`spec_decoder(compile=...)`, dmtp/decode/execution/compiled.py): the same tokens and accepted
lengths as the eager loop, compile time reported apart, no recompilation once warm, programs of
different shapes replayed in turn (replay evaluates only the guards that tell a stage's programs apart),
and sampled calls (eager) in between leave the compiled greedy path as it was.

The protocol runs with the "aot_eager" backend (dynamo tracing and functionalised in-place updates, no
code generation: seconds); one test runs inductor's generated kernels (tokens and accepted lengths)."""
import time

import pytest
import torch

from dmtp.decode import SamplingConfig, build_proposer
from dmtp.families.decoding import spec_decoder
from dmtp.drafters.block_drafter import fresh_drafter_for


def _prompts():
    return [[5 + i, 17, 99, 23 + i, 7] * (2 + i) for i in range(5)]


def _proposer(target, mtp, method, block_size=8):
    if method == "ar":
        return build_proposer("ar", target)
    drafter = fresh_drafter_for(target, method, 3, seed=0, perturb=0.05, block_size=block_size)
    return build_proposer("drafter", target, mtp=mtp, drafter=drafter, name=method)


def test_compiled_block16_matches_eager(micro_target, micro_mtp):
    """A block-16 drafter (15 candidates) compiles into its own fixed-shape program: same tokens and accepted
    lengths as eager, and the second call replays it without recompiling."""
    prompts = _prompts()
    eager = spec_decoder(micro_target, _proposer(micro_target, micro_mtp, "dual_anchor_zero_init", 16),
                        eos_token_id=[]).generate(prompts, max_new_tokens=24, batch_size=2)
    compiled = spec_decoder(micro_target, _proposer(micro_target, micro_mtp, "dual_anchor_zero_init", 16),
                           eos_token_id=[], compile="aot_eager")
    for i in range(2):
        with torch.compiler.set_stance("fail_on_recompile" if i else "default"):
            res = compiled.generate(prompts, max_new_tokens=24, batch_size=2)
        assert res.extra["compiled"] and res.num_candidates == 15
        assert res.tokens == eager.tokens and res.accepted == eager.accepted


@pytest.mark.parametrize("method", ["dual_anchor_zero_init"])
def test_compiled_protocol_matches_eager(micro_target, micro_mtp, method):
    prompts = _prompts()
    eager = spec_decoder(micro_target, _proposer(micro_target, micro_mtp, method), eos_token_id=[])
    compiled = spec_decoder(micro_target, _proposer(micro_target, micro_mtp, method), eos_token_id=[],
                           compile="aot_eager")
    assert compiled.compiled and compiled.fixed_shapes and not eager.fixed_shapes
    # Two batch buckets, then both again: once warm, nothing recompiles, and each call replays its own
    # programs (the stages' code is shared, so both shapes' programs sit on the same code objects).
    for i, batch in enumerate((2, 1, 2, 1)):
        ref = eager.generate(prompts, max_new_tokens=20, batch_size=batch)
        start = time.perf_counter()
        with torch.compiler.set_stance("fail_on_recompile" if i >= 2 else "default"):
            res = compiled.generate(prompts, max_new_tokens=20, batch_size=batch)
        elapsed = time.perf_counter() - start
        assert res.tokens == ref.tokens and res.accepted == ref.accepted
        assert res.extra["compiled"] and res.extra["compile_s"] > 0   # the warm-up (compiling, or cache hits)
        assert res.wall_s <= elapsed - res.extra["compile_s"] + 1e-3   # ... is not decoding time
    if method != "ar":
        assert any(a > 0 for acc in res.accepted for a in acc)   # rounds that accepted drafts, not only corrections
    assert compiled.st.max_len % 64 == 0 and compiled.runner.span is None   # whole (bucketed) caches
    # Sampling runs eagerly (live span) on the same state; greedy replays after it are unchanged.
    sampling = SamplingConfig(temperature=1.0, verification="rejection")
    res = compiled.generate(prompts, max_new_tokens=20, batch_size=2, sampling=sampling, seed=5)
    assert not res.extra["compiled"] and res.extra["compile_s"] == 0
    assert res.tokens == compiled.generate(prompts, max_new_tokens=20, batch_size=2, sampling=sampling, seed=5).tokens
    with torch.compiler.set_stance("fail_on_recompile"):
        res = compiled.generate(prompts, max_new_tokens=20, batch_size=2)
    assert res.extra["compiled"] and compiled.runner.span is None
    assert res.tokens == eager.generate(prompts, max_new_tokens=20, batch_size=2).tokens


def test_inductor_compiled_acceptance_equals_eager(micro_target, micro_mtp):
    """inductor's generated C++ kernels reduce in another order than eager ATen: the greedy tokens stay the
    target's, and every round accepts what the eager loop accepts. (Stages compiled one by one
    with inductor once lost acceptance across stage boundaries while the tokens stayed exact; the
    compiled path now runs the round as one program.)"""
    prompts = _prompts()[:3]
    proposer = build_proposer("mtp415", micro_target, mtp=micro_mtp)
    ref = spec_decoder(micro_target, proposer, eos_token_id=[]).generate(prompts, max_new_tokens=24, batch_size=1)
    res = spec_decoder(micro_target, proposer, eos_token_id=[], compile=True).generate(prompts, max_new_tokens=24,
                                                                                  batch_size=1)
    assert res.extra["compiled"]
    assert sum(map(sum, ref.accepted)) > 0   # the MTP's drafts are accepted now and then
    assert res.tokens == ref.tokens and res.accepted == ref.accepted
