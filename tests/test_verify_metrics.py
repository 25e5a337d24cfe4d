"""Tests for dmtp.decode.verify (device-side acceptance/sampling) and dmtp.decode.metrics."""

from __future__ import annotations

import inspect
import io
import math
import time
import tokenize

import pytest
import torch

from dmtp.reports import tables as M
from dmtp.decode import verify as V
from dmtp.decode.metrics import AcceptanceRecorder, throughput
from dmtp.decode.execution.stage_timer import StageTimer
from dmtp.reports.tables import format_table
from dmtp.decode.verify import (
    accept_rejection_sampling,
    accept_target_only,
    probs_from_logits,
    sample_tokens,
)


def _gen(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def _onehot_logits(tokens: torch.Tensor, vocab: int, noise_seed: int = 0) -> torch.Tensor:
    """Logits [B,T,V] whose argmax is ``tokens`` (with small random noise elsewhere)."""
    g = _gen(noise_seed)
    logits = torch.randn(*tokens.shape, vocab, generator=g)
    return logits.scatter(-1, tokens.unsqueeze(-1), 10.0)


def _tv(counts: torch.Tensor, probs: torch.Tensor) -> float:
    emp = counts.double() / counts.sum()
    return 0.5 * (emp - probs.double()).abs().sum().item()


# --------------------------------------------------------------------------------------------
# acceptance with constructed logits
# --------------------------------------------------------------------------------------------

VOCAB = 11
K = 7


def _block(bsz: int, k: int, seed: int = 0):
    g = _gen(seed)
    target = torch.randint(0, VOCAB, (bsz, k + 1), generator=g)
    return target


def _candidates_accepting(target: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """Candidates that agree with ``target`` exactly on the first counts[b] positions."""
    k = target.shape[1] - 1
    cand = target[:, :k].clone()
    for b, c in enumerate(counts):
        if c < k:
            cand[b, c] = (target[b, c] + 1) % VOCAB  # first mismatch
            # later positions keep matching: nothing after the first miss may be counted
            cand[b, c + 1 :] = target[b, c + 1 : k]
    return cand


@pytest.mark.parametrize("counts", [[0, 0], [K, K], *[[k] for k in range(K + 1)], [0, 3, K, 5, 1]])
def test_accept_target_only_greedy(counts):
    target = _block(len(counts), K, seed=len(counts))
    cand = _candidates_accepting(target, counts)
    logits = _onehot_logits(target, VOCAB)
    y = sample_tokens(logits, temperature=0.0)
    assert torch.equal(y, target)
    acc = accept_target_only(cand, y)
    assert acc.dtype == torch.long
    assert acc.tolist() == counts
    # emitted tokens = y[:, :a+1]; accepted drafts equal the candidates
    for b, a in enumerate(counts):
        emitted = y[b, : a + 1]
        assert emitted.numel() == a + 1
        assert torch.equal(emitted[:a], cand[b, :a])


def test_accept_target_only_k0():
    y = torch.tensor([[3], [5]])
    cand = torch.empty(2, 0, dtype=torch.long)
    acc = accept_target_only(cand, y)
    assert acc.tolist() == [0, 0]
    with pytest.raises(ValueError):
        accept_target_only(torch.zeros(2, 3, dtype=torch.long), y)


@pytest.mark.parametrize("counts", [[0, 0, 0], [K, K], *[[k] for k in range(K + 1)], [0, 3, K, 5, 1]])
def test_rejection_sampling_constructed(counts):
    """Deterministic accept/reject: p(c)=0 at the first miss (never accept), p(c) >= q(c)
    elsewhere (always accept)."""
    bsz = len(counts)
    g = _gen(1)
    cand = torch.randint(0, VOCAB, (bsz, K), generator=g)
    q = torch.full((bsz, K, VOCAB), 0.0).scatter(-1, cand.unsqueeze(-1), 1.0)  # greedy draft
    p = torch.softmax(torch.randn(bsz, K + 1, VOCAB, generator=g), -1)
    # make p put >= q mass on accepted candidates (one-hot there) and 0 at the first miss
    for b, c in enumerate(counts):
        for i in range(K):
            if i < c:
                p[b, i] = 0.0
                p[b, i, cand[b, i]] = 1.0
            elif i == c:
                p[b, i, cand[b, i]] = 0.0
                p[b, i] /= p[b, i].sum()
    emitted, acc = accept_rejection_sampling(cand, q, p, generator=_gen(2))
    assert acc.tolist() == counts
    assert emitted.shape == (bsz, K + 1)
    for b, c in enumerate(counts):
        assert torch.equal(emitted[b, :c], cand[b, :c])
        corr = emitted[b, c].item()
        assert p[b, c, corr] > 0  # correction (from residual) or bonus (from p_K)
        if c < K:
            assert corr != cand[b, c].item()


def test_rejection_sampling_greedy_equals_target_only():
    """At temperature 0 (one-hot p and q) rejection sampling = target-only greedy."""
    bsz = 64
    g = _gen(3)
    target = torch.randint(0, 4, (bsz, K + 1), generator=g)
    draft = torch.where(torch.rand(bsz, K, generator=g) < 0.8, target[:, :K], torch.randint(0, 4, (bsz, K), generator=g))
    t_logits = _onehot_logits(target, 4, 1)
    d_logits = _onehot_logits(draft, 4, 2)
    p = probs_from_logits(t_logits, 0.0)
    q = probs_from_logits(d_logits, 0.0)
    emitted, acc = accept_rejection_sampling(draft, q, p, generator=_gen(4))
    acc_ref = accept_target_only(draft, sample_tokens(t_logits, 0.0))
    assert torch.equal(acc, acc_ref)
    pos = torch.arange(K + 1)[None]
    keep = pos <= acc[:, None]
    assert torch.equal(emitted[keep], target[keep])


def test_rejection_sampling_k0():
    g = _gen(5)
    p = torch.softmax(torch.randn(20000, 1, 4, generator=g), -1)[:1].expand(20000, 1, 4).contiguous()
    emitted, acc = accept_rejection_sampling(
        torch.empty(20000, 0, dtype=torch.long), torch.empty(20000, 0, 4), p, generator=_gen(6)
    )
    assert emitted.shape == (20000, 1)
    assert acc.eq(0).all()
    assert _tv(torch.bincount(emitted[:, 0], minlength=4), p[0, 0]) < 0.02


# --------------------------------------------------------------------------------------------
# sampling
# --------------------------------------------------------------------------------------------


def test_probs_from_logits_basic():
    g = _gen(7)
    logits = torch.randn(3, 4, 9, generator=g)
    pr = probs_from_logits(logits, 0.7)
    assert torch.allclose(pr, torch.softmax(logits / 0.7, -1), atol=1e-6)
    pr_k = probs_from_logits(logits, 1.0, top_k=3)
    assert torch.allclose(pr_k.sum(-1), torch.ones(3, 4))
    assert (pr_k > 0).sum(-1).eq(3).all()
    greedy = probs_from_logits(logits, 0.0)
    assert torch.equal(greedy.argmax(-1), logits.argmax(-1))
    assert greedy.sum(-1).eq(1).all() and greedy.max(-1).values.eq(1).all()


def test_sample_top_k1_is_argmax():
    g = _gen(8)
    logits = torch.randn(16, 8, 50, generator=g)
    for t in (0.5, 1.0, 2.0):
        s = sample_tokens(logits, temperature=t, top_k=1, generator=_gen(9))
        assert torch.equal(s, logits.argmax(-1))
    assert torch.equal(sample_tokens(logits, 0.0), logits.argmax(-1))
    assert sample_tokens(logits, 1.0, generator=_gen(9)).dtype == torch.long


def test_sample_seeded_reproducible():
    logits = torch.randn(4, 8, 30, generator=_gen(10))
    a = sample_tokens(logits, 1.0, generator=_gen(11))
    b = sample_tokens(logits, 1.0, generator=_gen(11))
    assert torch.equal(a, b)


def test_top_p_stays_in_nucleus():
    probs = torch.tensor([0.04, 0.5, 0.06, 0.3, 0.1])
    logits = probs.log().expand(20000, 1, 5).contiguous()
    # sorted: 0.5, 0.3 | 0.1, 0.06, 0.04 -> mass before 0.1 is 0.8 >= 0.7 -> nucleus {1, 3}
    s = sample_tokens(logits, 1.0, top_p=0.7, generator=_gen(12))
    counts = torch.bincount(s.flatten(), minlength=5)
    assert counts[[0, 2, 4]].sum() == 0
    frac = counts[1].item() / counts.sum().item()
    assert abs(frac - 0.5 / 0.8) < 0.02
    # top_p below the largest prob keeps only the argmax
    s2 = sample_tokens(logits, 1.0, top_p=0.3, generator=_gen(13))
    assert s2.eq(1).all()
    # top-k then top-p
    s3 = sample_tokens(logits, 1.0, top_k=3, top_p=0.95, generator=_gen(14))
    assert set(s3.unique().tolist()) <= {1, 3, 4}


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_sampling_matches_softmax(temperature):
    n, vocab = 20000, 5
    logits0 = torch.tensor([1.0, -0.5, 0.3, 2.0, 0.0])
    logits = logits0.expand(n, 1, vocab).contiguous()
    s = sample_tokens(logits, temperature, generator=_gen(15))
    counts = torch.bincount(s.flatten(), minlength=vocab).double()
    expected = torch.softmax(logits0 / temperature, -1).double() * n
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 18.47  # chi-square, 4 dof, p = 0.001
    assert _tv(counts, expected / n) < 0.015


# --------------------------------------------------------------------------------------------
# losslessness (statistical)
# --------------------------------------------------------------------------------------------

N_ROWS = 50000


def _sample_rows(dist: torch.Tensor, n: int, g: torch.Generator) -> torch.Tensor:
    """n samples from each of dist [T, V] -> [n, T]."""
    return V.sample_from_probs(dist.expand(n, *dist.shape), generator=g)


def test_rejection_sampling_lossless_k1():
    g = _gen(20)
    vocab = 4
    p = torch.softmax(torch.randn(2, vocab, generator=g) * 1.5, -1)  # target [K+1, V]
    q = torch.softmax(torch.randn(1, vocab, generator=g) * 1.5, -1)  # draft  [K, V]
    cand = _sample_rows(q, N_ROWS, g)  # [N, 1]
    emitted, acc = accept_rejection_sampling(
        cand, q.expand(N_ROWS, 1, vocab), p.expand(N_ROWS, 2, vocab), generator=g
    )
    first = torch.bincount(emitted[:, 0], minlength=vocab)
    assert _tv(first, p[0]) < 0.02
    rate = acc.float().mean().item()
    expected_rate = torch.minimum(p[0], q[0]).sum().item()
    assert abs(rate - expected_rate) < 0.01
    # second token (bonus, only when accepted) ~ p[1]
    second = torch.bincount(emitted[acc == 1, 1], minlength=vocab)
    assert _tv(second, p[1]) < 0.03


def test_rejection_sampling_lossless_k3_every_position():
    """Context-independent target: token j of the emitted sequence ~ p_j at every j."""
    g = _gen(21)
    vocab, k = 4, 3
    p = torch.softmax(torch.randn(k + 1, vocab, generator=g) * 1.5, -1)
    # draft half-way to the target so that every position is reached often enough
    q = 0.5 * p[:k] + 0.5 * torch.softmax(torch.randn(k, vocab, generator=g) * 1.5, -1)
    cand = _sample_rows(q, N_ROWS, g)
    emitted, acc = accept_rejection_sampling(
        cand, q.expand(N_ROWS, k, vocab), p.expand(N_ROWS, k + 1, vocab), generator=g
    )
    for j in range(k + 1):
        rows = acc >= j  # rows whose round emitted a token at position j
        counts = torch.bincount(emitted[rows, j], minlength=vocab)
        assert counts.sum() > 4000
        assert _tv(counts, p[j]) < 0.03, j
    # P(accept first) = sum min(p0, q0)
    assert abs((acc >= 1).float().mean().item() - torch.minimum(p[0], q[0]).sum().item()) < 0.01


def test_target_only_lossless_k1():
    g = _gen(22)
    vocab = 4
    p = torch.softmax(torch.randn(2, vocab, generator=g) * 1.5, -1)
    q = torch.softmax(torch.randn(1, vocab, generator=g) * 1.5, -1)
    cand = _sample_rows(q, N_ROWS, g)
    logits = p.log().expand(N_ROWS, 2, vocab).contiguous()
    y = sample_tokens(logits, 1.0, generator=g)
    acc = accept_target_only(cand, y)
    first = torch.bincount(y[:, 0], minlength=vocab)  # emitted[0] = y[0] always
    assert _tv(first, p[0]) < 0.02
    # target-only acceptance rate = sum_v p(v) q(v)
    assert abs(acc.float().mean().item() - (p[0] * q[0]).sum().item()) < 0.01


def test_verify_module_is_host_sync_free():
    src = inspect.getsource(V)
    toks = tokenize.generate_tokens(io.StringIO(src).readline)
    code = " ".join(t.string for t in toks if t.type not in (tokenize.STRING, tokenize.COMMENT))
    code = code.replace(" ", "")
    for bad in (".item(", ".cpu(", "nonzero", "multinomial(", ".tolist(", ".numpy("):
        assert bad not in code, bad


# --------------------------------------------------------------------------------------------
# metrics
# --------------------------------------------------------------------------------------------


def test_acceptance_recorder_hand_computed():
    rec = AcceptanceRecorder(num_candidates=7)
    r1 = [0, 7, 3, 3, 1]
    r2 = [2, 0]
    # round-by-round with an active mask: request 2 finishes after round 2
    for i in range(5):
        acc = torch.tensor([r1[i], r2[i] if i < 2 else 5])
        active = torch.tensor([True, i < 2])
        rec.record(acc, active)
    s = rec.summary()
    # request 1: (1+8+4+4+2)/5 = 19/5 = 3.8 ; request 2: (3+1)/2 = 2.0 -> mean 2.9
    assert s["tau_per_request"] == pytest.approx(2.9)
    # hist over 7 rounds: k=0:2, 1:1, 2:1, 3:2, 7:1
    assert s["accept_hist"] == [2, 1, 1, 2, 0, 0, 0, 1]
    assert s["rounds"] == 7
    # sum k*hist = 0 + 1 + 2 + 6 + 7 = 16 -> 1 + 16/7
    assert s["tau_per_verify"] == pytest.approx(1 + 16 / 7)
    assert s["t1_accept"] == pytest.approx(5 / 7)
    # counts with L>=k: k=1:5, 2:4, 3:3, 4..7:1
    assert s["p_len_ge"] == pytest.approx([5 / 7, 4 / 7, 3 / 7, 1 / 7, 1 / 7, 1 / 7, 1 / 7])
    assert s["p_cond"] == pytest.approx([5 / 7, 4 / 5, 3 / 4, 1 / 3, 1.0, 1.0, 1.0])
    assert s["num_requests"] == 2
    assert (s["num_candidates"], s["block_size"]) == (7, 8)   # K candidates, a verified block of K + 1


def test_acceptance_recorder_none_and_merge():
    rec = AcceptanceRecorder(num_candidates=3)
    empty = rec.summary()
    assert empty["rounds"] == 0 and empty["tau_per_verify"] is None
    assert empty["tau_per_request"] is None and empty["p_cond"] == [None, None, None]
    rec.record([0, 0])
    s = rec.summary()
    assert s["p_len_ge"] == [0.0, 0.0, 0.0]
    assert s["p_cond"] == [0.0, None, None]
    assert s["tau_per_verify"] == 1.0 and s["t1_accept"] == 0.0
    other = AcceptanceRecorder(num_candidates=3)
    other.record(torch.tensor([3]))
    rec.merge(other)
    s = rec.summary()
    assert s["accept_hist"] == [2, 0, 0, 1]
    assert s["tau_per_request"] == pytest.approx((1 + 1 + 4) / 3)
    with pytest.raises(ValueError):
        rec.merge(AcceptanceRecorder(num_candidates=7))
    with pytest.raises(ValueError):
        rec.record([4])
    # K = 0 (autoregressive): tau is exactly 1
    ar = AcceptanceRecorder(num_candidates=0)
    ar.record(torch.zeros(3, dtype=torch.long))
    s = ar.summary()
    assert s["tau_per_verify"] == 1.0 and s["p_len_ge"] == [] and s["accept_hist"] == [3]


def test_stage_timer_skips_warmup():
    calls = []
    timer = StageTimer(skip_rounds=2, sync=lambda: calls.append(1))
    for r in range(5):
        with timer.round():
            with timer.stage("verify"):
                time.sleep(0.05 if r < 2 else 0.005)
            if r % 2 == 0:
                with timer.stage("drafter"):
                    time.sleep(0.004)
    ms = timer.ms_per_round()
    assert timer.counted_rounds == 3
    assert list(ms) == ["verify", "drafter", "round"]
    assert 4.0 <= ms["verify"] < 30.0  # warm-up (50 ms) rounds excluded
    # drafter runs in counted rounds 2 and 4 only -> averaged over 3 rounds
    assert 2.0 <= ms["drafter"] < 20.0
    assert ms["round"] >= ms["verify"] + ms["drafter"] - 0.5
    assert len(calls) > 0  # sync hook called around clock reads


def test_stage_timer_no_rounds_is_nan():
    timer = StageTimer()
    with timer.stage("x"):
        pass
    assert math.isnan(timer.ms_per_round()["x"])
    timer.end_round()
    assert timer.ms_per_round()["x"] >= 0.0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_stage_timer_cuda_events():
    timer = StageTimer(skip_rounds=1, device="cuda", use_cuda_events=True)
    x = torch.randn(1024, 1024, device="cuda")
    for _ in range(3):
        with timer.round():
            with timer.stage("mm"):
                x = x @ x
                x = x / x.norm()
    ms = timer.ms_per_round()
    assert ms["mm"] > 0 and ms["round"] >= ms["mm"] * 0.9


def test_throughput_and_table():
    assert throughput(1000, 2.0) == 500.0
    assert math.isnan(throughput(10, 0.0))
    rows = [
        {"method": "ar", "tau": 1.0, "tok_s": 123.456, "hist": [1, 2]},
        {"method": "dmtp_long_name", "tau": 3.14159, "tok_s": 1234.5, "extra": 1},
        {"method": "mtp415", "tau": None},
    ]
    table = format_table(rows, ["method", "tau", "tok_s", "hist"])
    lines = table.splitlines()
    assert len(lines) == 5
    assert lines[0].split() == ["method", "tau", "tok_s", "hist"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    assert "3.142" in table and "1234.500" in table and "[1, 2]" in table
    # numeric columns right-aligned: the tau values end at the same column
    tau_end = lines[0].index("tau") + len("tau")
    assert lines[2][:tau_end].endswith("1.000") and lines[3][:tau_end].endswith("3.142")
    assert lines[4].split()[1:] == ["-", "-", "-"]
    assert format_table(rows, ["method"], title="T").splitlines()[0] == "T"
    assert M.format_table([], ["a"]).splitlines()[0] == "a"
