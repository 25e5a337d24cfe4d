"""Captured rounds attend a span bucket of the caches (`spec_decoder(graph_span_step=...)`), chosen on the
host from a bound on the longest length (its value at the last poll + the block width per round since).
On CPU the capture protocol runs with eager stand-ins (tests/test_decode_graphs.py): every row a round
touches lies below its bucket's span, several buckets are captured as requests grow, and decoding is
exactly the target's own greedy output with the same accepted lengths as over the whole caches."""
import pytest

from dmtp.decode import build_proposer
from dmtp.families.decoding import spec_decoder
import dmtp.decode.execution.graphs as graphs
from test_decode_graphs import _EagerGraphs
from test_decode_loop import (MAX_NEW, _check_positions_below_span, continuations, eos_and_refs,  # noqa: F401
                              greedy_reference, make_drafter, prompts, tokenizer)


class _SpanEagerGraphs(_EagerGraphs):
    """The stand-in, its warm-up passes over the whole caches: they advance the lengths past the bucket
    (real graphs' warm-ups do too: writes stay inside the caches, reads are sliced to the span, and the
    state is restored before the capture), which the row check below must not count."""

    def __init__(self, stages, runner):
        super().__init__(stages)
        self.runner = runner

    def capture(self, reset):
        span, self.runner.span = self.runner.span, None
        try:
            return super().capture(reset)
        finally:
            self.runner.span = span


def _decoder(target, mtp, method, eos, step):
    if method in ("ar", "mtp415"):
        proposer = build_proposer(method, target, mtp=mtp)
    else:
        proposer = build_proposer("drafter", target, mtp=mtp, drafter=make_drafter(target, method), name=method)
    dec = spec_decoder(target, proposer, eos_token_id=eos, time_stages=False, graph_span_step=step, poll_every=3)
    dec.use_graphs = True   # the graph protocol with eager stand-ins (monkeypatched RoundGraphs)
    return dec


@pytest.mark.parametrize("method", ["ar", "mtp415", "dual_anchor_zero_init", "context_fusion"])
def test_span_buckets_cover_every_row_and_decode_losslessly(micro_target, micro_mtp, prompts, eos_and_refs, method,
                                                            monkeypatch):
    eos, refs = eos_and_refs
    runs, spans = {}, {}
    for step in (8, None):   # tight buckets; the whole caches
        dec = _decoder(micro_target, micro_mtp, method, eos, step)
        monkeypatch.setattr(graphs, "RoundGraphs", lambda stages, granularity="stage", d=dec: _SpanEagerGraphs(
            stages, d.runner))
        seen = []
        _check_positions_below_span(dec, seen, monkeypatch)
        runs[step] = dec.generate(prompts, max_new_tokens=MAX_NEW, batch_size=4)
        assert runs[step].tokens == refs
        spans[step] = sorted({key[3] for key in dec._graphs})   # (batch, max_len, sampling, span, verify length)
        if step:
            assert seen and all(pos < span <= dec.st.max_len for _, pos, span in seen)
    assert spans[None] == [None]
    assert len(spans[8]) > 2 and all(s % 8 == 0 or s == 256 for s in spans[8])   # captured as requests grew
    assert runs[8].accepted == runs[None].accepted


def test_span_step_is_checked(micro_target, micro_mtp):
    with pytest.raises(ValueError, match="graph_span_step must be a positive"):
        spec_decoder(micro_target, build_proposer("ar", micro_target, mtp=micro_mtp), graph_span_step=0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("method", ["mtp415", "dual_anchor_zero_init@16"])
def test_cuda_span_buckets_equal_eager(micro_target_dir, method, dtype):
    """Real CUDA graphs over tight span buckets (16 slots: several captures while requests grow) decode the
    same tokens and accepted lengths as eager decoding at the same shapes, in fp32 and in bf16."""
    import torch

    from dmtp.families.mtp_loading import load_native_mtp
    from dmtp.models.target import TargetModel
    from test_decode_graphs import PROMPTS, _proposer

    dt = getattr(torch, dtype)
    target = TargetModel.from_pretrained(micro_target_dir, dtype=dt, device="cuda")
    mtp = load_native_mtp(micro_target_dir, target.embed_tokens, target.lm_head)
    res = {}
    for graphs in (False, True):
        dec = spec_decoder(target, _proposer(target, mtp, method, "cuda", dt), eos_token_id=[], cuda_graphs=graphs,
                          graph_span_step=16)
        res[graphs] = dec.generate(PROMPTS, max_new_tokens=40, batch_size=3)
        if graphs:
            assert len({key[-1] for key in dec._graphs}) > 2
    assert res[True].tokens == res[False].tokens
    assert res[True].accepted == res[False].accepted
