"""Device-side verification of a speculative block (SPEC §5, decode-loop.md §2).

Every round the target runs one forward over ``[A, c1..cK]`` and returns logits
``[B, K+1, V]``: position ``i`` predicts the token that follows ``c_i`` (``c_0 = A``).
This module turns those logits into the round's emitted tokens and the number of
accepted candidates per row.

Three acceptance rules share one contract: :func:`accept_target_only` (drafts compared with the
target's own samples), :func:`accept_rejection_sampling` (token-wise, Leviathan et al. 2023) and
:func:`accept_block_verification` (the whole block jointly, Sun et al. 2025). The last two need
the proposal distributions ``q`` the drafts were sampled from.

All functions stay on the tensors' device and use only fixed-shape ops: no ``.item()``,
``.cpu()``, ``nonzero``, boolean-mask indexing, data-dependent Python branches or
``torch.multinomial``. The only Python branches are on plain Python arguments
(``temperature``, ``top_k``, ``top_p``), which are fixed when a CUDA graph is captured
(one graph per sampling mode).

Conventions
-----------
* ``candidates[:, i]`` (``i = 0..K-1``) is the drafted token ``c_{i+1}``; it is checked
  against the target's distribution / sample at position ``i``.
* ``accepted[b]`` in ``0..K`` counts accepted candidates; the round emits
  ``accepted + 1`` tokens (accepted drafts + one correction or bonus token).
"""

from __future__ import annotations

import torch
from torch import Tensor

from dmtp.models.temperature import scale_logits

__all__ = [
    "probs_from_logits",
    "scale_logits",
    "sample_tokens",
    "sample_from_probs",
    "accept_target_only",
    "accept_rejection_sampling",
    "block_verification_plan",
    "accept_block_verification",
]


def _filter_logits(logits: Tensor, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Mask (to ``-inf``) tokens outside the top-k set and outside the top-p nucleus.

    ``logits`` are already temperature-scaled, float32. Top-k is applied first, then top-p
    on the renormalised remaining distribution. The most likely token is always kept.
    """
    vocab = logits.shape[-1]
    if top_k and 0 < top_k < vocab:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        # mass strictly before each token (in sorted order); drop a token once the tokens
        # before it already cover top_p.
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        remove_sorted = mass_before >= top_p
        remove_sorted[..., :1] = False  # always keep the argmax
        remove = torch.zeros_like(remove_sorted).scatter(-1, sorted_idx, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    return logits


def probs_from_logits(
    logits: Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> Tensor:
    """Sampling distribution (float32, same shape as ``logits``) after temperature/top-k/top-p.

    ``temperature <= 0`` means greedy: a one-hot distribution on the argmax. This lets
    rejection sampling at temperature 0 reduce exactly to greedy verification.
    """
    if temperature <= 0.0:
        idx = logits.argmax(dim=-1, keepdim=True)
        return torch.zeros(logits.shape, dtype=torch.float32, device=logits.device).scatter_(
            -1, idx, 1.0
        )
    scaled = _filter_logits(scale_logits(logits, temperature), top_k=top_k, top_p=top_p)
    return torch.softmax(scaled, dim=-1)


def sample_from_probs(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Draw one index per row of ``probs`` (``[..., V]``, any non-negative mass) by inverting its CDF.

    One uniform ``u`` per row, ``x = u * total`` kept strictly below the total, and the first index whose
    cumulative mass exceeds ``x``: index ``v`` is picked with probability ``p_v / sum(p)``, and an index
    with zero mass never (its interval is empty). One random number per row (an exponential race would
    draw V, which on CPU costs more than the rest of a round), fixed shapes, no host sync.
    """
    cdf = probs.float().cumsum(dim=-1)
    total = cdf[..., -1:]
    u = torch.rand(total.shape, dtype=torch.float32, device=probs.device, generator=generator)
    # u * total can round up to total when u is close to 1: the largest float below it is still valid.
    x = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    idx = torch.searchsorted(cdf, x, right=True)
    return idx.clamp_max(probs.shape[-1] - 1).squeeze(-1)


def sample_tokens(
    logits: Tensor,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Sample a token at every position: logits ``[B, T, V]`` -> tokens ``[B, T]`` (long).

    ``temperature == 0`` is argmax (``top_k``/``top_p`` are irrelevant then).
    """
    if temperature <= 0.0:
        return logits.argmax(dim=-1)
    probs = probs_from_logits(logits, temperature, top_k=top_k, top_p=top_p)
    return sample_from_probs(probs, generator=generator)


def accept_target_only(candidates: Tensor, target_tokens: Tensor, limit: Tensor | None = None) -> Tensor:
    """Target-only acceptance: length of the prefix where ``candidates == target_tokens``.

    Args:
        candidates: ``[B, K]`` drafted tokens ``c_1..c_K``.
        target_tokens: ``[B, K+1]`` target argmax / samples at every verify position.
        limit: optional ``[B]`` long: verify only the first ``limit`` candidates (the rest are masked,
            never accepted; the token at ``limit`` is then the target's own, as if the block ended there).

    Returns:
        ``accepted`` ``[B]`` long in ``0..K``. The round's tokens are
        ``target_tokens[:, :accepted+1]`` (accepted drafts equal the target tokens, plus the
        correction or bonus at index ``accepted``). Works for ``K = 0`` (all zeros).
    """
    k = candidates.shape[1]
    if target_tokens.shape[1] != k + 1:
        raise ValueError(
            f"target_tokens must have K+1={k + 1} positions, got {tuple(target_tokens.shape)}"
        )
    matches = candidates == target_tokens[:, :k]
    if limit is not None:
        matches = matches & _verified(limit, k)
    return matches.long().cumprod(dim=1).sum(dim=1)


def _verified(limit: Tensor, k: int) -> Tensor:
    """``[B]`` verified candidates -> ``[B, K]`` bool, True at the candidates that are verified."""
    return torch.arange(k, device=limit.device)[None] < limit[:, None]


def _check_block_shapes(candidates: Tensor, draft_probs: Tensor, target_probs: Tensor) -> None:
    bsz, k = candidates.shape
    if draft_probs.shape[:2] != (bsz, k) or target_probs.shape[:2] != (bsz, k + 1):
        raise ValueError(
            "shape mismatch: candidates [B,K], draft_probs [B,K,V], target_probs [B,K+1,V] "
            f"got {tuple(candidates.shape)}, {tuple(draft_probs.shape)}, "
            f"{tuple(target_probs.shape)}"
        )


def accept_rejection_sampling(
    candidates: Tensor,
    draft_probs: Tensor,
    target_probs: Tensor,
    generator: torch.Generator | None = None,
    limit: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Speculative rejection sampling over a chain block, fully on device.

    Candidate ``i`` is accepted with probability ``min(1, p_i(c_i) / q_i(c_i))`` provided all
    earlier candidates were accepted. At the first rejection the correction token is drawn
    from ``normalize(max(p_i - q_i, 0))`` (falling back to ``p_i`` if that has no mass);
    when all ``K`` are accepted a bonus token is drawn from ``p_K``. The emitted sequence is
    distributed exactly as sampling from the target.

    Args:
        candidates: ``[B, K]`` drafted tokens.
        draft_probs: ``[B, K, V]`` draft distributions ``q_i`` the candidates were drawn from.
        target_probs: ``[B, K+1, V]`` target distributions ``p_i`` (same filtering as used
            for plain sampling, see :func:`probs_from_logits`).
        generator: optional generator on the tensors' device.
        limit: optional ``[B]`` long: verify only the first ``limit`` candidates, exactly as if the
            block ended there (at ``limit`` the token is a sample from ``p_limit``, a bonus, not a
            residual: nothing was rejected there).

    Returns:
        ``(emitted [B, K+1] long, accepted [B] long)``. ``emitted[:, :accepted+1]`` are the
        round's tokens; later positions hold each position's own residual sample
        (don't-care).
    """
    _check_block_shapes(candidates, draft_probs, target_probs)
    k = candidates.shape[1]
    p = target_probs.float()
    q = draft_probs.float()
    p_draft = p[:, :k]
    idx = candidates.long().unsqueeze(-1)
    ratio = _acceptance_ratio(p_draft.gather(-1, idx).squeeze(-1), q.gather(-1, idx).squeeze(-1))  # [B, K]
    coins = torch.rand(ratio.shape, dtype=torch.float32, device=ratio.device, generator=generator)
    ok = coins < ratio  # coin in [0, 1): ratio 1 always accepts, ratio 0 never does
    if limit is not None:
        ok = ok & _verified(limit, k)
    accepted = ok.long().cumprod(dim=1).sum(dim=1)  # [B]
    dist = torch.cat([_residuals(p_draft, q, limit), p[:, k:]], dim=1)  # [B, K+1, V]
    fallback = sample_from_probs(dist, generator=generator)  # [B, K+1]

    pos = torch.arange(k + 1, device=candidates.device).unsqueeze(0)  # [1, K+1]
    cand_ext = torch.cat([candidates.long(), fallback[:, k:]], dim=1)  # [B, K+1]
    emitted = torch.where(pos < accepted.unsqueeze(1), cand_ext, fallback)
    return emitted, accepted


def _acceptance_ratio(p_c: Tensor, q_c: Tensor) -> Tensor:
    """min(1, p/q) per candidate; a candidate the draft claims has q = 0 is accepted iff the target allows it."""
    return torch.where(q_c > 0, (p_c / q_c.clamp_min(torch.finfo(torch.float32).tiny)).clamp_max(1.0),
                       (p_c > 0).float())


def _residuals(p_draft: Tensor, q: Tensor, limit: Tensor | None) -> Tensor:
    """The distribution a rejection at slot i samples from: normalize(max(p_i - q_i, 0)), p_i when that is empty."""
    resid = (p_draft - q).clamp_min(0.0)
    mass = resid.sum(dim=-1, keepdim=True)
    resid = torch.where(mass > 0, resid / mass.clamp_min(torch.finfo(torch.float32).tiny), p_draft)
    if limit is not None:   # past the verified prefix the block has ended: the target's own p (a bonus)
        resid = torch.where(_verified(limit, p_draft.shape[1])[..., None], resid, p_draft)
    return resid


def _running_block_weights(p_cand: Tensor, q_cand: Tensor) -> Tensor:
    """``w_0 = 1``, ``w_i = min(w_{i-1} * p_i(X_i) / q_i(X_i), 1)`` for ``i = 1..K`` -> ``[B, K+1]``.

    ``p_cand``/``q_cand`` ``[B, K]`` are the target's and the draft's probabilities of the drafted
    tokens. A short static loop over K (a shape, not data): each step clips at 1, so it is not a
    plain cumulative product. A draft token with ``q = 0`` (never sampled from q; possible only for
    hand-made drafts) has an infinite ratio: weight 1 if ``w_{i-1} * p_i(X_i) > 0``, else 0.
    """
    tiny = torch.finfo(torch.float32).tiny
    weights = [p_cand.new_ones(p_cand.shape[0])]
    for i in range(p_cand.shape[1]):
        carried = weights[-1] * p_cand[:, i]
        q_i = q_cand[:, i]
        weights.append(torch.where(q_i > 0, (carried / q_i.clamp_min(tiny)).clamp_max(1.0), (carried > 0).float()))
    return torch.stack(weights, dim=1)


def block_verification_plan(
    candidates: Tensor, draft_probs: Tensor, target_probs: Tensor, limit: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The deterministic half of block verification (Sun et al., ICLR 2025, arXiv 2403.10444, Alg. 2).

    With ``p_i = target_probs[:, i-1]`` (``Mb(.|X^{i-1})``), ``q_i = draft_probs[:, i-1]``
    (``Ms(.|X^{i-1})``) and the running weights ``w`` of :func:`_running_block_weights`:

    * residual after ``X^i`` (``i < K``): ``r_i(x) = max(w_i * p_{i+1}(x) - q_{i+1}(x), 0)``;
    * stop weight ``h_i = sum_x r_i(x) / (sum_x r_i(x) + 1 - w_i)`` for ``0 < i < K``, ``h_K = w_K``
      and ``h_0 = 1`` (the algorithm's default ``tau = 0``);
    * the round keeps ``tau = max{i : eta_i < h_i}`` drafts (``eta_i ~ U[0, 1)``) and then draws one
      token from ``normalize(r_tau)`` when ``tau < K``, from ``p_{K+1}`` when ``tau = K``.

    Degenerate cases, all without NaNs: zero residual mass gives ``h_i = 0`` (a stop there would
    have nothing to sample; in exact arithmetic it has probability 0), and its next-token
    distribution falls back to the target's ``p_{i+1}`` (only reachable as ``tau = 0`` through
    rounding); ``p_i(X_i) = 0`` zeroes ``w`` from ``i`` on, hence every later ``h``.

    Returns:
        ``(stop_probs [B, K+1], next_dists [B, K+1, V])``: ``stop_probs[:, i] = h_i`` and
        ``next_dists[:, i]`` the distribution of the round's last token when ``tau = i``. Given the
        drafts, ``P(tau = i) = h_i * prod_{j > i} (1 - h_j)``.

    ``limit`` (optional ``[B]`` long): the plan of the block cut after ``limit = L`` drafts, i.e. the
    algorithm run with ``K = L``: ``h_L = w_L``, ``h_i = 0`` for ``i > L``, and the last token at ``L``
    drawn from ``p_{L+1}``.
    """
    _check_block_shapes(candidates, draft_probs, target_probs)
    k = candidates.shape[1]
    tiny = torch.finfo(torch.float32).tiny
    p = target_probs.float()
    q = draft_probs.float()
    idx = candidates.long().unsqueeze(-1)
    w = _running_block_weights(p[:, :k].gather(-1, idx).squeeze(-1), q.gather(-1, idx).squeeze(-1))

    resid = (w[:, :k, None] * p[:, :k] - q).clamp_min(0.0)  # [B, K, V]: r_0..r_{K-1}
    mass = resid.sum(dim=-1)  # [B, K]
    # mass > 0 makes the denominator >= mass > 0 (w <= 1). (1 - w) is formed first: adding a tiny
    # mass to 1.0 would round it away.
    h_inner = torch.where(mass > 0, mass / (mass + (1.0 - w[:, :k])).clamp_min(tiny), torch.zeros_like(mass))
    h = torch.cat([h_inner, w[:, k:]], dim=1)  # h_0..h_{K-1}, h_K = w_K  ([B, 1] = w_0 when K = 0)
    stop_probs = torch.cat([torch.ones_like(h[:, :1]), h[:, 1:]], dim=1)

    norm = resid / mass.clamp_min(tiny).unsqueeze(-1)
    resid_dists = torch.where(mass.unsqueeze(-1) > 0, norm, p[:, :k])
    next_dists = torch.cat([resid_dists, p[:, k:]], dim=1)  # [B, K+1, V]
    if limit is not None:
        pos = torch.arange(k + 1, device=candidates.device)[None]
        end, past = pos == limit[:, None], pos > limit[:, None]
        stop_probs = torch.where(end, torch.where(pos == 0, stop_probs, w), torch.where(past, 0.0, stop_probs))
        next_dists = torch.where(end[..., None], p, next_dists)
    return stop_probs, next_dists


def accept_block_verification(
    candidates: Tensor,
    draft_probs: Tensor,
    target_probs: Tensor,
    generator: torch.Generator | None = None,
    limit: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Block verification of a chain block, fully on device (same contract as
    :func:`accept_rejection_sampling`, ``limit`` included).

    The whole draft block is verified jointly (:func:`block_verification_plan`): the emitted
    sequence is distributed exactly as sampling from the target, and the expected number of
    accepted drafts is never below token-wise rejection sampling's for the same drafts (it is
    optimal among verifiers that see only the drafted path's probabilities).

    Args:
        candidates: ``[B, K]`` drafted tokens, sampled autoregressively from ``draft_probs``.
        draft_probs: ``[B, K, V]``: ``draft_probs[:, i]`` is the distribution candidate ``i`` was
            drawn from, given the earlier candidates.
        target_probs: ``[B, K+1, V]`` target distributions (see :func:`probs_from_logits`).
        generator: optional generator on the tensors' device.

    Returns:
        ``(emitted [B, K+1] long, accepted [B] long)``. ``emitted[:, :accepted+1]`` are the
        round's tokens; later positions are don't-care.
    """
    stop_probs, next_dists = block_verification_plan(candidates, draft_probs, target_probs, limit)
    k = candidates.shape[1]
    eta = torch.rand(stop_probs.shape, dtype=torch.float32, device=stop_probs.device, generator=generator)
    # eta in [0, 1): P(eta < h) = h exactly; h_0 = 1 always stops, so tau = 0 when nothing later does.
    stops = eta < stop_probs
    pos = torch.arange(k + 1, device=candidates.device).unsqueeze(0)  # [1, K+1]
    accepted = (stops.long() * pos).amax(dim=1)  # tau: the LAST position whose eta is below h
    last = sample_from_probs(next_dists, generator=generator)  # [B, K+1]: a draw for every tau
    cand_ext = torch.cat([candidates.long(), last[:, k:]], dim=1)
    emitted = torch.where(pos < accepted.unsqueeze(1), cand_ext, last)
    return emitted, accepted
