"""DMTP served by vLLM through dmtp's plug-in (entry point `vllm.general_plugins: dmtp`): the native
MTP proposes T1, the block drafter the rest with the injection's T1 slot, vLLM's target verifies.

The drafter (dual_anchor_zero_init) is trained here for a few dozen steps on the micro_vllm target's
own responses, so that both the MTP's candidate and the drafter's are accepted and the per-position
comparison with dmtp's own loop means something. One engine serves every test of the module: all
8 prompts at once (continuous batching, batch > 1), then sampled requests, then greedy again, then
512 two-token sampled requests on one prompt (the first speculative position's distribution).
"""
from __future__ import annotations

import pytest

from tests.vllm_interop.common import ENGINE_ARGS, NEW_TOKENS, SKIP_REASON

pytest.importorskip("vllm", reason=SKIP_REASON)

import torch  # noqa: E402

from dmtp.decode import build_proposer  # noqa: E402
from dmtp.families.decoding import spec_decoder  # noqa: E402
from dmtp.drafters.block_drafter import fresh_drafter_for, load_block_drafter  # noqa: E402
from dmtp.families.mtp_loading import load_native_mtp  # noqa: E402
from dmtp.serving.vllm.engine import generate, generate_tokens, make_llm, sampling_params, shutdown, spec_decode_counts  # noqa: E402

K = 7   # candidates per round; vLLM's num_speculative_tokens
SECOND_TOKEN_SAMPLES = 512   # sampled 2-token requests on one prompt: the first speculative position


@pytest.fixture(scope="module")
def dmtp_loop(vllm_target, vllm_target_dir, vllm_tokenizer, interop_prompts, dmtp_drafter_dir):
    """dmtp's own loop on the prompts: the target alone (AR) and with the DMTP drafter and the MTP."""
    drafter, _ = load_block_drafter(dmtp_drafter_dir)
    mtp = load_native_mtp(vllm_target_dir, vllm_target.embed_tokens, vllm_target.lm_head)
    eos = vllm_tokenizer.eos_token_id
    ar = spec_decoder(vllm_target, build_proposer("ar", vllm_target), eos_token_id=eos)
    spec = spec_decoder(vllm_target, build_proposer("drafter", vllm_target, mtp=mtp, drafter=drafter), eos_token_id=eos)
    return (ar.generate(interop_prompts, max_new_tokens=NEW_TOKENS, batch_size=8),
            spec.generate(interop_prompts, max_new_tokens=NEW_TOKENS, batch_size=8))


@pytest.fixture(scope="module")
def served(vllm_target_dir, vllm_tokenizer, interop_prompts, dmtp_drafter_dir):
    """vLLM with the DMTP drafter: greedy tokens and counters, then sampled tokens and the counters'
    growth, then greedy tokens again. Drafts are sampled (not vLLM's default argmax) when the request
    samples, so the MTP's T1 goes to the rejection sampler with its own probabilities."""
    spec = {"method": "dflash", "model": str(dmtp_drafter_dir), "num_speculative_tokens": K,
            "draft_sample_method": "probabilistic"}
    # KV blocks of 32 tokens (vLLM's CPU default is 128) and prefix caching on: the 128-token prompts below span 4
    # whole blocks, so the engine serves 2 of them from its cache on the second pass.
    llm = make_llm(vllm_target_dir, {**ENGINE_ARGS, "block_size": 32, "enable_prefix_caching": True},
                   speculative_config=spec)
    eos = [vllm_tokenizer.eos_token_id]
    try:
        greedy = generate_tokens(llm, interop_prompts, sampling_params(NEW_TOKENS, eos))
        drafts, per_pos = spec_decode_counts(llm)
        sampled, sampled_rounds = generate(llm, interop_prompts, [sampling_params(NEW_TOKENS, eos, temperature=1.0,
                                                                                  seed=i)
                                                                  for i in range(len(interop_prompts))])
        sampled_drafts, sampled_per_pos = spec_decode_counts(llm)
        greedy_again = generate_tokens(llm, interop_prompts, sampling_params(NEW_TOKENS, eos))
        long_prompts = [p * 4 for p in interop_prompts]   # 4 blocks: a hit keeps 2 (the last full one is recomputed for the drafter)
        repeats = []
        for order in (1, -1):   # again in the other order: no request gets the MTP slot its prompt had before
            before = spec_decode_counts(llm)
            tokens = generate_tokens(llm, long_prompts[::order], sampling_params(NEW_TOKENS, eos))[::order]
            after = spec_decode_counts(llm)
            repeats.append((tokens, after[0] - before[0], [a - b for a, b in zip(after[1], before[1])]))
        # Unseeded: vLLM's CPU runner cannot rewind a request's generator when a prefill is chunked
        # ("CPU Generator does not use offset"), which 512 prompts at once are.
        second = generate_tokens(llm, [interop_prompts[0]] * SECOND_TOKEN_SAMPLES,
                                 sampling_params(2, eos, temperature=1.0))
        yield {"greedy": greedy, "drafts": drafts, "per_pos": per_pos, "sampled": sampled,
               "sampled_rounds": sampled_rounds,
               "sampled_drafts": sampled_drafts - drafts,
               "sampled_accepted": sum(sampled_per_pos) - sum(per_pos), "greedy_again": greedy_again,
               "repeats": repeats, "prefix_caching": llm.llm_engine.vllm_config.cache_config.enable_prefix_caching,
               "prefix_hits": _proposer(llm).prefix_store.hits,
               "second_tokens": [t[1] for t in second if len(t) == 2],
               "proposer": type(_proposer(llm)).__name__}
    finally:
        shutdown(llm)


def _proposer(llm):
    return llm.llm_engine.model_executor.driver_worker.worker.model_runner.drafter


def _per_position(accepted: list[list[int]]) -> list[int]:
    return [sum(a > k for rounds in accepted for a in rounds) for k in range(K)]


def test_dmtp_drafter_served_by_vllm_gives_the_targets_greedy_tokens(dmtp_loop, served):
    ar, spec = dmtp_loop
    assert served["proposer"] == "DMTPProposer"
    assert spec.tokens == ar.tokens
    assert served["greedy"] == ar.tokens


def test_vllm_acceptance_per_position_equals_dmtps_loop(dmtp_loop, served):
    _, spec = dmtp_loop
    ours = _per_position(spec.accepted_raw)
    assert served["drafts"] == sum(len(r) for r in spec.accepted_raw)
    assert served["per_pos"] == ours, (served["per_pos"], ours)
    # The MTP's T1 and the drafter's candidates after it are both accepted.
    assert ours[0] >= 0.3 * served["drafts"] and ours[2] > 0


def test_sampling_runs_through_vllms_rejection_sampler_with_drafts_accepted(dmtp_loop, served, vllm_target):
    """Temperature 1: every request's rounds (vLLM's per-request metrics) add up to the engine's
    counters, and drafts are accepted at a rate no broken sampler reaches. On CPU this needs the
    plug-in's expansion fix (`vllm_cpu_fixes`): with vLLM's own, the target's logits were divided by
    uninitialised memory and requests ended after 1-2 tokens with nothing accepted, in some runs."""
    ar, _ = dmtp_loop
    vocab = vllm_target.config.vocab_size
    rounds = served["sampled_rounds"]
    accepted = sum(sum(r) for r in rounds)
    assert (served["sampled_drafts"], served["sampled_accepted"]) == (sum(len(r) for r in rounds), accepted)
    assert accepted >= 0.5 * served["sampled_drafts"], (
        served["sampled_drafts"], accepted, [len(t) for t in served["sampled"]])
    assert all(0 < len(t) <= NEW_TOKENS and all(0 <= x < vocab for x in t) for t in served["sampled"])
    assert served["sampled"] != ar.tokens


def test_the_first_speculative_position_samples_the_targets_distribution(served, vllm_target, vllm_tokenizer,
                                                                         interop_prompts):
    """Token 2 of a temperature-1 request is the rejection sampler's verdict on the MTP's sampled T1
    (its probabilities) and the drafter's; its distribution must be the target's own marginal
    sum_x p(x | prompt) p(y | prompt, x). Chi-square over the tokens expected >= 5 times (the rest
    pooled): a lossless sampler fails it with probability 1e-4."""
    eos = vllm_tokenizer.eos_token_id
    prompt = torch.tensor([interop_prompts[0]])
    with torch.no_grad():
        p_first = vllm_target(prompt).logits[0, -1].softmax(-1)
        p_first[eos] = 0   # an EOS first token ends the request: no second token
        p_first /= p_first.sum()
        firsts = torch.arange(p_first.shape[0])[:, None]
        p_second = vllm_target(torch.cat([prompt.expand(len(firsts), -1), firsts], 1)).logits[:, -1].softmax(-1)
    expected = (p_first @ p_second) * len(served["second_tokens"])
    observed = torch.bincount(torch.tensor(served["second_tokens"]), minlength=expected.shape[0]).double()
    binned = expected >= 5
    e = torch.cat([expected[binned], expected[~binned].sum()[None]]).double()
    o = torch.cat([observed[binned], observed[~binned].sum()[None]])
    chi2 = ((o - e) ** 2 / e).sum()
    p_value = torch.special.gammaincc(torch.tensor((len(e) - 1) / 2.0, dtype=torch.float64), chi2 / 2).item()
    assert len(served["second_tokens"]) > 0.9 * SECOND_TOKEN_SAMPLES and binned.sum() >= 5
    assert p_value > 1e-4, (chi2.item(), len(e) - 1, p_value)


def test_greedy_after_sampled_requests_is_unchanged(dmtp_loop, served):
    ar, _ = dmtp_loop
    assert served["greedy_again"] == ar.tokens


def test_a_repeated_prompt_is_drafted_as_the_first_time_with_prefix_caching_on(served):
    """128-token prompts twice, prefix caching on: the same tokens and acceptance. The second pass is served 2
    blocks per prompt from vLLM's cache (it keeps the last full block out of a hit for a drafter), so the target
    never runs there; the plug-in rebuilds the MTP's rows of those positions from the target's hidden states it
    kept (`mtp_prefix`). Without the rebuild, measured before it existed: 246 rounds instead of 205."""
    assert served["prefix_caching"] is True and served["prefix_hits"] >= 8
    (first, *first_counts), (second, *second_counts) = served["repeats"]
    assert second == first
    assert second_counts == first_counts and first_counts[0] > 0


def test_a_variant_vllms_block_cannot_host_is_refused_with_the_reason(vllm_target, vllm_target_dir, tmp_path):
    """fusion_t1's block starts at T1 ([T1+D, MASK x6] after A): never served as another layout."""
    fresh_drafter_for(vllm_target, "fusion_t1", vllm_target.config.vocab_size - 1).save(tmp_path / "fusion_t1")
    spec = {"method": "dflash", "model": str(tmp_path / "fusion_t1"), "num_speculative_tokens": K}
    refusal = (r"\(fusion_t1\) cannot be served by vLLM: its block does not start at the anchor .*; "
               r"decode it with python -m dmtp.infer")
    with pytest.raises(Exception, match=refusal):
        make_llm(vllm_target_dir, ENGINE_ARGS, speculative_config=spec)


def test_chunked_prefill_gives_the_same_tokens_and_acceptance(vllm_target_dir, vllm_tokenizer, interop_prompts,
                                                              dmtp_drafter_dir, dmtp_loop):
    """Prompts prefilled 8 tokens a step: the MTP rows at chunk ends read the prompt's next token (vLLM
    passes a placeholder there), so the MTP's state, and acceptance, are the unchunked ones."""
    spec = {"method": "dflash", "model": str(dmtp_drafter_dir), "num_speculative_tokens": K}
    llm = make_llm(vllm_target_dir, {**ENGINE_ARGS, "enable_chunked_prefill": True, "long_prefill_token_threshold": 8},
                   speculative_config=spec)
    try:
        tokens = generate_tokens(llm, interop_prompts, sampling_params(NEW_TOKENS, [vllm_tokenizer.eos_token_id]))
        drafts, per_pos = spec_decode_counts(llm)
    finally:
        shutdown(llm)
    ar, ours = dmtp_loop
    assert tokens == ar.tokens
    assert (drafts, per_pos) == (sum(len(r) for r in ours.accepted_raw), _per_position(ours.accepted_raw))
