"""Every stage of every method declares the tensors it changes: run each stage of a few rounds on a
live state and compare everything reachable from the state, the runner and the proposer (the capture
snapshot copies what the stages declare, so an undeclared write would survive a graph / compile warm-up)."""
import pytest
import torch

from dmtp.decode import SamplingConfig, SpecDecoder, build_proposer
from dmtp.families.decoding import spec_decoder
from dmtp.drafters.block_drafter import fresh_drafter_for
from scripted_proposer import ScriptedProposer
from dmtp.decode.stage import Stage, snapshot
from stage_check import undeclared_writes
from dmtp.injection import VARIANTS

PROMPTS = [[17, 45, 300, 12, 9, 81, 77, 5, 40], [210, 11, 61, 400, 8]]
MAX_NEW = 16
GREEDY = SamplingConfig()
REJECTION = SamplingConfig(temperature=1.0, verification="rejection")   # the proposers' q buffers too


def _proposer(target, mtp, method, **options):
    if method in VARIANTS:
        drafter = fresh_drafter_for(target, method, 3, perturb=0.05, **options)
        return build_proposer("drafter", target, mtp=mtp, drafter=drafter, name=method)
    if method == "scripted":
        return ScriptedProposer([[5] * (MAX_NEW + 8)] * len(PROMPTS), 7, vocab_size=target.config.vocab_size)
    return build_proposer(method, target, mtp=mtp)


def check_rounds(dec: SpecDecoder, sampling: SamplingConfig, rounds: int = 3) -> int:
    """Prefill, then run `rounds` rounds stage by stage, checking each stage's writes; -> stages checked."""
    st = dec._ensure_state(len(PROMPTS), 64, MAX_NEW, sampling)
    st.generator = torch.Generator().manual_seed(0)
    st.request_ids = list(range(len(PROMPTS)))
    dec._prefill(st, PROMPTS, MAX_NEW)
    checked = 0
    for _ in range(rounds):
        dec._set_span(st, int(dec.runner.lengths.max()))
        for stage in dec.stages(st):
            undeclared = undeclared_writes(stage, state=st, runner=dec.runner, proposer=dec.proposer)
            assert not undeclared, f"stage {stage.name!r} changes undeclared tensors: {undeclared}"
            checked += 1
    return checked


@pytest.mark.parametrize("sampling", [GREEDY, REJECTION], ids=["greedy", "rejection"])
@pytest.mark.parametrize("method", ["ar", "mtp415", "scripted", *VARIANTS])
def test_stages_change_only_what_they_declare(micro_target, micro_mtp, method, sampling):
    dec = spec_decoder(micro_target, _proposer(micro_target, micro_mtp, method), eos_token_id=[], time_stages=False)
    assert check_rounds(dec, sampling) >= 3


def test_adaptive_multi_step_and_recompute_runner_declare_their_writes(micro_target, micro_mtp):
    proposer = _proposer(micro_target, micro_mtp, "multi_mtp_zero_init", mtp_threshold=0.3)
    assert check_rounds(spec_decoder(micro_target, proposer, eos_token_id=[], time_stages=False), GREEDY) == 18   # 6 stages a round
    proposer = _proposer(micro_target, micro_mtp, "context_fusion")
    dec = spec_decoder(micro_target, proposer, eos_token_id=[], runner="recompute", time_stages=False)
    assert check_rounds(dec, GREEDY) == 15


def test_an_undeclared_write_is_caught_and_the_snapshot_is_what_stages_declare(micro_target, micro_mtp):
    dec = spec_decoder(micro_target, _proposer(micro_target, micro_mtp, "mtp415"), eos_token_id=[])
    st = dec._ensure_state(len(PROMPTS), 64, MAX_NEW, GREEDY)
    sneaky = Stage("sneaky", lambda: dec.proposer.mtp_state.h.add_(1.0), writes=(st.kept,))
    assert undeclared_writes(sneaky, state=st, runner=dec.runner, proposer=dec.proposer) == ["proposer.mtp_state.h"]
    stages = dec.stages(st)
    saved = {id(t) for t, _ in snapshot(stages)}
    assert saved == {id(t) for s in stages for t in s.writes}
    assert id(dec.proposer.mtp_state.h) in saved and id(dec.runner.lengths) in saved
    assert not saved & {id(t) for s in stages for t in s.scratch_tensors()}   # caches are not copied
