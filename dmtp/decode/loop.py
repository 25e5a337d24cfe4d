"""The one speculative decoding loop (SPEC §5) for every method: ar, mtp415, raw DFlash, every DMTP variant.

Per round, for a batch of requests that each advance by their own accepted length:

1. the proposer's stages (MTP proposes T1 from its cached hidden; the injection module builds the
   drafter's slots; one parallel drafter forward) fill `candidates [B, K]`;
2. `verify`: the target runs `[A, c1..cK]` at positions `L..L+K` in one forward; the target's token
   at every slot (argmax, or a sample at temperature > 0) decides the accepted prefix on the device;
   the accepted prefix + correction/bonus is appended to the output, cut at EOS and at the budget;
   finished requests stop advancing; the target's length moves by the committed count;
3. the proposer's advance stages catch its own state up with the committed rows (MTP catch-up from
   the target's hidden states, drafter context append).

Every stage reads and writes preallocated device buffers and takes no host values, so the same
functions run eagerly on CPU and replay as CUDA graphs on GPU (`dmtp.decode.execution.graphs`). The only host
sync is the `done` poll every `poll_every` rounds (with graphs it also reads the longest length, which
picks the span bucket: captured rounds attend the first `span` cache slots, see `graph_span_step`).

Python::

    from dmtp.decode import SamplingConfig, build_proposer
    from dmtp.families.decoding import spec_decoder      # the loop on the target's runner (families' catalogue)
    proposer = build_proposer("drafter", target, mtp=mtp, drafter=drafter)   # a BlockDrafter (backbone + injection)
    dec = spec_decoder(target, proposer, eos_token_id=tok.eos_token_id)
    res = dec.generate(prompts, max_new_tokens=64, batch_size=8)        # greedy
    res.tokens        # per request: output ids (first = prefill token; ends at EOS or the budget)
    res.accepted      # per request, per round: committed accepted candidates (0..K)
    res.summary()     # SPEC §6 metrics
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from dmtp.decode.verify_length.costs import measure_round_costs
from dmtp.decode.metrics import AcceptanceRecorder, throughput
from dmtp.decode.proposers import (ARProposer, DrafterProposer, MTPChainProposer, Proposer)
from dmtp.decode.runners import TargetRunner
from dmtp.decode.sampling import SamplingConfig
from dmtp.decode.stage import Stage, present
from dmtp.decode.state import DecodeState, ProposerReads, StateSize, TargetWidths
from dmtp.decode.execution.programs import RoundPrograms, state_reset
from dmtp.decode.execution.stage_timer import StageTimer
from dmtp.decode.verify import (accept_block_verification, accept_rejection_sampling, accept_target_only,
                                probs_from_logits, sample_tokens)
from dmtp.decode.verify_length.policy import VerifyLengthPolicy
from dmtp.decode.verify_length.schedule import LengthSchedule
from dmtp.models.block_size import BLOCK_SIZE_RANGE

# The device-side acceptance rule of each mode that verifies drafts sampled from the proposers' q.
_ACCEPT_WITH_DRAFT_PROBS = {"rejection": accept_rejection_sampling, "block": accept_block_verification}


@dataclass
class DecodeResult:
    method: str
    num_candidates: int
    tokens: list[list[int]]
    accepted: list[list[int]]            # committed accepted candidates per round (cut by EOS/budget)
    accepted_raw: list[list[int]]        # what verification accepted before the EOS/budget cut
    prompt_lengths: list[int]
    wall_s: float
    prefill_s: float
    ttft_s: list[float]                  # per request: from its batch's start to its first token
    stage_ms: dict[str, float]
    counted_rounds: int
    batches: int
    sampling: SamplingConfig
    extra: dict = field(default_factory=dict)
    verify_lengths: list[list[int]] | None = None   # per request, per round: candidates the round verified (L)

    @property
    def output_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def recorder(self) -> AcceptanceRecorder:
        rec = AcceptanceRecorder(self.num_candidates, num_requests=len(self.accepted))
        for i, rounds in enumerate(self.accepted):
            rec.per_request[i].extend(rounds)
        return rec

    def summary(self) -> dict:
        """SPEC §6: acceptance (per-request and per-verify), histogram, T1 acceptance, P(L>=k) and
        conditional, throughput incl. prefill, time to first token, per-stage ms per round."""
        acc = self.recorder.summary()
        return {
            "method": self.method,
            **acc,
            "output_tokens": self.output_tokens,
            "wall_s": self.wall_s,
            "tokens_per_s": throughput(self.output_tokens, self.wall_s),
            "prefill_s": self.prefill_s,
            "ttft_ms": 1e3 * sum(self.ttft_s) / max(1, len(self.ttft_s)),
            "stage_ms_per_round": self.stage_ms,
            "timed_rounds": self.counted_rounds,
            "batches": self.batches,
            "sampling": {"temperature": self.sampling.temperature, "top_k": self.sampling.top_k,
                         "top_p": self.sampling.top_p, "verification": self.sampling.verification,
                         "confidence_threshold": self.sampling.confidence_threshold},
            "per_request": [{"prompt_tokens": p, "output_tokens": len(t), "rounds": len(a),
                             "tau": (sum(x + 1 for x in a) / len(a)) if a else None}
                            for p, t, a in zip(self.prompt_lengths, self.tokens, self.accepted)],
            **self.extra,
        }


def _round_up(x: int, m: int) -> int:
    return ((x + m - 1) // m) * m


# The eager loop attends over the live span of the static caches, rounded up to this many slots.
SPAN_STEP = 32


@dataclass
class _Gathered:
    """What `generate` gathers per request across its static batches."""
    tokens: list[list[int]]
    accepted: list[list[int]]
    accepted_raw: list[list[int]]
    verify_lengths: list[list[int]]
    ttft: list[float]
    verified: int = 0
    prefill_s: float = 0.0
    batches: int = 0

    @classmethod
    def for_requests(cls, n: int) -> "_Gathered":
        return cls([[] for _ in range(n)], [[] for _ in range(n)], [[] for _ in range(n)],
                   [[] for _ in range(n)], [0.0] * n)


def _sampling_of(sampling: SamplingConfig | None, sampling_kwargs: dict) -> SamplingConfig:
    if sampling is None:
        return SamplingConfig(**sampling_kwargs)
    if sampling_kwargs:
        raise ValueError("pass either sampling= or sampling keyword arguments, not both")
    return sampling


def _checked_prompts(prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    prompts = [list(map(int, p)) for p in prompts]
    if any(len(p) == 0 for p in prompts):
        raise ValueError("empty prompt")
    return prompts


class SpecDecoder:
    """One decoding loop over a target runner and a proposer (see module docstring).

    runner: the target's runtime (`dmtp.decode.runners`), chosen by the caller: `dmtp.families.decoding.
    spec_decoder` takes the first family runner that drives the target, as `runner=auto` does.
    cuda_graphs: on a CUDA device, capture each round's stages per batch bucket (`graphs.py`) and
    replay them; ignored elsewhere. compile: where no graphs run (CPU), `torch.compile` the round's
    stages as one program per batch bucket (`compiled.py`; True = inductor, or the name of another torch.compile backend,
    e.g. "aot_eager" to check the protocol without code generation); the compile time is reported
    apart (`extra["compile_s"]`).
    Otherwise the stages run eagerly, over the live span of the caches (`SPAN_STEP`). time_stages:
    per-stage timing (host-synced on CUDA eager; CUDA events with graphs). poll_every: rounds between
    `done` polls (default 1 eager or compiled, 4 graphs). graph_span_step: captured rounds attend only the
    first `span` slots of the caches, `span` a multiple of this covering every row the round touches, one
    capture per span bucket (None: the whole caches, one capture per batch bucket). The host bounds the
    longest length without a sync (its value at the last poll + the block width per round since), so a
    bucket is always wide enough; at 8B shapes this skips the K/V of the cache's unreached slots (the
    256-rounded slack, and the budget not yet decoded), ~10% of a batch-32 round at short contexts."""

    def __init__(self, target, proposer: Proposer, eos_token_id: int | Sequence[int] | None = None, *,
                 runner: TargetRunner, cuda_graphs: bool = False,
                 compile: bool | str = False, batch_buckets: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128),
                 warmup_rounds: int = 2, poll_every: int | None = None, time_stages: bool = True,
                 graph_granularity: str = "stage", graph_span_step: int | None = 256):
        self.target = target
        self.proposer = proposer
        runner.set_features(proposer.layer_ids)   # chosen by the caller (dmtp.families.decoding.spec_decoder)
        self.runner = runner
        if eos_token_id is None:
            eos_token_id = getattr(target.config, "eos_token_id", None)
        if eos_token_id is None:
            eos_ids: list[int] = []
        elif isinstance(eos_token_id, int):
            eos_ids = [eos_token_id]
        else:
            eos_ids = [int(e) for e in eos_token_id]
        self.eos_ids = eos_ids
        self.device = target.device
        self.dtype = target.dtype
        use_graphs = bool(cuda_graphs) and self.device.type == "cuda" and self.runner.supports_graphs
        backend = compile if isinstance(compile, str) else "inductor"
        self.programs = RoundPrograms(use_graphs, graph_granularity, backend)
        self.compiled = bool(compile) and not use_graphs
        self._generator: torch.Generator | None = None
        self.batch_buckets = sorted(int(b) for b in batch_buckets)
        self.warmup_rounds = warmup_rounds
        self.poll_every = poll_every or (4 if self.use_graphs else 1)
        self.time_stages = time_stages
        if graph_span_step is not None and graph_span_step < 1:
            raise ValueError(f"graph_span_step must be a positive number of slots or None, got {graph_span_step}")
        self.graph_span_step = graph_span_step
        self.vocab_size = target.lm_head.weight.shape[0]
        self.st: DecodeState | None = None
        # verify_length=auto: one policy (its measured cost table) per batch rows and sampling mode, kept
        # across batches and calls; the seconds spent measuring tables are reported apart, as compiling is.
        self._length_policies: dict = {}
        self.cost_table_s = 0.0
        self.cost_table_reps = 7
        # ... and how often it reads the rounds' record and chooses again: at a `done` poll at least this many
        # rounds after the last (vLLM's DSpark scheduler reads every 4 steps; each read is a host round trip)
        self.length_readout_rounds = 4
        # verify_length=auto's clock: CPU time of this process on a CPU (other processes do not inflate it),
        # wall time on CUDA (the device's time, synced)
        self.clock = time.process_time if self.device.type == "cpu" else time.perf_counter
        self._last_length: int | None = None   # the last round's L (round_fn runs that round again)

    @property
    def use_graphs(self) -> bool:
        """Rounds replay CUDA graphs (the program cache's mode; tests set it to run the protocol on CPU)."""
        return self.programs.use_graphs

    @use_graphs.setter
    def use_graphs(self, value: bool) -> None:
        self.programs.use_graphs = bool(value)

    @property
    def compile_s(self) -> float:
        """Seconds spent compiling rounds, over the decoder's life (reported apart from decoding)."""
        return self.programs.compile_s

    @property
    def _graphs(self) -> dict:
        """The captured / compiled programs by key (batch, max_len, sampling, span, verify length)."""
        return self.programs.programs

    @property
    def num_candidates(self) -> int:
        return self.proposer.num_candidates

    @property
    def signals_acceptance(self) -> bool:
        """Its proposer predicts each candidate's acceptance (a confidence head, the MTP's top-1): verify_length=auto
        applies to it."""
        return bool(self.proposer.signals_acceptance)

    @property
    def predicts_confidence(self) -> bool:
        """Its drafter predicts acceptance (DSpark): confidence-scheduled verification applies to it."""
        return bool(self.proposer.predicts_confidence)

    def info(self) -> dict:
        """How it decodes, for metrics.json's run record (dmtp.serving.base.Decoder)."""
        return {"runner": self.runner.kind, "attention": getattr(self.runner, "attention", None),
                "cuda_graphs": self.use_graphs, "compiled": self.compiled, "compile_s": self.compile_s}

    def close(self) -> None:
        """Nothing runs apart from this process: its caches go with the decoder."""

    @property
    def fixed_shapes(self) -> bool:
        """Graphs and compiled stages replay one program per shape: buckets of batch and cache length (and,
        for graphs, of the attended span).

        The eager path sizes everything exactly and attends the live span."""
        return self.use_graphs or self.compiled

    def replays_program(self, sampling: SamplingConfig) -> bool:
        """Whether rounds under `sampling` replay a captured / compiled program (else they run eagerly).

        Compiled stages are greedy only: a sampled stage reads the run's seeded torch.Generator, which dynamo does
        not trace, and a stage compiled in pieces makes dynamo skip that stage's code in every later compile of the
        process (other decoders, other shapes) without a word."""
        return self.use_graphs or (self.compiled and sampling.greedy)

    # -- state ---------------------------------------------------------------------------------------
    def _bucket(self, n: int) -> int:
        if not self.fixed_shapes:
            return n
        for b in self.batch_buckets:
            if b >= n:
                return b
        return n

    def _ensure_state(self, batch: int, need_len: int, max_new: int, sampling: SamplingConfig) -> DecodeState:
        self.proposer.set_sampling(sampling)   # before any capture: graphs are keyed by the sampling mode
        st = self.st
        reuse = (st is not None and st.batch == batch and st.max_len >= need_len and st.max_new_cap >= max_new
                 and st.sampling.uses_draft_probs == sampling.uses_draft_probs
                 and st.sampling.chooses_length == sampling.chooses_length)
        if reuse:
            st.sampling = sampling
            return st
        # Graphs: 256-slot steps, so that one capture serves most prompt lengths; compiled: 64 (inductor
        # attends over the whole cache); eager: exact to 16 (it attends over the live span anyway).
        max_len = _round_up(need_len, 256 if self.use_graphs else 64 if self.compiled else 16)
        max_new_cap = _round_up(max_new, 64) if self.fixed_shapes else max_new
        self.runner.allocate(batch, max_len)
        self.runner.span = None
        st = DecodeState(StateSize(batch, max_len, self.num_candidates, max_new_cap),
                         TargetWidths(self.vocab_size, self.runner.hidden_size, self.runner.feature_dim, self.device,
                                      self.dtype),
                         ProposerReads(self.proposer.needs_last_hidden, self.proposer.needs_features),
                         sampling, self.runner, self.eos_ids)
        self.proposer.allocate(st)
        self.st = st
        self._graphs.clear()
        return st

    def check_options(self, sampling: SamplingConfig) -> int | None:
        """One line for an option this proposer cannot honour; -> the fixed verify length (None: auto)."""
        if sampling.schedules_verification and not self.proposer.predicts_confidence:
            raise ValueError(f"confidence_threshold={sampling.confidence_threshold} needs a drafter with a "
                             f"confidence head (drafter=dspark); {self.proposer.name} predicts no acceptance")
        if sampling.chooses_length and not self.proposer.signals_acceptance:
            raise ValueError(f"verify_length=auto needs an acceptance signal (a drafter with a confidence head, "
                             f"drafter=dspark, or an MTP-led method); {self.proposer.name} has none")
        return sampling.fixed_length(self.num_candidates, self.proposer.name)

    def stages(self, st: DecodeState, length: int | None = None) -> list[Stage]:
        """The round's stages in order, each with the state it writes.

        Names: mtp, t1_fusion (slots for raw DFlash, which has no T1), drafter, verify. `length`: the candidates
        verified, L (None: the run's fixed length; K for verify_length=auto); L = 0 drafts nothing and verifies A
        alone, the proposer's state still follows the committed rows."""
        fixed = self.check_options(st.sampling)
        k = length if length is not None else fixed if fixed is not None else st.num_candidates
        verify = Stage("verify", lambda: self._verify(st, k), writes=self._verify_writes(st),
                       scratch=tuple(self.runner.scratch_state()))
        return (self.proposer.propose_stages(st) if k else []) + [verify] + self.proposer.advance_stages(st, k + 1)

    # -- the verify/accept stage ------------------------------------------------------------------
    def _verify(self, st: DecodeState, length: int) -> None:
        """Verify [A, c1..cL] (L = `length`, the rules of a block of L candidates) and commit the round, in the
        reference round's order (dmtp.decode.reference): the target's forward, the accepted prefix, the tokens
        committed to the output, the state advanced past them."""
        active = ~st.done   # the requests still decoding when the round starts
        out = self._target_forward(st, length)
        target_tokens, accepted, verified = self._accept(st, length, out.logits)
        kept, committed = self._commit(st, length, target_tokens, accepted, active)
        self._advance(st, length, out, target_tokens, kept, committed, active)
        self._record(st, length, accepted, kept, verified, active)

    def _target_forward(self, st: DecodeState, length: int):
        """The target over [A, c1..cL] at positions len..len+L, in one forward from its cache."""
        candidates = st.candidates[:, :length]
        tokens = torch.cat([st.anchor[:, None], candidates], dim=1) if length else st.anchor[:, None]
        return self.runner.verify(tokens, self.runner.lengths[:, None] + st.offsets[:length + 1])

    @staticmethod
    def _accept(st: DecodeState, length: int, logits: torch.Tensor):
        """(the target's token at every row [B, L+1], the accepted candidates [B], the candidates verified [B]).

        Greedy and target-only verification compare the target's token with each candidate; rejection and block
        verification weigh the candidates' draft probabilities (the token after the prefix is then a residual's)."""
        sampling = st.sampling
        candidates = st.candidates[:, :length]
        limit = st.verify_limit.clamp(max=length) if sampling.schedules_verification and length else None
        if sampling.uses_draft_probs and length:
            p = probs_from_logits(logits, sampling.temperature, sampling.top_k, sampling.top_p)
            accept = _ACCEPT_WITH_DRAFT_PROBS[sampling.verification]
            target_tokens, accepted = accept(candidates, st.q[:, :length], p, generator=st.generator, limit=limit)
        else:
            target_tokens = sample_tokens(logits, sampling.temperature, sampling.top_k, sampling.top_p,
                                          generator=st.generator)
            accepted = accept_target_only(candidates, target_tokens, limit)
        verified = limit if limit is not None else torch.full_like(st.verify_limit, length)
        return target_tokens, accepted, verified

    @staticmethod
    def _commit(st: DecodeState, length: int, target_tokens: torch.Tensor, accepted: torch.Tensor,
                active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append each active request's accepted prefix and the token after it to its output, cut after the
        first EOS and at its budget; a request that emitted EOS or filled its budget is done.

        -> (the candidates each request kept [B], the tokens it committed [B]: kept + 1, 0 when inactive)."""
        offsets = st.offsets[:length + 1]
        hit = (target_tokens[..., None] == st.eos).any(-1)
        first_eos = torch.where(hit, offsets, length + 1).amin(1)
        remaining = st.max_new - st.out_len
        kept = torch.minimum(torch.minimum(accepted, first_eos), remaining - 1).clamp_min(0)
        emit = (offsets[None] <= kept[:, None]) & active[:, None]
        idx = st.out_len[:, None] + offsets
        st.out_tokens.scatter_(1, idx, torch.where(emit, target_tokens, st.out_tokens.gather(1, idx)))
        committed = (kept + 1) * active
        st.out_len.add_(committed)
        finished = (hit & emit).any(1) | (st.out_len >= st.max_new)
        st.done.logical_or_(finished & active)
        return kept, committed

    def _advance(self, st: DecodeState, length: int, out, target_tokens: torch.Tensor, kept: torch.Tensor,
                 committed: torch.Tensor, active: torch.Tensor) -> None:
        """Past the committed rows: the next anchor (the last committed token), the target's cache length, and
        what the proposer's advance stages catch up from (the round's tokens, kept count, hidden states)."""
        rows = length + 1
        st.anchor.copy_(torch.where(active, target_tokens.gather(1, kept[:, None]).squeeze(1), st.anchor))
        st.round_start.copy_(self.runner.lengths)
        self.runner.advance(committed)
        st.target_tokens[:, :rows].copy_(target_tokens)
        st.kept.copy_(kept)
        if st.h_verify is not None:
            st.h_verify[:, :rows].copy_(out.last_hidden)
        if st.f_verify is not None:
            st.f_verify[:, :rows].copy_(out.layer_hidden)

    @staticmethod
    def _record(st: DecodeState, length: int, accepted: torch.Tensor, kept: torch.Tensor, verified: torch.Tensor,
                active: torch.Tensor) -> None:
        """The round's measurements: candidates verified, what verify_length=auto learns, the accepted lengths."""
        st.verified.add_(verified * active)
        if st.length_stats is not None and length:
            # verify_limit: the candidates a confidence threshold keeps (K without one)
            st.length_stats.accumulate(st.confidence.cumprod(-1), st.verify_limit, verified, accepted, active)
        r = st.round_idx.clamp(max=st.rounds_cap - 1)
        st.acc_log[r] = torch.where(active, kept, -1)[None]   # indexed assignments: in place when compiled too
        st.raw_log[r] = torch.where(active, accepted, -1)[None]
        st.round_idx.add_(1)

    def _verify_writes(self, st: DecodeState) -> tuple[torch.Tensor, ...]:
        """Everything `_verify` changes in place, and the runner's committed state that `advance` moves."""
        return (*present(st.out_tokens, st.out_len, st.done, st.anchor, st.round_start, st.target_tokens, st.kept,
                         st.verified, st.h_verify, st.f_verify, st.acc_log, st.raw_log, st.round_idx,
                         *(st.length_stats.tensors if st.length_stats is not None else ())), *self.runner.round_state())

    # -- prefill ------------------------------------------------------------------------------------
    def _prefill(self, st: DecodeState, prompts: list[list[int]], max_new: int) -> None:
        b = st.batch
        pad = self.eos_ids[0] if self.eos_ids else 0
        rows = prompts + [[pad]] * (b - len(prompts))
        t = max(len(p) for p in rows)
        ids = torch.full((b, t), pad, dtype=torch.long)
        for i, p in enumerate(rows):
            ids[i, :len(p)] = torch.tensor(p, dtype=torch.long)
        ids = ids.to(self.device)
        lengths = torch.tensor([len(p) for p in rows], dtype=torch.long, device=self.device)
        st.reset()
        st.max_new.fill_(max_new)
        self._set_span(st, t)
        st.longest_bound = t
        out = self.runner.prefill(ids, lengths, last_logits_only=True)
        s = st.sampling
        first = sample_tokens(out.logits, s.temperature, s.top_k, s.top_p, generator=st.generator)[:, 0]
        st.anchor.copy_(first)
        st.out_tokens[:, 0] = first
        st.out_len.fill_(1)
        padding = torch.arange(b, device=self.device) >= len(prompts)
        st.done.copy_(padding | (first[:, None] == st.eos).any(-1) | (st.out_len >= st.max_new))
        self.proposer.prefill(st, ids, lengths, out)

    # -- public API ---------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int = 64,
                 sampling: SamplingConfig | None = None, batch_size: int = 8, seed: int = 0,
                 progress: bool = False, **sampling_kwargs) -> DecodeResult:
        """Decode every prompt (lists of token ids) in static batches of `batch_size`.

        Output per request: up to `max_new_tokens` tokens (the prefill's token included), ending at the
        first EOS. Greedy output equals the target's own greedy decoding token for token."""
        sampling = _sampling_of(sampling, sampling_kwargs)
        prompts = _checked_prompts(prompts, max_new_tokens)
        out = _Gathered.for_requests(len(prompts))
        timer = self._make_timer()
        generator = self._seeded_generator(seed)
        bar = _progress(len(prompts), f"decode {self.proposer.name}", progress)
        compile_before, tables_before = self.compile_s, self.cost_table_s
        self._sync()
        t_start = time.perf_counter()
        for start in range(0, len(prompts), batch_size):
            ids = list(range(start, min(len(prompts), start + batch_size)))
            self._decode_batch(prompts, ids, max_new_tokens, sampling, batch_size, generator, timer, out)
            bar.update(len(ids))
        self._sync()
        compile_s = self.compile_s - compile_before   # compiling is not decoding: reported apart
        table_s = self.cost_table_s - tables_before   # nor is measuring verify_length=auto's cost tables
        wall = time.perf_counter() - t_start - compile_s - table_s
        bar.close()
        return self._result(out, prompts, sampling, wall, compile_s, table_s, timer)

    def _seeded_generator(self, seed: int) -> torch.Generator | None:
        if self.device.type == "cuda":
            torch.cuda.manual_seed(seed)  # graphs replay the default CUDA generator
            return None
        # One generator per decoder, reseeded per call: compiled stages keep reading the same object.
        if self._generator is None:
            self._generator = torch.Generator(device=self.device)
        return self._generator.manual_seed(seed)

    def _decode_batch(self, prompts: list[list[int]], ids: list[int], max_new_tokens: int,
                      sampling: SamplingConfig, batch_size: int, generator: torch.Generator | None,
                      timer: StageTimer | None, out: "_Gathered") -> None:
        """Prefill one static batch, run its rounds to the end, and gather each request's outputs."""
        chunk = [prompts[i] for i in ids]
        t_batch = time.perf_counter()
        # Graphs / compiled: one bucket for every chunk (a short last chunk gets padding rows) so
        # that the captured graphs are reused; eager: exactly the chunk's size.
        rows = self._bucket(batch_size) if self.fixed_shapes else len(chunk)
        st = self._ensure_state(rows, max(map(len, chunk)) + max_new_tokens + 6 * (self.num_candidates + 1) + 2,
                                max_new_tokens, sampling)
        st.generator = generator
        st.request_ids = ids + [ids[0]] * (st.batch - len(ids))
        self._prefill(st, chunk, max_new_tokens)
        self._sync()
        t_first = time.perf_counter() - t_batch
        out.prefill_s += t_first
        round_lengths = self._decode_rounds(st, max_new_tokens, timer)
        out_len = st.out_len.cpu().tolist()
        out_tok = st.out_tokens.cpu()
        n_rounds = min(int(st.round_idx.item()), st.rounds_cap)
        acc_log = st.acc_log[:n_rounds].cpu().T.tolist()
        raw_log = st.raw_log[:n_rounds].cpu().T.tolist()
        for row, i in enumerate(ids):
            out.ttft[i] = t_first
            out.tokens[i] = out_tok[row, :out_len[row]].tolist()
            out.accepted[i] = [a for a in acc_log[row] if a >= 0]
            out.accepted_raw[i] = [a for a in raw_log[row] if a >= 0]
            out.verify_lengths[i] = [n for n, a in zip(round_lengths, raw_log[row]) if a >= 0]
        out.verified += int(st.verified[:len(ids)].sum())
        out.batches += 1

    def _result(self, out: "_Gathered", prompts: list[list[int]], sampling: SamplingConfig, wall: float,
                compile_s: float, table_s: float, timer: StageTimer | None) -> DecodeResult:
        extra = {"runner": self.runner.kind, "cuda_graphs": self.use_graphs,
                 "compiled": self.compiled and sampling.greedy, "compile_s": compile_s,
                 "attention": getattr(self.runner, "attention", "hf"),
                 # candidates verified per round (K without confidence scheduling)
                 "verified_per_round": out.verified / max(1, sum(map(len, out.accepted_raw))),
                 **_length_summary(out.verify_lengths, sampling, table_s)}
        return DecodeResult(self.proposer.name, self.num_candidates, out.tokens, out.accepted, out.accepted_raw,
                            [len(p) for p in prompts], wall, out.prefill_s, out.ttft,
                            timer.ms_per_round() if timer is not None else {},
                            timer.counted_rounds if timer is not None else 0, out.batches, sampling,
                            extra=extra, verify_lengths=out.verify_lengths)

    # -- rounds ---------------------------------------------------------------------------------------
    def _make_timer(self) -> StageTimer | None:
        if not self.time_stages:
            return None
        return StageTimer(skip_rounds=self.warmup_rounds, device=self.device, use_cuda_events=self.use_graphs)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _set_span(self, st: DecodeState, longest: int) -> None:
        """Eager rounds attend over the caches' live span. `longest` = the longest committed length (a
        host value: the prompts' at prefill, one read of the lengths per round, free on CPU and no extra
        sync on CUDA eager, which polls `done` every round anyway).

        Every row a round writes or reads sits below longest + width + 1 (verify rows at L..L+K, MTP rows at
        L+1..L+K+1), so the span covers them all. Captured / compiled programs keep the whole caches (span None)."""
        self.runner.span = (None if self.replays_program(st.sampling)
                            else min(st.max_len, _round_up(longest + st.width + 1, SPAN_STEP)))

    def _graph_span(self, st: DecodeState, longest_bound: int) -> int | None:
        """The span bucket of a captured round whose longest committed length is at most `longest_bound`:
        the eager rule (every row below longest + width + 1) rounded up to `graph_span_step`.

        None: the whole caches (no graphs, or span buckets off)."""
        if not (self.use_graphs and self.graph_span_step):
            return None
        return min(st.max_len, _round_up(longest_bound + st.width + 1, self.graph_span_step))

    def _round_fn(self, st: DecodeState, timer, span: int | None = None,
                  length: int | None = None) -> Callable[[], None]:
        """One round of `st`'s batch verifying `length` candidates (None: the run's fixed length): the
        captured / compiled program of (`span`, `length`) (captured on first use; the runner's span is that
        program's whenever it runs, as its shapes were captured with it), else the stages eagerly over the
        live span. `timer`: anything with `.stage(name)` giving a context.

        A capture's warm-up passes advance the lengths past the bucket: their writes stay inside the caches (which
        have room for them), their reads are cut to the span, and the state is restored."""
        if self.replays_program(st.sampling):
            key = (st.batch, st.max_len, st.sampling.key(), span, length)
            self.runner.span = span   # a capture's shapes are the span's
            program = self.programs.get(key, lambda: self.stages(st, length), st.generator)

            def replay():
                self.runner.span = span
                program.replay(timer)

            return replay
        stages = self.stages(st, length)
        lengths = self.runner.lengths

        def run_round():
            self._set_span(st, int(lengths.max()))
            for stage in stages:
                with (timer.stage(stage.name) if timer is not None else contextlib.nullcontext()):
                    stage.run()

        return run_round

    def round_fn(self, timer=None) -> Callable[[], None]:
        """The last batch's round exactly as `generate` ran it, to run again (tools/bench/profile_decode.py profiles
        its kernels).

        Rounds past every request's end only rewrite scratch rows: nothing read back changes."""
        if self.st is None:
            raise RuntimeError("round_fn() needs a batch: call generate() first")
        return self._round_fn(self.st, timer, self.runner.span if self.use_graphs else None, self._last_length)

    def _decode_rounds(self, st: DecodeState, max_new: int, timer: StageTimer | None) -> list[int]:
        """The batch's rounds; -> the candidates each round verified (L per round)."""
        buckets = self._graph_span(st, 0) is not None
        known, since = st.longest_bound, 0   # host bound on the longest length: known + since x width
        fixed = self.check_options(st.sampling)
        policy = None if fixed is not None else self._length_policy(st, self._graph_span(st, known))
        schedule = LengthSchedule(fixed, policy, self.clock, self.length_readout_rounds)
        programs: dict = {}
        run_round, current = None, None
        for r in range(max_new + self.poll_every):
            span = self._graph_span(st, known + since * st.width)
            # outside the round's timer: a capture is not a round
            if run_round is None or (span, schedule.length) != current:
                current = (span, schedule.length)
                if current not in programs:
                    programs[current] = self._round_fn(st, timer, span, schedule.length)
                run_round = programs[current]
            with (timer.round() if timer is not None else contextlib.nullcontext()):
                run_round()
            since += 1
            self._last_length = schedule.length
            schedule.ran_round()
            if (r + 1) % self.poll_every == 0:
                finished = bool(st.done.all())
                schedule.at_poll(st, finished)   # the poll has synced: the rounds' record is a small read more
                if finished:
                    break
                if buckets:   # the poll has synced already: one more small read tightens the bound
                    known, since = int(self.runner.lengths.max()), 0
        return schedule.history

    def _length_policy(self, st: DecodeState, span: int | None) -> VerifyLengthPolicy:
        """verify_length=auto's policy for this batch shape and sampling mode: on first use, the cost table
        is measured on the live state (each L's round captured / compiled first where rounds replay a
        program), the state restored after every measured round; its seconds are reported apart."""
        key = (st.batch, st.sampling.key())
        policy = self._length_policies.get(key)
        if policy is None:
            t0 = time.perf_counter()
            rounds = [self._round_fn(st, None, span, length) for length in range(st.num_candidates + 1)]
            costs = measure_round_costs(rounds, state_reset(self.stages(st, st.num_candidates), st.generator),
                                        self._sync, reps=self.cost_table_reps, clock=self.clock)
            policy = self._length_policies[key] = VerifyLengthPolicy(costs)
            self.cost_table_s += time.perf_counter() - t0
        return policy


def _length_summary(lengths: list[list[int]], sampling: SamplingConfig, table_s: float) -> dict:
    """verify_length=auto's record for the summary: the share of request-rounds verified at each L, the
    mean L, and the seconds spent measuring cost tables (not part of the wall time)."""
    if not sampling.chooses_length:
        return {}
    counts: dict[int, int] = {}
    for rounds in lengths:
        for n in rounds:
            counts[n] = counts.get(n, 0) + 1
    total = max(1, sum(counts.values()))
    return {"verify_length_share": {str(n): counts[n] / total for n in sorted(counts)},
            "verify_length_mean": sum(n * c for n, c in counts.items()) / total, "cost_table_s": table_s}


def _progress(total: int, desc: str, enabled: bool):
    if enabled:
        try:
            from tqdm.auto import tqdm

            return tqdm(total=total, desc=desc, unit="req", leave=False)
        except ImportError:  # pragma: no cover
            pass

    class _Null:
        def update(self, n):
            pass

        def close(self):
            pass

    return _Null()


# ---------------------------------------------------------------------------------------------------
# method factory
# ---------------------------------------------------------------------------------------------------

def parse_mtp_steps(method: str, mtp_steps: int = 4) -> int:
    """How many steps the MTP chains per round for an MTP method: `mtp415` -> 4 (k=4, top-1, 5 verify
    slots), `mtp` -> `mtp_steps` (dmtp.infer's option), `mtp:<k>` -> k.

    Other names -> ValueError.

    The limit: 1 .. the widest block the loop verifies minus one (BLOCK_SIZE_RANGE, the same bound as a
    drafter's candidates). The native MTP is trained for one step (one layer predicting the token after
    next) and chained beyond it, so a long chain accepts little; it is still exact. A chain of 0
    proposes nothing (that is `ar`)."""
    if method == "mtp415":
        return 4
    if method == "mtp":
        steps, named = mtp_steps, f"mtp_steps={mtp_steps}"
    elif method.startswith("mtp:") and method[4:].isdigit():
        steps, named = int(method[4:]), f"method {method}"
    else:
        raise ValueError(f"not an MTP method name: {method!r}")
    most = BLOCK_SIZE_RANGE[1] - 1
    if type(steps) is not int or not 1 <= steps <= most:
        raise ValueError(f"{named}: the MTP chains 1..{most} steps per round (the widest verified block's "
                         f"candidates; the MTP itself is trained for one step and chained); use ar for no drafts")
    return steps


def build_proposer(method: str, target, mtp=None, drafter=None, mtp_steps: int = 4,
                   name: str | None = None, draft_vocab=None) -> Proposer:
    """method: ar | mtp415 | mtp | mtp:<k> | drafter (raw DFlash or any DMTP variant: a `BlockDrafter`,
    which carries its injection). `draft_vocab` (dmtp.models.draft_vocab.DraftVocab): the MTP's steps and the
    drafter's slots propose from that reduced vocabulary (None: the whole LM head); lossless in every mode.

    What each method's round runs is also what `dmtp.speed.recipe.round_recipe` prices: the same
    predicates (the injection's `mtp_fills_block`, `mtp_steps`, `uses_mtp`) decide both."""
    if method == "ar":
        return ARProposer()
    if method.startswith("mtp"):
        if mtp is None:
            raise ValueError(f"method {method!r} needs the target's native MTP")
        steps = parse_mtp_steps(method, mtp_steps)
        return MTPChainProposer(mtp, steps, name=name or method, draft_vocab=draft_vocab)
    if method == "drafter":
        if drafter is None:
            raise ValueError("method 'drafter' needs a drafter")
        if drafter.injection.mtp_fills_block and mtp is not None:
            # Every candidate is the MTP's (e.g. the sampled production method, m = K): the same candidates as the
            # drafter's round without its forward, from the MTP the drafter proposes with (its correction).
            return MTPChainProposer(drafter.proposing_mtp(mtp), drafter.num_candidates, name=name or "drafter",
                                    sampled_mtp=drafter.proposing_mtp(mtp, greedy=False), draft_vocab=draft_vocab)
        return DrafterProposer(drafter, target.embed_tokens.weight, target.lm_head.weight, mtp=mtp,
                               name=name or "drafter", draft_vocab=draft_vocab)
    raise ValueError(f"unknown method {method!r}: ar | mtp415 | mtp | mtp:<k> | drafter")


__all__ = ["SpecDecoder", "DecodeResult", "build_proposer", "parse_mtp_steps"]
