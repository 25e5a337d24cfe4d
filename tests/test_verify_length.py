"""One verify length per batch (`verify_length`, dmtp/decode/verify_length/policy.py, issue 41).

The loop with a fixed or chosen L equals the reference round verifying the first L candidates of the same
proposal, round by round, and the target's greedy tokens, for drafters with a confidence head, MTP-led
drafters and the MTP chain, at several batch sizes; sampled, it keeps the target's distribution in every
verification mode while L changes between rounds; one program per L replays through the capture protocol;
the policy picks L from the table, the calibrated survival and the overhead as documented; the bad options
are one line."""
from __future__ import annotations

import itertools
import json
from collections import Counter

import pytest
import torch

from dmtp.decode import SamplingConfig, build_proposer
from dmtp.families.decoding import spec_decoder
from dmtp.decode import SpecDecoder
from dmtp.decode.verify_length.costs import measure_round_costs
from dmtp.decode.reference import reference_generate, reference_proposal
from dmtp.decode.verify_length.stats import (HITS, OBSERVED, PREDICTED, PREDICTED_OBSERVED, REQUESTS, LengthStats,
                                      Readout)
from dmtp.decode.verify_length.policy import VerifyLengthPolicy
from dmtp.drafters.block_drafter import fresh_drafter_for
from test_dspark import PROMPTS, dspark_drafter

AUTO = SamplingConfig(verify_length="auto")


def proposer(target, mtp, method):
    """`dspark:<variant>` (a DSpark drafter whose head predicts), `<variant>` (DFlash backbone), or mtp415."""
    if method == "mtp415":
        return build_proposer("mtp415", target, mtp=mtp)
    arch, _, name = method.rpartition(":")
    drafter = (dspark_drafter(target, name) if arch == "dspark"
               else fresh_drafter_for(target, name, 3, perturb=0.05, seed=3))
    return build_proposer("drafter", target, mtp=mtp, drafter=drafter, name=method)


def assert_equals_reference(target, prop, res, prompts, max_new):
    """Each request's tokens and accepted lengths are the reference round's, verifying per round the first
    L candidates of the reference proposal, L the loop's recorded length of that round."""
    propose = reference_proposal(prop)
    for i, prompt in enumerate(prompts):
        lengths = iter(res.verify_lengths[i])
        tokens, accepted = reference_generate(target, lambda t, ids: propose(t, ids)[:next(lengths)], prompt, max_new)
        assert (res.tokens[i], res.accepted[i]) == (tokens, accepted), (i, res.verify_lengths[i])
        assert len(res.verify_lengths[i]) == len(res.accepted[i])


@pytest.fixture
def cycling(monkeypatch):
    """The policy's choice replaced by a fixed cycle through L = 7, 0, 3, 1, 7, 2, 0, 5, ... (every switch,
    drafting off included); the cost table is still measured."""
    cycle = itertools.cycle([7, 0, 3, 1, 7, 2, 0, 5, 6, 4])
    monkeypatch.setattr(VerifyLengthPolicy, "choose", lambda self: next(cycle) % (self.k + 1))


# -- greedy: exact, and the reference round's -------------------------------------------------------------

@pytest.mark.parametrize("method", ["dspark:raw_dflash", "dspark:dual_anchor_zero_init", "dual_anchor_zero_init",
                                    "mtp415"])
def test_fixed_lengths_equal_the_reference_of_the_shorter_block(micro_target, micro_mtp, method):
    prop = proposer(micro_target, micro_mtp, method)
    ar = spec_decoder(micro_target, build_proposer("ar", micro_target)).generate(PROMPTS, max_new_tokens=16)
    for length in (0, 2, prop.num_candidates):
        res = spec_decoder(micro_target, prop).generate(PROMPTS, max_new_tokens=16, batch_size=2,
                                                       sampling=SamplingConfig(verify_length=length))
        assert res.tokens == ar.tokens
        assert_equals_reference(micro_target, prop, res, PROMPTS, 16)
        assert res.summary()["verified_per_round"] == length
        assert all(set(v) == {length} for v in res.verify_lengths)
        if length:
            assert max(a for acc in res.accepted for a in acc) > 0


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("method", ["dspark:raw_dflash", "dspark:multi_mtp_zero_init", "mtp415"])
def test_lengths_switching_between_rounds_equal_the_reference(micro_target, micro_mtp, method, batch, cycling):
    prop = proposer(micro_target, micro_mtp, method)
    ar = spec_decoder(micro_target, build_proposer("ar", micro_target)).generate(PROMPTS, max_new_tokens=20)
    res = spec_decoder(micro_target, prop).generate(PROMPTS, max_new_tokens=20, batch_size=batch, sampling=AUTO)
    assert res.tokens == ar.tokens
    assert_equals_reference(micro_target, prop, res, PROMPTS, 20)
    used = {n for v in res.verify_lengths for n in v}
    assert len(used & set(range(prop.num_candidates + 1))) >= 4 and 0 in used, used
    share = res.summary()["verify_length_share"]
    assert abs(sum(share.values()) - 1) < 1e-9 and res.summary()["cost_table_s"] > 0


@pytest.mark.parametrize("method", ["dspark:dual_anchor_zero_init", "dual_anchor_zero_init", "mtp415"])
def test_the_measured_policy_decodes_exactly(micro_target, micro_mtp, method):
    """The real policy: the cost table measured here, the survival predicted by the DSpark head and the
    MTP's top-1 probability of its candidates (below 1, never rising along the block)."""
    prop = proposer(micro_target, micro_mtp, method)
    ar = spec_decoder(micro_target, build_proposer("ar", micro_target)).generate(PROMPTS, max_new_tokens=24)
    dec = spec_decoder(micro_target, prop)
    res = dec.generate(PROMPTS, max_new_tokens=24, batch_size=3, sampling=AUTO)
    assert res.tokens == ar.tokens
    assert_equals_reference(micro_target, prop, res, PROMPTS, 24)
    (policy,) = dec._length_policies.values()
    assert len(policy.costs) == prop.num_candidates + 1 and policy.survival is not None
    assert all(0 < s <= 1 for s in policy.survival) and policy.survival[0] < 0.99
    assert all(a >= b - 1e-6 for a, b in zip(policy.survival, policy.survival[1:]))


# -- sampled: the target's distribution while L changes -------------------------------------------------

@pytest.mark.parametrize("verification", ["target_only", "rejection", "block"])
def test_switching_lengths_keep_the_target_distribution(micro_target, micro_mtp, verification, cycling):
    from test_decode_sampling import N_SAMPLES, STEPS, _chi2_pvalue, _exact_probs

    sampling = SamplingConfig(temperature=1.0, top_k=4, verification=verification, verify_length="auto")
    prompt = PROMPTS[0]
    prop = proposer(micro_target, micro_mtp, "dspark:dual_anchor_zero_init")
    res = spec_decoder(micro_target, prop, eos_token_id=[]).generate(
        [prompt] * N_SAMPLES, max_new_tokens=STEPS, sampling=sampling, batch_size=250, seed=7)
    counts = Counter(tuple(t) for t in res.tokens)
    probs = _exact_probs(micro_target, prompt, list(counts), sampling)
    assert all(p > 0 for p in probs.values())
    pvalue = _chi2_pvalue(counts, probs, N_SAMPLES)
    assert pvalue > 1e-3, (pvalue, counts.most_common(8))
    assert sum(a for acc in res.accepted for a in acc) > N_SAMPLES // 20
    assert len({n for v in res.verify_lengths for n in v}) >= 2


# -- programs per L: the capture protocol on CPU, graphs on CUDA ---------------------------------------------

def test_one_program_per_length_through_the_capture_protocol(micro_target, micro_mtp, monkeypatch, cycling):
    """With graphs (an eager stand-in keeping the protocol: warm-up passes, then the restore), every L of
    the cost table is captured once and replayed, and decoding is the reference round's."""
    import dmtp.decode.execution.graphs as graphs
    from test_decode_graphs import _EagerGraphs

    monkeypatch.setattr(graphs, "RoundGraphs", _EagerGraphs)
    prop = proposer(micro_target, micro_mtp, "dspark:raw_dflash")
    fake = spec_decoder(micro_target, prop, eos_token_id=[], time_stages=False, graph_span_step=None)
    fake.use_graphs = True
    for _ in range(2):   # the second call reuses the programs, the table and the state
        res = fake.generate(PROMPTS, max_new_tokens=20, batch_size=3, sampling=AUTO)
        assert_equals_reference(micro_target, prop, res, PROMPTS, 20)
    assert sorted(key[-1] for key in fake._graphs) == list(range(prop.num_candidates + 1))


def test_stages_of_every_length_declare_their_writes(micro_target, micro_mtp):
    from test_decode_stage_writes import MAX_NEW, undeclared_writes

    for sampling in (AUTO, SamplingConfig(temperature=1.0, verification="block", verify_length="auto",
                                          confidence_threshold=0.5)):
        dec = spec_decoder(micro_target, proposer(micro_target, micro_mtp, "dspark:dual_anchor_zero_init"),
                          eos_token_id=[], time_stages=False)
        st = dec._ensure_state(len(PROMPTS), 64, MAX_NEW, sampling)
        st.generator = torch.Generator().manual_seed(0)
        dec._prefill(st, PROMPTS, MAX_NEW)
        for length in (7, 0, 3):
            dec._set_span(st, int(dec.runner.lengths.max()))
            names = [stage.name for stage in dec.stages(st, length)]
            assert names == (["verify", "mtp", "drafter"] if length == 0 else
                             ["t1_fusion", "drafter", "verify", "mtp", "drafter"])   # L = 0 drafts nothing
            for stage in dec.stages(st, length):
                bad = undeclared_writes(stage, state=st, runner=dec.runner, proposer=dec.proposer)
                assert not bad, (length, stage.name, bad)
        assert st.length_stats.tensor[REQUESTS].sum() > 0


def test_a_fixed_length_compiles_and_equals_eager(micro_target, micro_mtp):
    prop = proposer(micro_target, micro_mtp, "dspark:dual_anchor_zero_init")
    sampling = SamplingConfig(verify_length=3)
    eager = spec_decoder(micro_target, prop, eos_token_id=[]).generate(PROMPTS, 16, sampling=sampling, batch_size=2)
    res = spec_decoder(micro_target, prop, eos_token_id=[], compile="aot_eager").generate(
        PROMPTS, 16, sampling=sampling, batch_size=2)
    assert res.extra["compiled"] and res.tokens == eager.tokens and res.accepted == eager.accepted


@pytest.mark.gpu
def test_cuda_graphs_per_length_equal_the_reference(micro_target_dir):
    """On CUDA: one graph per L (the table measures every one), fp32 greedy equal to the reference round with
    the lengths the policy chose; sampled runs through switching lengths complete."""
    from dmtp.families.mtp_loading import load_native_mtp
    from dmtp.models.target import TargetModel

    target = TargetModel.from_pretrained(micro_target_dir).to("cuda")
    mtp = load_native_mtp(micro_target_dir, target.embed_tokens, target.lm_head).to("cuda")
    drafter = dspark_drafter(target, "dual_anchor_zero_init").to("cuda")
    prop = build_proposer("drafter", target, mtp=mtp, drafter=drafter)
    dec = spec_decoder(target, prop, eos_token_id=[], cuda_graphs=True)
    res = dec.generate(PROMPTS, 24, sampling=AUTO, batch_size=4)
    assert res.extra["cuda_graphs"] and {key[-1] for key in dec._graphs} == set(range(prop.num_candidates + 1))
    cpu_target = TargetModel.from_pretrained(micro_target_dir)
    cpu_mtp = load_native_mtp(micro_target_dir, cpu_target.embed_tokens, cpu_target.lm_head)
    cpu_drafter = dspark_drafter(cpu_target, "dual_anchor_zero_init")
    cpu_prop = build_proposer("drafter", cpu_target, mtp=cpu_mtp, drafter=cpu_drafter)
    assert_equals_reference(cpu_target, cpu_prop, res, PROMPTS, 24)
    sampled = dec.generate(PROMPTS, 24, sampling=SamplingConfig(temperature=1.0, verification="rejection",
                                                                verify_length="auto"), batch_size=4, seed=1)
    assert all(len(t) == 24 for t in sampled.tokens)


# -- recurrent targets: per-width buffers --------------------------------------------------------------------

def test_hybrid_target_switches_lengths_exactly(micro_target_dir, tmp_path, cycling):
    """A Gated-DeltaNet target keeps one row buffer per verified width: lengths switching every round give
    its greedy tokens."""
    from dmtp.families.mtp_loading import load_native_mtp
    from dmtp.models.target import TargetModel
    from test_real_targets import write_qwen35

    root = write_qwen35(tmp_path / "dense", micro_target_dir, moe=False)
    target = TargetModel.from_pretrained(root)
    mtp = load_native_mtp(root, target.embed_tokens, target.lm_head)
    ar = spec_decoder(target, build_proposer("ar", target)).generate(PROMPTS, max_new_tokens=16)
    res = spec_decoder(target, build_proposer("mtp415", target, mtp=mtp)).generate(
        PROMPTS, max_new_tokens=16, batch_size=3, sampling=SamplingConfig(verify_length="auto"))
    assert res.extra["runner"] == "hybrid" and res.tokens == ar.tokens
    assert len({n for v in res.verify_lengths for n in v}) >= 3


def test_a_recurrent_cache_keeps_one_row_buffer_per_width():
    """What one graph per L needs of a Gated-DeltaNet cache: the buffers of a width stay the same tensors
    when another width ran in between (a captured graph keeps reading the ones it was captured with), and
    commit reads the last verify's."""
    from dmtp.models.gated_deltanet import GDNCache

    cache = GDNCache(2, 8, 4, 2, 4, 4, torch.float32, "cpu")
    wide = cache.block_buffers(8)
    narrow = cache.block_buffers(3)
    assert cache.rows is narrow[1] and narrow[1].shape[1] == 3
    again = cache.block_buffers(8)
    assert again[0] is wide[0] and again[1] is wide[1] and cache.rows is wide[1]


# -- refused in one line -------------------------------------------------------------------------------------

def test_bad_verify_lengths_are_one_line(micro_target, micro_mtp):
    for bad in ("some", -1, True, 2.0):
        with pytest.raises(ValueError, match=r"^verify_length must be full, auto or an integer >= 0"):
            SamplingConfig(verify_length=bad)
    raw = build_proposer("drafter", micro_target, drafter=fresh_drafter_for(micro_target, "raw_dflash", 1))
    with pytest.raises(ValueError, match=r"^verify_length=auto needs an acceptance signal .*; drafter has none$"):
        spec_decoder(micro_target, raw).generate(PROMPTS, 8, sampling=AUTO)
    with pytest.raises(ValueError, match=r"^verify_length=9 exceeds the 7 candidates"):
        spec_decoder(micro_target, raw).generate(PROMPTS, 8, sampling=SamplingConfig(verify_length=9))


# -- the pieces: the policy, the device record, the cost measurement -----------------------------------------

def observe(policy, survival, hits, observed, rounds=1, seconds=0.0, length=None, requests=1.0, per_request=None):
    """One readout as LengthStats would give it: per candidate, predicted survival summed over requests,
    hits / observed counts and the predicted survival of the observed; `per_request`: [(remaining budget,
    its survival)] (none: the batch's rate alone)."""
    k = policy.k
    rows = [[0.0] * k for _ in range(5)]
    rows[PREDICTED] = [s * requests for s in survival]
    rows[HITS], rows[OBSERVED] = list(hits), list(observed)
    rows[PREDICTED_OBSERVED] = [s * o for s, o in zip(survival, observed)]
    rows[REQUESTS] = [requests * rounds] * k
    # per request: (remaining, survival[, rounds it is the mean of[, (observed, hits) per candidate]])
    per_request = per_request or []
    readout = Readout(rows, [p[1] for p in per_request], [p[0] for p in per_request],
                      request_rounds=[p[2] if len(p) > 2 else 10 ** 6 for p in per_request],
                      request_observed=[p[3][0] if len(p) > 3 else [0.0] * k for p in per_request],
                      request_hits=[p[3][1] if len(p) > 3 else [0.0] * k for p in per_request])
    policy.observe(readout, rounds, seconds, k if length is None else length)


def test_policy_picks_the_length_with_the_most_expected_tokens_per_second():
    flat = VerifyLengthPolicy([1.0] * 8, explore_rounds=0)
    assert flat.choose() == 7                                     # nothing known yet: the whole block
    observe(flat, [0.9 ** j for j in range(1, 8)], [0] * 7, [0] * 7)
    assert flat.choose() == 7                                     # rounds cost the same: verify everything
    steep = VerifyLengthPolicy([1.0 + n for n in range(8)], explore_rounds=0)   # a candidate costs a round more
    observe(steep, [0.5 ** j for j in range(1, 8)], [0] * 7, [0] * 7)
    assert steep.choose() == 0                                    # drafting does not pay: off
    knee = VerifyLengthPolicy([1.0, 1.0, 1.0, 1.0, 3.0, 3.0, 3.0, 3.0], explore_rounds=0)
    observe(knee, [0.95 ** j for j in range(1, 8)], [0] * 7, [0] * 7)
    assert knee.choose() == 3                                     # as far as the rounds stay cheap
    assert knee.expected_accepted()[3] == pytest.approx(0.95 + 0.95 ** 2 + 0.95 ** 3)


def test_a_static_batch_is_as_fast_as_its_slowest_request():
    """Two requests: drafting doubles one's rate and barely moves the other's. Per active request (vLLM's
    refilled batches) drafting pays; in a static batch, which ends with the slow request, it does not."""
    costs = [1.0, 1.3]
    fast, slow = [0.99], [0.05]
    rate = VerifyLengthPolicy(costs, explore_rounds=0)
    observe(rate, [0.52], [0], [0])
    assert rate.choose() == 1                          # per request: 1.52 tokens / 1.3 beats 1 / 1
    batch = VerifyLengthPolicy(costs, explore_rounds=0)
    observe(batch, [0.52], [0], [0], per_request=[(60, fast), (60, slow)])
    assert batch.choose() == 0                          # the slow one needs 60 / 1.05 rounds of 1.3: 74 > 60
    one = VerifyLengthPolicy(costs, explore_rounds=0)
    observe(one, [0.99], [0], [0], per_request=[(60, fast), (0, slow)])   # the slow one is done
    assert one.choose() == 1 and one.throughput() == pytest.approx([1.0, 1.99 / 1.3])
    early = VerifyLengthPolicy(costs, explore_rounds=0, prior_rounds=4)
    observe(early, [0.9], [0], [0], per_request=[(60, [0.9]), (60, slow, 1)])   # one round of it: mostly the batch's
    assert early.choose() == 1 and early._shrunk(slow, 1) == pytest.approx([0.8 * 0.9 + 0.2 * 0.05])
    seen = VerifyLengthPolicy(costs, explore_rounds=0, request_prior=8)   # predicted 0.99, one accepted 2 in 40
    observe(seen, [0.99], [0], [0], per_request=[(60, fast), (60, fast, 40, ([40.0], [2.0]))])
    assert seen.choose() == 0
    assert seen.expected_accepted(fast, ([40.0], [2.0])) == pytest.approx([0.0, (2 + 8 * 0.99) / 48])
    assert seen.expected_accepted(fast, ([2.0], [0.0])) == pytest.approx([0.0, 8 * 0.99 / 10])   # 2 rounds: prior


def test_hysteresis_keeps_the_current_length_within_five_percent():
    policy = VerifyLengthPolicy([1.0, 1.0, 1.04], explore_rounds=0)
    observe(policy, [1.0, 1.0], [0, 0], [0, 0])                  # L=1: 2 tokens/s, L=2: 3/1.04 = 2.88
    assert policy.choose() == 2
    policy.costs = [1.0, 1.0, 1.55]                               # L=2 now 1.94, L=1 2: better by 3% -> stays
    assert policy.choose() == 2
    policy.costs = [1.0, 1.0, 1.7]                                # 1.76: L=1 better by 13% -> switches
    assert policy.choose() == 1
    policy.costs = [1.0, 1.0, 1.45]                               # 2.07: L=2 better by 3.4% -> stays at 1
    assert policy.choose() == 1


def test_calibration_scales_the_predicted_survival_toward_the_realized():
    policy = VerifyLengthPolicy([1.0, 1.2, 1.4], calibration_min_observed=10)
    for _ in range(40):                                           # predicted 0.9 / 0.81, realized a third
        observe(policy, [0.9, 0.81], [3.0, 2.7], [10.0, 10.0], requests=10)
    assert policy.calibration == pytest.approx([1 / 3, 1 / 3], rel=0.02)
    assert policy.expected_accepted()[2] == pytest.approx((0.9 + 0.81) / 3, rel=0.02)
    worse = VerifyLengthPolicy([1.0, 1.2, 1.4], calibration_min_observed=10)
    for _ in range(40):                                           # realized 1/100 of predicted: clamped at 0.25
        observe(worse, [0.9, 0.81], [0.09, 0.081], [10.0, 10.0], requests=10)
    assert worse.calibration == pytest.approx([0.25, 0.25], rel=0.02)
    few = VerifyLengthPolicy([1.0, 1.2, 1.4], calibration_min_observed=10)
    observe(few, [0.9, 0.81], [0.0, 0.0], [4.0, 4.0])           # too few seen: not yet
    assert few.calibration == [1.0, 1.0]


def test_where_a_bin_of_predicted_survival_was_seen_enough_its_realized_survival_counts():
    """A signal that is not proportional to acceptance: requests predicted at 0.03 are accepted 60% of the time,
    confident ones as predicted. The global ratio would call the low ones hopeless; their bin does not."""
    policy = VerifyLengthPolicy([1.0, 1.2, 1.4], calibration_min_observed=8, bin_min_observed=8, explore_rounds=0)
    readout = Readout([[0.0] * 2 for _ in range(5)], [], [])
    observe(policy, [0.9, 0.8], [9.0, 8.0], [10.0, 10.0])
    readout.binned = [[[6.0] + [0.0] * 7, [0.0] * 8], [[10.0] + [0.0] * 7, [0.0] * 8]]   # position 1, bin <= 0.05
    policy.observe(readout, 1, 0.0, 2)
    assert policy.expected_accepted([0.03, 0.02])[1] == pytest.approx(0.6)           # realized, not 0.03 x 1
    assert policy.expected_accepted([0.03, 0.02])[2] == pytest.approx(0.6 + 0.02)    # bin unseen at 2: ratio
    assert policy.expected_accepted([0.9, 0.8])[1] == pytest.approx(0.9)


def test_the_whole_block_is_verified_until_the_signal_is_calibrated():
    """A signal that under-predicts (predicted 0.1, realized 0.8): drafting is not turned off before the
    realized acceptance corrects it; after that, the calibrated survival decides."""
    policy = VerifyLengthPolicy([1.0, 1.2, 1.4], calibration_min_observed=8, explore_rounds=100)
    observe(policy, [0.1, 0.01], [0, 0], [0, 0])
    assert policy.choose() == 2 and not any(policy.calibrated)         # uncalibrated: explore
    for _ in range(8):
        observe(policy, [0.1, 0.01], [0.8, 0.04], [1.0, 1.0])
    assert all(policy.calibrated) and policy.calibration == pytest.approx([4.0, 4.0])   # 8 / 1 clamped at 4
    assert policy.choose() == 1      # L=1: 1.4 / 1.2 beats off (1) and L=2 (1.44 / 1.4)
    uncalibrated = VerifyLengthPolicy([1.0, 1.5, 2.0], explore_rounds=5)
    observe(uncalibrated, [0.1, 0.01], [0, 0], [0, 0], rounds=5)
    assert uncalibrated.choose() == 0   # exploring ends after explore_rounds even if nothing was verified


def test_short_lengths_are_probed_with_the_whole_block_and_the_overhead_is_regressed():
    policy = VerifyLengthPolicy([1.0, 3.0, 5.0], probe_every=3, explore_rounds=0)
    observe(policy, [0.5, 0.25], [0, 0], [0, 0])
    assert [policy.choose() for _ in range(9)] == [0, 0, 0, 2, 0, 0, 0, 2, 0]   # the whole block once after 3 below
    reg = VerifyLengthPolicy([0.010, 0.012], overhead_min_samples=4)
    for tokens in (1, 2, 3, 4, 5, 6):   # a round took table + 0.002 + 0.001 x tokens
        reg.requests = tokens
        observe(reg, [0.0], [0.0], [0.0], requests=tokens, seconds=0.010 + 0.002 + 0.001 * tokens, length=0)
    assert reg.overhead == pytest.approx((0.002, 0.001), abs=1e-9)
    with pytest.raises(ValueError, match=r"^a cost table needs positive seconds for L = 0..K"):
        VerifyLengthPolicy([1.0])


def test_length_stats_count_what_was_predicted_verified_and_accepted():
    stats = LengthStats(3, 3, "cpu")
    survival = torch.tensor([[0.9, 0.5, 0.2], [0.8, 0.6, 0.4], [0.7, 0.7, 0.7]])
    kept = torch.tensor([3, 1, 3])          # row 1: a threshold keeps one candidate
    verified = torch.tensor([2, 1, 2])      # L = 2
    accepted = torch.tensor([1, 1, 2])
    active = torch.tensor([True, True, False])
    stats.accumulate(survival, kept, verified, accepted, active)
    stats.accumulate(survival / 2, kept, verified, accepted, torch.tensor([True, False, False]))
    readout = stats.read(torch.tensor([5, 0, 9]))
    rows = readout.rows
    assert rows[PREDICTED] == pytest.approx([0.9 + 0.8 + 0.45, 0.5 + 0.25, 0.2 + 0.1])
    assert rows[OBSERVED] == [3.0, 2.0, 0.0] and rows[HITS] == [3.0, 0.0, 0.0]
    assert rows[PREDICTED_OBSERVED] == pytest.approx([2.15, 0.75, 0.0]) and rows[REQUESTS] == [3.0] * 3
    assert stats.tensor.abs().sum() == 0    # read clears the batch's rows
    # per request: the mean over its drafted rounds, cut where a threshold stopped; None if it never drafted
    assert readout.request_survival[0] == pytest.approx([0.675, 0.375, 0.15])
    assert readout.request_survival[1] == pytest.approx([0.8, 0.0, 0.0]) and readout.request_survival[2] is None
    assert readout.remaining == [5, 0, 9]
    assert readout.request_observed == [[2, 2, 0], [1, 0, 0], [0, 0, 0]]
    assert readout.request_hits == [[2, 0, 0], [1, 0, 0], [0, 0, 0]]
    # verified candidates by bin of predicted survival (edges 0.05 0.1 0.2 0.35 0.5 0.7 0.85): hits, observed
    hits, observed = readout.binned
    assert observed[0] == [0, 0, 0, 0, 1, 0, 1, 1] and hits[0] == [0, 0, 0, 0, 1, 0, 1, 1]   # 0.45, 0.8, 0.9
    assert observed[1] == [0, 0, 0, 1, 1, 0, 0, 0] and hits[1] == [0] * 8                    # 0.25, 0.5
    assert observed[2] == [0] * 8


def test_cost_measurement_interleaves_lengths_and_restores_after_each_run():
    import time

    log, state, resets = [], {"x": 0}, []

    def round_at(length):
        def run():
            state["x"] += 1
            log.append(length)
            if length == 1:
                time.sleep(0.02)
        return run

    def reset():
        assert state["x"] == 1   # exactly one round ran since the last restore
        state["x"] = 0
        resets.append(log[-1])

    costs = measure_round_costs([round_at(0), round_at(1), round_at(2)], reset, lambda: None, reps=2)
    assert log == [0, 1, 2] * 3 == resets and len(costs) == 3 and costs[1] >= 0.02   # wall clock by default
    ticks = iter(range(100))
    costs = measure_round_costs([round_at(0), round_at(2)], reset, lambda: None, reps=3, clock=lambda: next(ticks))
    assert costs == [1, 1]   # the clock given: one tick per timed run


# -- dmtp.infer ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args,message", [
    (["verify_length=some", "methods=[ar]"], "verify_length must be full, auto or an integer >= 0"),
    (["verify_length=auto", "methods=[ar]"], "verify_length=auto needs a method with an acceptance signal"),
    # one length for every method: the method whose block it exceeds is named (issue 65: "the proposer" before)
    (["verify_length=5", "methods=[ar,mtp415]"], "verify_length=5 exceeds the 4 candidates mtp415 drafts per round "
                                                 "(one verify_length holds for every method run); use 0..4, full or "
                                                 "auto, or leave mtp415 out of methods"),
])
def test_infer_refuses_a_bad_verify_length_in_one_line(args, message, tmp_path, micro_target_dir, monkeypatch,
                                                       capsys):
    from cli_runner import infer_cli

    code, line, out = infer_cli([f"target.path={micro_target_dir}", "num_prompts=1", "eval.domains=[code]",
                                 "max_new_tokens=4", "eval.prompt_tokens=8", *args], tmp_path / "run", monkeypatch,
                                capsys)
    assert code == 2 and line.startswith("dmtp.infer: error: " + message), (line, out)


def test_a_fixed_length_longer_than_a_methods_block_is_refused_before_anything_decodes(micro_target, micro_mtp,
                                                                                     monkeypatch):
    """AR (nothing to verify) decodes first and keeps its block of 0; MTP415's 4 candidates cannot verify 5:
    refused before AR's first round. A length that fits both decodes (AR at its own block)."""
    from dmtp.inference.workloads import decode_workloads

    decoders = {"ar": spec_decoder(micro_target, build_proposer("ar", micro_target)),
                "mtp415": spec_decoder(micro_target, build_proposer("mtp415", micro_target, mtp=micro_mtp))}
    calls = []
    generate = SpecDecoder.generate
    monkeypatch.setattr(SpecDecoder, "generate", lambda self, *a, **k: calls.append(self) or generate(self, *a, **k))
    with pytest.raises(ValueError, match=r"^verify_length=5 exceeds the 4 candidates"):
        decode_workloads(decoders, {"p": PROMPTS}, max_new_tokens=6, sampling=SamplingConfig(verify_length=5),
                         batch_size=2, warmup=False)
    assert calls == []
    out = decode_workloads(decoders, {"p": PROMPTS}, max_new_tokens=6, sampling=SamplingConfig(verify_length=3),
                           batch_size=2, warmup=False)
    assert out["overall"]["mtp415"]["verified_per_round"] == 3 and out["overall"]["ar"]["verified_per_round"] == 0


def test_infer_decodes_with_a_chosen_length_beside_full_length_baselines(tmp_path, micro_target_dir, monkeypatch,
                                                                         capsys):
    """MTP415 has a signal (auto), AR none (its whole block, K = 0): both decode, the table says so."""
    from cli_runner import infer_cli

    code, line, out = infer_cli([f"target.path={micro_target_dir}", "num_prompts=2", "eval.domains=[code]",
                                 "max_new_tokens=12", "eval.prompt_tokens=8", "methods=[ar,mtp415]",
                                 "verify_length=auto"], tmp_path / "run", monkeypatch, capsys)
    assert code == 0, (line, out)
    overall = json.loads(next((tmp_path / "run").glob("**/metrics.json")).read_text())["overall"]
    assert "verify_length_share" not in overall["ar"]
    share = overall["mtp415"]["verify_length_share"]
    assert abs(sum(share.values()) - 1) < 1e-9 and overall["mtp415"]["cost_table_s"] > 0


def test_the_realized_counts_are_the_accepted_lengths(micro_target, micro_mtp, cycling):
    """What calibration reads back equals what the decode returned: per candidate j, the rounds that verified
    it and the rounds that accepted it (raw acceptance, before the EOS / budget cut)."""
    prop = proposer(micro_target, micro_mtp, "mtp415")
    dec = spec_decoder(micro_target, prop, eos_token_id=[])
    res = dec.generate(PROMPTS, max_new_tokens=24, batch_size=3, sampling=AUTO)
    (policy,) = dec._length_policies.values()
    k = prop.num_candidates
    observed, hits = [0.0] * k, [0.0] * k
    for lengths, accepted in zip(res.verify_lengths, res.accepted_raw):
        for length, a in zip(lengths, accepted):
            for j in range(length):
                observed[j] += 1
                hits[j] += a >= j + 1
    assert policy._seen[1] == observed and policy._seen[0] == hits and sum(hits) > 0
