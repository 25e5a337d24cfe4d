"""Block verification (`verification=block`, Sun et al., ICLR 2025, arXiv 2403.10444).

* exact: on small context-dependent target/draft trees, enumerating every draft block gives the
  procedure's exact output law, which must complete to the target's joint distribution;
* Monte Carlo: the sampling half (tau = last eta_i < h_i, the final token) follows that law;
* acceptance: never below token-wise rejection sampling on the same drafts (exact expectation and
  a paired statistical test), including the paper's worked example (11/9 vs 10/9);
* temperature 0: one-hot p and q give the greedy prefix; the loop gives AR's tokens for every method;
* end to end: the first three output tokens follow the target's own sampling distribution for
  mtp415, raw DFlash, DMTP and a DFlash2 drafter at T = 0.6 and 1.0.
"""
from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

from dmtp.decode import SamplingConfig, build_proposer
from dmtp.families.decoding import spec_decoder
from dmtp.decode.verify import (accept_block_verification, accept_rejection_sampling, accept_target_only,
                                block_verification_plan, probs_from_logits, sample_from_probs, sample_tokens)
from test_decode_sampling import N_SAMPLES, STEPS, _chi2_pvalue, _drafter, _exact_probs, prompt  # noqa: F401


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------------------------
# small trees: a target and a draft distribution for every prefix
# ------------------------------------------------------------------------------------------------

class Tree:
    """Context-dependent target `p[prefix]` (prefixes of length 0..K) and draft `q[prefix]` (0..K-1)
    over a vocabulary of `v` tokens, with every possible draft block enumerated as one batch."""

    def __init__(self, p: dict, q: dict, v: int, k: int):
        self.p, self.q, self.v, self.k = p, q, v, k
        self.drafts = list(itertools.product(range(v), repeat=k))
        self.candidates = torch.tensor(self.drafts, dtype=torch.long).view(len(self.drafts), k)
        self.draft_probs = torch.stack([self._rows(q, d, k) for d in self.drafts]).float()
        self.target_probs = torch.stack([self._rows(p, d, k + 1) for d in self.drafts]).float()
        self.draft_mass = torch.tensor([self.prob(q, d) for d in self.drafts], dtype=torch.float64)

    @staticmethod
    def _rows(table: dict, draft: tuple, n: int) -> torch.Tensor:
        return torch.stack([table[draft[:i]] for i in range(n)])

    @staticmethod
    def prob(table: dict, seq: tuple, start: int = 0) -> float:
        """prod_{i >= start} table[seq[:i]][seq[i]]: the probability of seq[start:] given seq[:start]."""
        out = 1.0
        for i in range(start, len(seq)):
            out *= float(table[seq[:i]][seq[i]])
        return out


def _dist(g: torch.Generator, v: int, zeros: int = 0) -> torch.Tensor:
    logits = torch.randn(v, generator=g, dtype=torch.float64) * 1.5
    if zeros:
        logits[torch.randperm(v, generator=g)[:zeros]] = float("-inf")
    return torch.softmax(logits, -1)


def random_tree(v: int, k: int, seed: int, degenerate: bool = False) -> Tree:
    """Random trees; `degenerate` adds zero target and draft probabilities, drafts equal to the target
    at some prefixes (zero residual mass) and one-hot drafts."""
    g = _gen(seed)
    prefixes = [pre for n in range(k + 1) for pre in itertools.product(range(v), repeat=n)]
    p = {pre: _dist(g, v, zeros=2 if degenerate else 0) for pre in prefixes}
    q = {}
    for j, pre in enumerate(pre for pre in prefixes if len(pre) < k):
        kind = (j + seed) % 4 if degenerate else 0
        if kind == 1:
            q[pre] = p[pre].clone()                      # zero residual mass where w = 1
        elif kind == 2:
            q[pre] = torch.zeros(v, dtype=torch.float64)
            q[pre][int(torch.randint(v, (1,), generator=g))] = 1.0   # a one-hot (greedy-like) draft
        else:
            q[pre] = _dist(g, v, zeros=2 if degenerate else 0)
    return Tree(p, q, v, k)


def context_free_tree(p_token, q_token, k: int) -> Tree:
    """The same target and draft distributions at every position (the paper's worked example)."""
    v = len(p_token)
    p_row, q_row = torch.tensor(p_token, dtype=torch.float64), torch.tensor(q_token, dtype=torch.float64)
    prefixes = [pre for n in range(k + 1) for pre in itertools.product(range(v), repeat=n)]
    return Tree({pre: p_row for pre in prefixes}, {pre: q_row for pre in prefixes if len(pre) < k}, v, k)


def tau_law(stop_probs: torch.Tensor) -> torch.Tensor:
    """P(tau = i | drafts) = h_i * prod_{j > i} (1 - h_j): [B, K+1] -> [B, K+1] (float64)."""
    h = stop_probs.double()
    later_miss = torch.flip(torch.cumprod(torch.flip(1.0 - h, [1]), 1), [1])   # prod_{j >= i} (1 - h_j)
    beyond = torch.cat([later_miss[:, 1:], torch.ones_like(h[:, :1])], dim=1)   # prod_{j > i}
    return h * beyond


def plan_of(tree: Tree) -> tuple[torch.Tensor, torch.Tensor]:
    return block_verification_plan(tree.candidates, tree.draft_probs, tree.target_probs)


def exact_output_law(tree: Tree, stop_probs: torch.Tensor, next_dists: torch.Tensor) -> dict[tuple, float]:
    """P(the round emits exactly x^i + (y,)), over all draft blocks, for a plan (h, next-token laws)."""
    assert torch.isfinite(stop_probs).all() and torch.isfinite(next_dists).all()
    assert ((stop_probs >= 0) & (stop_probs <= 1)).all()
    weight = (tree.draft_mass[:, None, None] * tau_law(stop_probs)[..., None] * next_dists.double()).tolist()
    law: dict[tuple, float] = {}
    for draft, per_tau in zip(tree.drafts, weight):
        for i, per_token in enumerate(per_tau):
            for y, mass in enumerate(per_token):
                if mass > 0:
                    law[draft[:i] + (y,)] = law.get(draft[:i] + (y,), 0.0) + mass
    return law


def completion_error(tree: Tree, law: dict[tuple, float]) -> float:
    """Lossless means: emit a round, then continue with the target's own sampling up to K+1 tokens;
    every length-(K+1) sequence must then have exactly the target's probability. Max abs error."""
    err = 0.0
    for z in itertools.product(range(tree.v), repeat=tree.k + 1):
        via_rounds = sum(law.get(z[:m], 0.0) * Tree.prob(tree.p, z, m) for m in range(1, tree.k + 2))
        err = max(err, abs(via_rounds - Tree.prob(tree.p, z)))
    return err


def expected_block_accepted(tree: Tree) -> float:
    stop_probs, _ = plan_of(tree)
    per_draft = (tau_law(stop_probs) * torch.arange(tree.k + 1, dtype=torch.float64)).sum(1)
    return float((tree.draft_mass * per_draft).sum())


def expected_rejection_accepted(tree: Tree) -> float:
    """Token-wise rejection sampling: sum_i prod_{j <= i} min(1, p_j(x_j) / q_j(x_j)) per draft."""
    total = 0.0
    for d, mass in zip(tree.drafts, tree.draft_mass.tolist()):
        run = 1.0
        for i in range(tree.k):
            qx, px = float(tree.q[d[:i]][d[i]]), float(tree.p[d[:i]][d[i]])
            run *= min(1.0, px / qx) if qx > 0 else float(px > 0)
            total += mass * run
    return total


# ------------------------------------------------------------------------------------------------
# exactness
# ------------------------------------------------------------------------------------------------

# (V, K, seed, degenerate); K = 7 is the production block (3^7 drafts, ~2 s).
TREES = [(5, 2, 0, False), (5, 3, 1, False), (8, 2, 2, False), (6, 3, 3, True), (5, 3, 5, True), (3, 7, 6, False)]


@pytest.mark.parametrize("v,k,seed,degenerate", TREES, ids=[f"V{v}-K{k}-s{s}{'-degenerate' if d else ''}"
                                                           for v, k, s, d in TREES])
def test_block_verification_output_law_is_the_targets(v, k, seed, degenerate):
    tree = random_tree(v, k, seed, degenerate)
    law = exact_output_law(tree, *plan_of(tree))
    assert abs(sum(law.values()) - 1.0) < 1e-5
    assert completion_error(tree, law) < 2e-6


def test_the_exactness_check_has_power():
    """Plausible mistakes break it: stopping with h_i = 1 wherever the residual has mass (a stop rule
    that ignores 1 - w_i), or drawing the correction from the token-wise residual max(p - q, 0)."""
    tree = random_tree(5, 3, 1)
    stop_probs, next_dists = plan_of(tree)
    greedy_stops = torch.where(stop_probs > 0, torch.ones_like(stop_probs), stop_probs)
    greedy_stops[:, -1] = stop_probs[:, -1]
    assert completion_error(tree, exact_output_law(tree, greedy_stops, next_dists)) > 1e-3
    k = tree.k
    token_resid = (tree.target_probs[:, :k] - tree.draft_probs).clamp_min(0)
    token_resid = token_resid / token_resid.sum(-1, keepdim=True)
    wrong_dists = torch.cat([token_resid, next_dists[:, k:]], dim=1)
    assert completion_error(tree, exact_output_law(tree, stop_probs, wrong_dists)) > 1e-3


def test_sampling_follows_the_plan():
    """The sampling half, on drafts drawn from q: (accepted prefix, last token) outcomes of
    accept_block_verification match the exact law (chi-square, fixed seeds)."""
    tree = random_tree(4, 2, 5)
    law = exact_output_law(tree, *plan_of(tree))
    n = 40000
    rows = sample_from_probs(tree.draft_mass.float().expand(n, -1), generator=_gen(6))
    emitted, accepted = accept_block_verification(tree.candidates[rows], tree.draft_probs[rows],
                                                  tree.target_probs[rows], generator=_gen(7))
    seen = Counter(tuple(e[: a + 1]) for e, a in zip(emitted.tolist(), accepted.tolist()))
    assert set(seen) <= set(law)
    assert len(seen) > 20 and _chi2_pvalue(seen, law, n) > 1e-3


def test_k0_is_plain_target_sampling():
    p = torch.softmax(torch.randn(1, 1, 4, generator=_gen(8)), -1).expand(20000, 1, 4).contiguous()
    emitted, acc = accept_block_verification(torch.empty(20000, 0, dtype=torch.long), torch.empty(20000, 0, 4), p,
                                             generator=_gen(9))
    assert emitted.shape == (20000, 1) and acc.eq(0).all()
    counts = torch.bincount(emitted[:, 0], minlength=4).double()
    expected = p[0, 0].double() / p[0, 0].double().sum() * 20000
    assert chisquare(counts.numpy(), expected.numpy()).pvalue > 1e-3


def test_shape_mismatch_is_a_value_error():
    with pytest.raises(ValueError, match="shape mismatch"):
        accept_block_verification(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3, 5), torch.zeros(2, 3, 5))


# ------------------------------------------------------------------------------------------------
# temperature 0
# ------------------------------------------------------------------------------------------------

def test_one_hot_distributions_give_the_greedy_prefix():
    """At temperature 0 probs_from_logits is one-hot: block verification = target-only greedy."""
    bsz, k, v = 256, 7, 4
    g = _gen(10)
    target = torch.randint(0, v, (bsz, k + 1), generator=g)
    draft = torch.where(torch.rand(bsz, k, generator=g) < 0.8, target[:, :k], torch.randint(0, v, (bsz, k), generator=g))
    t_logits = torch.randn(bsz, k + 1, v, generator=g).scatter(-1, target[..., None], 10.0)
    d_logits = torch.randn(bsz, k, v, generator=g).scatter(-1, draft[..., None], 10.0)
    emitted, acc = accept_block_verification(draft, probs_from_logits(d_logits, 0.0), probs_from_logits(t_logits, 0.0),
                                             generator=_gen(11))
    assert torch.equal(acc, accept_target_only(draft, sample_tokens(t_logits, 0.0)))
    assert {0, 3, k} <= set(acc.tolist())
    keep = torch.arange(k + 1)[None] <= acc[:, None]
    assert torch.equal(emitted[keep], target[keep])


# ------------------------------------------------------------------------------------------------
# acceptance vs token-wise rejection sampling
# ------------------------------------------------------------------------------------------------

def test_paper_example_expected_accepted_lengths():
    """Sun et al. §1: Mb = (1/3, 2/3), Ms = (2/3, 1/3), two drafts: token-wise 10/9, block 11/9."""
    tree = context_free_tree([1 / 3, 2 / 3], [2 / 3, 1 / 3], k=2)
    assert expected_rejection_accepted(tree) == pytest.approx(10 / 9, abs=1e-6)
    assert expected_block_accepted(tree) == pytest.approx(11 / 9, abs=1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_expected_block_acceptance_is_never_below_rejection(seed):
    tree = random_tree(5, 3, 20 + seed, degenerate=seed % 2 == 1)
    assert expected_block_accepted(tree) >= expected_rejection_accepted(tree) - 1e-6


@pytest.mark.parametrize("tree_kind", ["paper", "random"])
def test_block_accepts_at_least_as_many_as_rejection_on_the_same_drafts(tree_kind):
    """Both functions verify the SAME 20k sampled draft blocks: the paired mean difference is >= 0
    within three standard errors, and each mean matches its exact expectation."""
    tree = context_free_tree([1 / 3, 2 / 3], [2 / 3, 1 / 3], k=2) if tree_kind == "paper" else random_tree(5, 3, 30)
    n = 20000
    rows = sample_from_probs(tree.draft_mass.float().expand(n, -1), generator=_gen(31))
    args = (tree.candidates[rows], tree.draft_probs[rows], tree.target_probs[rows])
    block = accept_block_verification(*args, generator=_gen(32))[1].double()
    token = accept_rejection_sampling(*args, generator=_gen(33))[1].double()
    diff = block - token
    se = float(diff.std() / n ** 0.5)
    assert float(diff.mean()) >= -3 * se
    exact_block, exact_token = expected_block_accepted(tree), expected_rejection_accepted(tree)
    assert exact_block > exact_token
    for sample, exact in ((block, exact_block), (token, exact_token)):
        assert abs(float(sample.mean()) - exact) < 4 * float(sample.std() / n ** 0.5)


# ------------------------------------------------------------------------------------------------
# in the decoding loop
# ------------------------------------------------------------------------------------------------

METHODS = ["mtp415", "raw_dflash", "dual_anchor_zero_init", "dual_anchor_zero_init+dflash2"]


def _dflash2_drafter(target, name: str):
    from dmtp.drafters.block_drafter import build_block_drafter

    torch.manual_seed(3)
    drafter = build_block_drafter(target, name, 3, num_layers=1, num_target_features=1, architecture="dflash2",
                                  selector_rank=8, selector_top_k=4)
    with torch.no_grad():
        drafter.backbone.candidate_selector.successor_codebook.normal_(std=0.5)   # make the selector matter
    return drafter.eval()


def _proposer(method: str, target, mtp):
    if method in ("ar", "mtp415"):
        return build_proposer(method, target, mtp=mtp)
    name, _, arch = method.partition("+")
    drafter = _dflash2_drafter(target, name) if arch == "dflash2" else _drafter(target, name)
    return build_proposer("drafter", target, mtp=mtp, drafter=drafter)


SAMPLINGS = [SamplingConfig(temperature=1.0, top_k=4, verification="block"),
             SamplingConfig(temperature=0.6, top_p=0.5, verification="block")]
CASES = [(m, s) for m in METHODS for s in SAMPLINGS]


@pytest.mark.parametrize("method,sampling", CASES, ids=[f"{m}-T{s.temperature}" for m, s in CASES])
def test_block_verification_matches_target_distribution(micro_target, micro_mtp, prompt, method, sampling):
    dec = spec_decoder(micro_target, _proposer(method, micro_target, micro_mtp), eos_token_id=[])
    res = dec.generate([prompt] * N_SAMPLES, max_new_tokens=STEPS, sampling=sampling, batch_size=N_SAMPLES, seed=123)
    seqs = [tuple(t) for t in res.tokens]
    assert all(len(s) == STEPS for s in seqs)
    counts = Counter(seqs)
    probs = _exact_probs(micro_target, prompt, list(counts), sampling)
    assert all(p > 0 for p in probs.values())   # never a token outside the top-k / top-p set
    pvalue = _chi2_pvalue(counts, probs, N_SAMPLES)
    assert pvalue > 1e-3, (pvalue, counts.most_common(8))
    assert any(a > 0 for acc in res.accepted for a in acc)   # drafts were really accepted


def test_block_accepts_at_least_as_many_in_the_loop(micro_target, micro_mtp, prompt):
    """One seed: every request's first round verifies the same MTP415 drafts under both modes (the
    modes' random draws start in the verify stage), so the first rounds' accepted counts pair up."""
    dec = spec_decoder(micro_target, build_proposer("mtp415", micro_target, mtp=micro_mtp), eos_token_id=[])
    first_round = {}
    for mode in ("rejection", "block"):
        res = dec.generate([prompt] * 1000, max_new_tokens=2, batch_size=1000, seed=5,
                           sampling=SamplingConfig(temperature=1.0, verification=mode))
        first_round[mode] = torch.tensor([acc[0] for acc in res.accepted_raw], dtype=torch.float64)
    diff = first_round["block"] - first_round["rejection"]
    assert float(diff.mean()) >= -3 * float(diff.std() / len(diff) ** 0.5), {m: float(a.mean()) for m, a in first_round.items()}


@pytest.mark.parametrize("method", ["ar", *METHODS])
def test_block_verification_at_temperature_zero_is_greedy(micro_target, micro_mtp, method):
    prompts = [[5 + i, 40 + 3 * i, 77, 12 + i, 9] for i in range(3)]
    ar = spec_decoder(micro_target, build_proposer("ar", micro_target), eos_token_id=[]).generate(prompts, 16)
    dec = spec_decoder(micro_target, _proposer(method, micro_target, micro_mtp), eos_token_id=[])
    res = dec.generate(prompts, max_new_tokens=16, batch_size=2, sampling=SamplingConfig(verification="block"))
    assert res.tokens == ar.tokens


def test_block_mode_samples_drafts_from_q():
    assert SamplingConfig(temperature=1.0, verification="block").uses_draft_probs
    assert not SamplingConfig(temperature=0.0, verification="block").uses_draft_probs


@pytest.mark.parametrize("bad", ["blocks", "Block", "", "token"])
def test_bad_verification_is_a_one_line_value_error(bad):
    with pytest.raises(ValueError) as err:
        SamplingConfig(temperature=1.0, verification=bad)
    msg = str(err.value)
    assert "\n" not in msg and "block" in msg and repr(bad) in msg
