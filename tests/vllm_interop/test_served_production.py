"""The production drafters the README recommends, served by vLLM through dmtp's plug-in, with prefix caching on.

- greedy production: `dual_anchor_zero_init` on DSpark's heads with the MTP correction (`DMTPDSparkDraftModel`):
  the MTP's corrected T1, then the block drafted slot by slot with the Markov bias of the token before each;
- sampled production: `experiment=sampled` (`multi_mtp_zero_init`, m = 7: the corrected MTP's chain over the
  whole block; no drafter forward runs);
- and a chain that shares the block (`multi_mtp_zero_init`, 3 MTP steps, m per request from the MTP's confidence,
  on DSpark's heads): the drafter's Markov walk goes through the MTP's tokens the block holds.

Each is trained here for a few dozen steps on micro_vllm's own responses (acceptance is then non-trivial). One
engine per drafter, prefix caching on (KV blocks of 32 tokens) and prompts prefilled 8 tokens a step (chunked
prefill), serves: the 8 held-out prompts greedily; 128-token prompts twice (the second pass hits the cache); prompts
sharing their first 96 tokens; temperature-1 requests through vLLM's rejection sampler; 512 two-token requests (the
first speculative position's distribution). dmtp's own loop decodes the same prompts: every request's accepted
length at every round must be the same in both.
"""
from __future__ import annotations

import pytest

from tests.vllm_interop.common import ENGINE_ARGS, NEW_TOKENS, SKIP_REASON, per_position, second_token_p_value

pytest.importorskip("vllm", reason=SKIP_REASON)

from dmtp.decode import build_proposer  # noqa: E402
from dmtp.drafters.block_drafter import load_block_drafter  # noqa: E402
from dmtp.families.decoding import spec_decoder  # noqa: E402
from dmtp.families.mtp_loading import load_native_mtp  # noqa: E402
from dmtp.serving.vllm.engine import generate, make_llm, sampling_params, shutdown, spec_decode_counts  # noqa: E402

K = 7
SECOND_TOKEN_SAMPLES = 512
PRODUCTION = {
    "greedy": ("dual_anchor_zero_init", ("experiment=greedy", "drafter.mtp_correction_rank=8")),
    "sampled": ("multi_mtp_zero_init", ("experiment=sampled", "drafter.mtp_correction_rank=8")),
    "chain3": ("multi_mtp_zero_init", ("drafter=dspark", "injection.max_mtp_tokens=3", "injection.mtp_threshold=0.5",
                                       "drafter.mtp_correction_rank=8")),
}


_TRAINED: dict = {}   # name -> drafter dir: each drafter is trained once for the whole module


def _trained(name: str, tmp_path_factory):
    from tests.vllm_interop.common import train_interop_drafter

    if name not in _TRAINED:
        injection, overrides = PRODUCTION[name]
        _TRAINED[name] = train_interop_drafter(tmp_path_factory, injection, num_layers=2, overrides=overrides)
    return _TRAINED[name]


@pytest.fixture(scope="module", params=sorted(PRODUCTION))
def production(request, tmp_path_factory):
    return request.param, _trained(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def prompt_sets(interop_prompts):
    long = [p * 4 for p in interop_prompts]                       # 4 blocks of 32
    shared = [long[0][:96] + p for p in interop_prompts]          # 3 blocks in common, then each its own
    # The long prompts again, in the other order: no request takes the MTP slot its prompt had (a slot a
    # finished request left holds its rows, which a hit on the same prompt in the same slot would read as valid).
    return {"held_out": interop_prompts, "long": long, "long_again": long[::-1], "shared": shared}


@pytest.fixture(scope="module")
def dmtp_loop(production, vllm_target, vllm_target_dir, vllm_tokenizer, prompt_sets):
    """dmtp's own loop: the target alone and with the drafter, on every prompt set."""
    drafter, _ = load_block_drafter(production[1])
    mtp = load_native_mtp(vllm_target_dir, vllm_target.embed_tokens, vllm_target.lm_head)
    eos = vllm_tokenizer.eos_token_id
    ar = spec_decoder(vllm_target, build_proposer("ar", vllm_target), eos_token_id=eos)
    spec = spec_decoder(vllm_target, build_proposer("drafter", vllm_target, mtp=mtp, drafter=drafter), eos_token_id=eos)
    return {name: (ar.generate(p, max_new_tokens=NEW_TOKENS, batch_size=8),
                   spec.generate(p, max_new_tokens=NEW_TOKENS, batch_size=8))
            for name, p in prompt_sets.items() if name != "long_again"}


@pytest.fixture(scope="module")
def served(production, vllm_target_dir, vllm_tokenizer, prompt_sets):
    spec = {"method": "dflash", "model": str(production[1]), "num_speculative_tokens": K,
            "draft_sample_method": "probabilistic"}
    args = {**ENGINE_ARGS, "block_size": 32, "enable_prefix_caching": True, "enable_chunked_prefill": True,
            "long_prefill_token_threshold": 8}
    llm = make_llm(vllm_target_dir, args, speculative_config=spec)
    eos = [vllm_tokenizer.eos_token_id]
    greedy = sampling_params(NEW_TOKENS, eos)
    proposer = llm.llm_engine.model_executor.driver_worker.worker.model_runner.drafter
    try:
        out = {"proposer": type(proposer).__name__, "steps": proposer.injection.mtp_steps}
        for name in ("held_out", "long", "long_again", "shared"):
            out[name] = generate(llm, prompt_sets[name], greedy)
        out["hits"], out["misses"] = proposer.prefix_store.hits, proposer.prefix_store.misses
        before = spec_decode_counts(llm)
        # Unseeded: vLLM's CPU runner cannot rewind a seeded request's generator when a prefill is chunked
        # ("CPU Generator does not use offset").
        out["sampled"] = generate(llm, prompt_sets["held_out"], sampling_params(NEW_TOKENS, eos, temperature=1.0))
        after = spec_decode_counts(llm)
        out["sampled_counts"] = (after[0] - before[0], sum(after[1]) - sum(before[1]))
        second = generate(llm, [prompt_sets["held_out"][0]] * SECOND_TOKEN_SAMPLES,
                          sampling_params(2, eos, temperature=1.0))[0]
        out["second_tokens"] = [t[1] for t in second if len(t) == 2]
        out["greedy_again"] = generate(llm, prompt_sets["held_out"], greedy)
        yield out
    finally:
        shutdown(llm)


def test_a_production_drafter_is_served_by_the_dmtp_proposer_with_the_targets_greedy_tokens(production, dmtp_loop,
                                                                                             served):
    assert served["proposer"] == "DMTPProposer"
    assert served["steps"] == {"greedy": 1, "sampled": 7, "chain3": 3}[production[0]]
    for name in ("held_out", "long", "shared"):
        ar, spec = dmtp_loop[name]
        assert spec.tokens == ar.tokens, name
        assert served[name][0] == ar.tokens, name
    assert served["long_again"][0] == dmtp_loop["long"][0].tokens[::-1]
    assert served["greedy_again"][0] == dmtp_loop["held_out"][0].tokens


@pytest.mark.parametrize("name", ["held_out", "long", "long_again", "shared"])
def test_every_round_accepts_as_in_dmtps_loop_with_prefix_caching_on(dmtp_loop, served, name):
    """Every request's accepted length at every round equals dmtp's loop's (prompts prefilled 8 tokens a step),
    on a first pass, on the same prompts again (their first blocks served from vLLM's cache: the MTP's rows there
    rebuilt from the kept hidden states) and on prompts sharing their first 3 blocks."""
    _, spec = dmtp_loop[name.removesuffix("_again")]
    rounds = served[name][1][::-1] if name == "long_again" else served[name][1]
    assert rounds == spec.accepted_raw, (per_position(rounds, K), per_position(spec.accepted_raw, K))
    ours = per_position(spec.accepted_raw, K)
    assert ours[0] >= 0.3 * sum(len(r) for r in rounds) and ours[2] > 0   # T1 and later candidates accepted


def test_the_prefix_cache_was_hit_and_every_hit_rebuilt(served):
    """The second pass of the 128-token prompts (2 blocks each; vLLM keeps the last full block out of a hit for
    a drafter) and the 7 shared-prefix prompts after the first hit the cache; the store covered every hit."""
    assert served["hits"] >= 8 + 7 and served["misses"] == 0, (served["hits"], served["misses"])


def test_sampled_requests_run_through_vllms_rejection_sampler(served, dmtp_loop):
    drafts, accepted = served["sampled_counts"]
    rounds = served["sampled"][1]
    assert (drafts, accepted) == (sum(len(r) for r in rounds), sum(sum(r) for r in rounds))
    assert accepted >= 0.3 * drafts, (drafts, accepted)
    assert served["sampled"][0] != dmtp_loop["held_out"][0].tokens


def test_the_first_speculative_position_samples_the_targets_distribution(served, vllm_target, vllm_tokenizer,
                                                                         interop_prompts):
    p_value, bins = second_token_p_value(vllm_target, interop_prompts[0], vllm_tokenizer.eos_token_id,
                                         served["second_tokens"])
    assert len(served["second_tokens"]) > 0.9 * SECOND_TOKEN_SAMPLES and bins >= 5
    assert p_value > 1e-4, p_value


def test_argmax_drafts_keep_the_targets_distribution(tmp_path_factory, vllm_target, vllm_target_dir, vllm_tokenizer,
                                                     interop_prompts, tmp_path):
    """The draft rule per slot source in the drafter's config.json (`"dmtp": {"draft_rule": {...}}`, dmtp.infer's
    option): argmax drafts with q one-hot go through vLLM's rejection sampler losslessly; an unknown rule is
    refused in one line."""
    import json
    import shutil

    drafter = tmp_path / "argmax"   # the greedy production drafter, with argmax drafts from both slot sources
    shutil.copytree(_trained("greedy", tmp_path_factory), drafter)
    config = json.loads((drafter / "config.json").read_text())
    config["dmtp"]["draft_rule"] = {"mtp": "argmax", "block": "argmax"}
    (drafter / "config.json").write_text(json.dumps(config))
    spec = {"method": "dflash", "model": str(drafter), "num_speculative_tokens": K, "draft_sample_method": "probabilistic"}
    eos = vllm_tokenizer.eos_token_id
    llm = make_llm(vllm_target_dir, ENGINE_ARGS, speculative_config=spec)
    try:
        second = generate(llm, [interop_prompts[0]] * SECOND_TOKEN_SAMPLES, sampling_params(2, [eos], temperature=1.0))[0]
        assert llm.llm_engine.model_executor.driver_worker.worker.model_runner.drafter.model.dmtp_draft_rule == \
            {"mtp": "argmax", "block": "argmax"}
    finally:
        shutdown(llm)
    p_value, bins = second_token_p_value(vllm_target, interop_prompts[0], eos, [t[1] for t in second if len(t) == 2])
    assert bins >= 5 and p_value > 1e-4, p_value
    config["dmtp"]["draft_rule"] = {"mtp": "top1"}
    (drafter / "config.json").write_text(json.dumps(config))
    with pytest.raises(Exception, match=r"draft_rule\.mtp must be one of"):
        make_llm(vllm_target_dir, ENGINE_ARGS, speculative_config=spec)
