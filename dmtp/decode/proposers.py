"""Candidate proposers for the one decoding loop (`dmtp.decode.loop.SpecDecoder`).

A proposer contributes two lists of stages to every round, each stage a no-argument function that
reads and writes preallocated device buffers (so the same code runs eagerly on CPU and inside CUDA
graphs on GPU) and declares the buffers it writes (`dmtp.decode.stage.Stage`):

* `propose_stages(st)`: fill `st.candidates [B, K]` (and `st.q [B, K, V]`, the proposal
  distributions, when rejection sampling is on);
* `advance_stages(st)`: after the target's verify, bring the proposer's own state up to date with the
  committed rows (`st.target_tokens`, `st.h_verify`, `st.f_verify`, `st.round_start`, `st.kept`).

Methods:
* `ARProposer`: target-only autoregressive (K = 0).
* `MTPChainProposer(k)`: the native MTP chained k times (`mtp415` = k 4, top-1, 5 verify slots).
* `DrafterProposer`: raw DFlash and every DMTP variant, through the drafter's injection module.
  It never looks at a variant's name: `needs_mtp`, `uses_mtp`, `needs_mtp_context`, `num_slots`,
  `first_predicted_slot`, `slot_positions`, `build_block`, and for the MTP tokens `mtp_steps` (the
  static chain length S), `choose_num_mtp` (m per request, on the device) and `merge_candidates`
  (candidate j from the MTP for j <= m, else from the drafter, by `torch.where`) say everything.

State shared by the MTP-using methods is `MTPState`: the MTP's private static KV cache, the hidden
`h` that predicts the next T1 (g at the anchor position) and, for context variants, a per-position
buffer of g (`g_buf[:, t] = g_t`, the MTP row that consumed (x_t, h_{t-1}); `g_buf[:, 0] = 0`), the
same alignment as `NativeMTP.forward_teacher`. After each verify a fixed catch-up of W rows rebuilds
the MTP rows at positions a+1..a+W from the TARGET's hidden states: row i consumes (y[i], h_verify[i]).
`DrafterState` caches the drafter's context K/V (positions < anchor). The block's own K/V are recomputed
every round and written into the same caches at the block's positions (rows from the anchor on, which the
round's context append overwrites), so each layer attends its cache in place, never a copy of it
(`dmtp.drafters.dflash.CachedContext`).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from dmtp.decode.stage import Stage, present
from dmtp.decode.verify import probs_from_logits, sample_from_probs
from dmtp.drafters.block_drafter import BlockDrafter, MTPBlockInputs
from dmtp.drafters.dflash import CachedContext
from dmtp.drafters.window_cache import WindowCache, ring_size
from dmtp.models.draft_vocab import DraftVocab, restricted_mtp
from dmtp.models.mtp import NativeMTP
from dmtp.models.mtp_chain import chain_mtp
from dmtp.models.qwen3 import KVCache


def pick_tokens(logits: torch.Tensor, st, source: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Draft tokens from proposal logits [..., V] of a slot `source` ("mtp" or "block").

    Greedy (argmax) unless rejection/block verification is on at temperature > 0; then by the source's draft rule:
    sampled from q (the run's temperature/top-k/top-p), or its argmax with q the one-hot on it (both returned)."""
    s = st.sampling
    if not s.uses_draft_probs:
        return logits.argmax(-1), None
    if s.draft_rule(source) == "argmax":
        token = logits.argmax(-1)
        return token, torch.nn.functional.one_hot(token, logits.shape[-1]).float()
    q = probs_from_logits(logits, s.temperature, s.top_k, s.top_p)
    return sample_from_probs(q, generator=st.generator), q


def top1_probability(logits: torch.Tensor) -> torch.Tensor:
    """The MTP's confidence in its own pick: the top-1 probability of its softmax, [..., V] -> [...] float32."""
    return torch.softmax(logits.float(), dim=-1).amax(-1)


def _gather_pos(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x [B, T, D], idx [B] -> [B, D]."""
    return x.gather(1, idx.view(-1, 1, 1).expand(-1, 1, x.shape[-1])).squeeze(1)


class MTPState:
    """The native MTP's decoding state (see module docstring)."""

    def __init__(self, mtp: NativeMTP, keep_features: bool = False):
        self.mtp = mtp
        self.keep_features = keep_features
        self.hidden_size = mtp.spec.hidden_size

    def allocate(self, batch: int, max_len: int, rows: int, device, dtype) -> None:
        self.cache = self.mtp.new_cache(batch, max_len, dtype, device)
        self.h = torch.zeros(batch, self.hidden_size, dtype=dtype, device=device)
        self.g_buf = torch.zeros(batch, max_len, self.hidden_size, dtype=dtype, device=device) if self.keep_features else None
        self.row_offsets = torch.arange(1, rows + 1, device=device)
        self.rows = torch.arange(batch, device=device)[:, None]

    def prefill(self, ids: torch.Tensor, lengths: torch.Tensor, anchor: torch.Tensor, last_hidden: torch.Tensor,
                span: int | None = None) -> None:
        """Rows at positions 1..T over the prompt: row t consumes (x_t, h_{t-1}); x_len = A (the first
        output token).

        Row `len` gives the hidden that predicts T1. `span` (here and below): the cache slots attended to, as the
        target runner's (None: all)."""
        b, t = ids.shape
        tokens = torch.cat([ids[:, 1:], ids.new_zeros(b, 1)], dim=1)
        tokens.scatter_(1, (lengths - 1)[:, None], anchor[:, None])
        positions = torch.arange(1, t + 1, device=ids.device).expand(b, -1)
        g = self.mtp.forward_rows(tokens, last_hidden, positions, self.cache, span)
        self.h.copy_(_gather_pos(g, lengths - 1))
        if self.g_buf is not None:
            self.g_buf.zero_()
            self.g_buf[:, 1:t + 1] = g.to(self.g_buf.dtype)

    def catch_up(self, tokens: torch.Tensor, hidden: torch.Tensor, a_prev: torch.Tensor, acc: torch.Tensor,
                 span: int | None = None) -> None:
        """tokens/hidden [B, W]: the verify's target tokens y and post-norm hidden states at positions
        a..a+W-1 (W: the round's verified rows, at most the block's).

        Rows at a+1..a+W; the row at a+acc+1 (the new anchor) gives the next T1's hidden."""
        positions = a_prev[:, None] + self.row_offsets[:tokens.shape[1]]
        g = self.mtp.forward_rows(tokens, hidden, positions, self.cache, span)
        self.h.copy_(_gather_pos(g, acc))
        if self.g_buf is not None:
            self.g_buf[self.rows, positions] = g.to(self.g_buf.dtype)   # in place, compiled too (KVCache.write)

    def step(self, token: torch.Tensor, prev_hidden: torch.Tensor, position: torch.Tensor,
             span: int | None = None) -> torch.Tensor:
        """One chained row (scratch; the next catch-up overwrites it): [B], [B, H], [B] -> g [B, H]."""
        return self.mtp.forward_rows(token[:, None], prev_hidden[:, None], position[:, None], self.cache, span)[:, 0]

    def chain(self, st, steps: int, keep_logits: bool = False):
        """T1..T_steps from chaining the MTP (`chain_mtp`): step 1 reads the cached `h` (built from the
        target's states), each later step its own post-norm hidden of the previous step, in scratch
        rows after the anchor. -> `MTPChain` (tokens [B, S], hiddens that predicted them [B, S, H],
        their logits [B, S, V] when asked for, q [B, S, V] when sampled)."""
        a = st.target_lengths()
        return chain_mtp(self.mtp, self.h, steps, lambda j, token, h: self.step(token, h, a + j, st.span),
                         pick=lambda scores: pick_tokens(scores, st, "mtp"), keep_logits=keep_logits)

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        return self.mtp.logits(g)

    @property
    def rows_past_commit(self) -> tuple:
        """What chaining and catching up write only at positions after the committed length: the MTP's
        cache (chain rows after the anchor; catch-up rows a+1..a+W, at or past the new length once
        restored) and the per-position hidden buffer (the catch-up rows' g)."""
        return (self.cache, *present(self.g_buf))


class DrafterState:
    """A block drafter (backbone + injection) with its context-only K/V cache; `vocab`: the draft vocabulary its
    slots propose from (None: the whole head)."""

    def __init__(self, drafter: BlockDrafter, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor,
                 vocab: DraftVocab | None = None):
        self.drafter, self.injection = drafter, drafter.injection
        self.embed_weight, self.lm_head_weight = embed_weight, lm_head_weight
        self.vocab = vocab

    @property
    def context_caches(self) -> tuple:
        """The context K/V, which `append` writes at the verified rows and `draft` at the block's rows (both
        at positions >= the committed length)."""
        return tuple(self.caches)

    def allocate(self, batch: int, max_len: int, device, dtype) -> None:
        """Per layer a cache indexed by position, or for a sliding-window layer a ring bounded by its window
        (`WindowCache`: what it reads does not grow with the context)."""
        c = self.drafter.config
        self.ring = ring_size(c.sliding_window, self.injection.block_size) if c.sliding_window else None
        self.caches = [KVCache(batch, c.num_key_value_heads, max_len, c.head_dim, dtype, device)
                       if c.window_for(i) is None else
                       WindowCache(batch, c.num_key_value_heads, self.ring, c.head_dim, dtype, device)
                       for i in range(c.num_hidden_layers)]
        self.slots = torch.zeros(batch, 1, self.injection.num_slots, c.hidden_size, dtype=dtype, device=device)

    def append(self, features: torch.Tensor, mtp_features: torch.Tensor | None, positions: torch.Tensor,
               lengths: torch.Tensor | None = None) -> None:
        """Context K/V of rows [B, R] at `positions` (rows past a request's accepted count are scratch,
        invisible because they sit at or after the next anchor, and overwritten by the next append).
        `lengths`: a right-padded prompt's valid rows (what a window cache keeps of it)."""
        ctx = self.injection.context_features(features, mtp_features)
        hidden = self.drafter.project_context(ctx.to(self.slots.dtype))
        for cache, (k, v) in zip(self.caches, self.drafter.context_kv(hidden, positions)):
            if lengths is not None and isinstance(cache, WindowCache):
                cache.write_prompt(positions, k, v, lengths)
            else:
                cache.write(positions, k, v)

    def build(self, anchor: torch.Tensor, mtp: MTPBlockInputs | None) -> None:
        """The block's slots (one block per request), kept for `draft`."""
        self.slots.copy_(self.drafter.block_slots(self.embed_weight, anchor[:, None], mtp))

    def draft(self, anchor: torch.Tensor, anchor_pos: torch.Tensor, mtp: MTPBlockInputs | None, sampler,
              span: int | None = None):
        """The block's K candidates [B, K], q [B, K, V] when sampling (else None) and the drafter's
        confidence [B, K] (None without a confidence head), from the slots `build` made; context
        strictly before A, read from the first `span` cache slots (None: all).

        The block's rows are written into the caches at its positions (A .. A + B - 1 at most), so `span` must cover
        them: the loop's span covers every row a round touches (longest length + block width + 1)."""
        max_len = next((c.max_len for c in self.caches if not isinstance(c, WindowCache)), self.caches[0].max_len)
        ctx = CachedContext(self.caches, max_len if span is None else min(span, max_len), self.ring)
        block = self.drafter.draft_block(self.embed_weight, anchor[:, None], anchor_pos[:, None], ctx, None, mtp,
                                         lm_head_weight=self.lm_head_weight, sampler=sampler, slots=self.slots,
                                         vocab=self.vocab)
        return (block.candidates[:, 0], None if block.q is None else block.q[:, 0],
                None if block.confidence is None else block.confidence[:, 0])


class Proposer:
    """Base: proposes nothing (K = 0)."""

    name = "ar"
    num_candidates = 0
    layer_ids: Sequence[int] = ()
    mtp_state: MTPState | None = None
    # Whether its stages set `st.verify_limit` from a predicted acceptance (confidence-scheduled verification)
    predicts_confidence = False
    # (greedy, sampled): the MTP it proposes with in each mode (a drafter's MTP correction trained on greedy tokens
    # sharpens the MTP: sampling then proposes with the native one); None: `mtp_state.mtp` in both
    mtp_by_mode: tuple | None = None

    def set_sampling(self, sampling) -> None:
        """Called by the loop before every generation: the MTP of the sampling mode (`mtp_by_mode`)."""
        if self.mtp_state is not None and self.mtp_by_mode is not None:
            self.mtp_state.mtp = self.mtp_by_mode[0 if sampling.greedy else 1]

    # Whether its propose stages fill `st.confidence` (each candidate's predicted acceptance: a confidence
    # head, the MTP's top-1 probability) when it is allocated: what verify_length=auto reads
    signals_acceptance = False

    @property
    def needs_last_hidden(self) -> bool:
        return self.mtp_state is not None

    @property
    def needs_features(self) -> bool:
        return bool(self.layer_ids)

    def allocate(self, st) -> None:
        if self.mtp_state is not None:
            self.mtp_state.allocate(st.batch, st.max_len, st.width, st.device, st.dtype)

    def prefill(self, st, ids: torch.Tensor, lengths: torch.Tensor, out) -> None:
        if self.mtp_state is not None:
            self.mtp_state.prefill(ids, lengths, st.anchor, out.last_hidden, st.span)

    def propose_stages(self, st) -> list[Stage]:
        return []

    def advance_stages(self, st, rows: int | None = None) -> list[Stage]:
        """`rows`: the round's verified rows [A, c1..cL] (L + 1; None: the whole block)."""
        if self.mtp_state is None:
            return []
        m, w = self.mtp_state, rows or st.width
        return [Stage("mtp", lambda: m.catch_up(st.target_tokens[:, :w], st.h_verify[:, :w], st.round_start, st.kept, st.span),
                      writes=(m.h,), scratch=m.rows_past_commit)]


class ARProposer(Proposer):
    """Target-only autoregressive decoding: verify [A] alone, one token per round."""

    name = "ar"


class MTPChainProposer(Proposer):
    """The native MTP proposes k tokens by chaining itself: step 1 reads its cached hidden (built from
    the target's states), later steps read its own post-norm hidden g of the previous step. `draft_vocab`: its
    steps' LM head over that vocabulary only (dmtp.models.draft_vocab)."""

    def __init__(self, mtp: NativeMTP, steps: int = 4, name: str | None = None, sampled_mtp=None,
                 draft_vocab: DraftVocab | None = None):
        if steps < 1:
            raise ValueError("MTP chain needs at least one step")
        mtp, sampled_mtp = restricted_mtp(mtp, draft_vocab), restricted_mtp(sampled_mtp, draft_vocab)
        self.draft_vocab = draft_vocab
        self.mtp_state = MTPState(mtp)
        if sampled_mtp is not None:   # another MTP when sampling (`Proposer.mtp_by_mode`)
            self.mtp_by_mode = (mtp, sampled_mtp)
        self.num_candidates = steps
        self.name = name or f"mtp{steps}"

    signals_acceptance = True   # its own top-1 probability at every step

    def propose_stages(self, st) -> list[Stage]:
        m, k = self.mtp_state, self.num_candidates

        def chain():
            out = m.chain(st, k, keep_logits=st.confidence is not None)
            st.candidates.copy_(out.tokens)
            if st.q is not None:
                st.q.copy_(out.q)
            if st.confidence is not None:
                st.confidence.copy_(top1_probability(out.logits))

        return [Stage("mtp", chain, writes=present(st.candidates, st.q, st.confidence), scratch=(m.cache,))]


class DrafterProposer(Proposer):
    """A DFlash drafter (raw or DMTP): K = block_size - 1 candidates, the MTP's T1..Tm first when the
    injection uses it (m = 1 but for the multi-step variant, whose S-step MTP chain runs every round, m
    chosen per request from it). `draft_vocab`: the MTP's steps and the drafter's slots propose from that
    vocabulary only (dmtp.models.draft_vocab)."""

    def __init__(self, drafter: BlockDrafter, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor,
                 mtp: NativeMTP | None = None, name: str = "drafter", draft_vocab: DraftVocab | None = None):
        self.name = name
        self.draft_vocab = draft_vocab
        injection = self.injection = drafter.injection
        self.dstate = DrafterState(drafter, embed_weight, lm_head_weight, draft_vocab)
        if injection.needs_mtp:
            if mtp is None:
                raise ValueError(f"the {drafter.variant} drafter needs the target's native MTP (none given)")
            # T1 (and the chain) from the MTP as this drafter proposes with it (its MTP correction, if any).
            proposing = [restricted_mtp(drafter.proposing_mtp(mtp, greedy=g), draft_vocab) for g in (True, False)]
            self.mtp_state = MTPState(proposing[0], keep_features=injection.needs_mtp_context)
            self.mtp_by_mode = tuple(proposing)
        self.num_candidates = injection.num_candidates
        self.layer_ids = drafter.layer_ids
        self.predicts_confidence = drafter.has_confidence
        # A confidence head, or the MTP's top-1 probability for the candidates it proposes (MTP-led variants)
        self.signals_acceptance = drafter.has_confidence or injection.mtp_steps > 0

    def allocate(self, st) -> None:
        super().allocate(st)
        self.dstate.allocate(st.batch, st.max_len, st.device, st.dtype)
        inj = self.injection
        s = inj.mtp_steps
        self.mtp_tokens = torch.zeros(st.batch, max(s, 1), dtype=torch.long, device=st.device)   # T1..TS
        self.mtp_hidden = torch.zeros(st.batch, s, self.mtp_state.hidden_size, dtype=st.dtype, device=st.device) \
            if s else None
        self.mtp_q = (torch.zeros(st.batch, s, st.vocab_size, dtype=torch.float32, device=st.device)
                      if st.q is not None and s else None)
        self.num_mtp = torch.full((st.batch,), min(s, 1), dtype=torch.long, device=st.device)   # m per request
        # verify_length=auto: the MTP's top-1 probability of T1..TS (the acceptance signal of its candidates)
        self.mtp_confidence = (torch.ones(st.batch, s, dtype=torch.float32, device=st.device)
                               if st.confidence is not None and s else None)
        self.offsets = torch.arange(st.width, device=st.device)

    @property
    def t1(self) -> torch.Tensor:
        return self.mtp_tokens[:, 0]

    def _mtp_features(self, positions: torch.Tensor) -> torch.Tensor | None:
        if not self.injection.needs_mtp_context:
            return None
        g = self.mtp_state.g_buf
        return g.gather(1, positions[..., None].expand(-1, -1, g.shape[-1]))

    def prefill(self, st, ids, lengths, out) -> None:
        super().prefill(st, ids, lengths, out)
        positions = torch.arange(ids.shape[1], device=ids.device).expand(ids.shape[0], -1)
        self.dstate.append(out.layer_hidden, self._mtp_features(positions), positions, lengths)

    def propose_stages(self, st) -> list[Stage]:
        inj, d = self.injection, self.dstate
        steps = inj.mtp_steps
        # The block's MTP inputs (views of the buffers the chain fills; one block per request).
        mtp = (MTPBlockInputs(self.mtp_tokens[:, None, :steps], self.mtp_hidden[:, None], self.num_mtp[:, None],
                              None if self.mtp_q is None else self.mtp_q[:, None]) if steps else None)

        signal = self.mtp_confidence

        def chain():   # T1..TS, the hiddens that predicted them and their q; m from the chain's logits
            out = self.mtp_state.chain(st, steps, keep_logits=steps > 1 or signal is not None)
            self.mtp_tokens.copy_(out.tokens)
            self.mtp_hidden.copy_(out.hidden)
            if self.mtp_q is not None:
                self.mtp_q.copy_(out.q)
            if signal is not None:
                signal.copy_(top1_probability(out.logits))
            if steps > 1:   # one step: m = 1 always (set at allocation)
                self.num_mtp.copy_(inj.choose_num_mtp(out.logits))

        def build_slots():   # [A or T1.., masks] with the injection applied
            if steps == 1:   # the T1 head is part of this stage; a longer chain is its own "mtp" stage
                chain()
            d.build(st.anchor, mtp)

        schedule = st.sampling.schedules_verification
        threshold = st.sampling.confidence_threshold

        def draft():
            tok, q, conf = d.draft(st.anchor, st.target_lengths(), mtp, lambda scores: pick_tokens(scores, st, "block"),
                                   st.span)
            st.candidates.copy_(tok)
            if st.q is not None:
                st.q.copy_(q)
            if schedule:   # verify the leading candidates whose predicted survival reaches the threshold
                st.verify_limit.copy_((conf.cumprod(-1) >= threshold).sum(-1))
            if st.confidence is not None:   # the head's (1 at the MTP's candidates) times the MTP's top-1 there
                st.confidence.copy_(torch.ones_like(st.confidence) if conf is None else conf)
                if signal is not None:
                    st.confidence.mul_(inj.merge_candidates(signal, torch.ones_like(signal[:, :1]).expand(
                        -1, inj.num_drafter_candidates), self.num_mtp))

        # The block's K/V go into the context caches at rows from the anchor on: scratch, as the append's.
        drafting = Stage("drafter", draft, writes=present(st.candidates, st.q, st.verify_limit if schedule else None,
                                                          st.confidence), scratch=d.context_caches)
        if steps == 0:   # raw DFlash: no MTP, the block's slots are the anchor and the masks
            return [Stage("slots", build_slots, writes=(d.slots,)), drafting]
        chain_writes = present(self.mtp_tokens, self.mtp_hidden, self.mtp_q, signal)
        if steps == 1:   # one MTP step reads the cached hidden: no chained rows
            return [Stage("t1_fusion", build_slots, writes=(d.slots, *chain_writes)), drafting]
        return [Stage("mtp", chain, writes=(*chain_writes, self.num_mtp), scratch=(self.mtp_state.cache,)),
                Stage("t1_fusion", build_slots, writes=(d.slots,)), drafting]

    def advance_stages(self, st, rows: int | None = None) -> list[Stage]:
        d, w = self.dstate, rows or st.width

        def append():
            positions = st.round_start[:, None] + self.offsets[:w]
            d.append(st.f_verify[:, :w], self._mtp_features(positions), positions)

        return super().advance_stages(st, rows) + [Stage("drafter", append, scratch=d.context_caches)]


__all__ = ["Proposer", "ARProposer", "MTPChainProposer", "DrafterProposer", "MTPState",
           "DrafterState", "pick_tokens", "top1_probability"]
