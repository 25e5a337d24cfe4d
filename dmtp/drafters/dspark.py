"""DSpark block drafter: DFlash's block-parallel backbone plus a Markov head and a confidence head.

Backbone, context path, masks, block layout and checkpoint format are DFlash's (`dmtp.drafters.dflash`);
this file is the whole architecture: its config fields and their checks (`DSparkConfig`), its heads, and
its registration (`architecture=dspark`; published as vLLM's dense DSpark, `Qwen3DSparkModel`). Facts:
reference/dspark.md (DeepSeek's report, vLLM 0.32's `qwen3_dspark.py` for the tensor names).

* Markov head (rank r = `markov_rank`): `markov_w1` [V, r] embeds the token before a predicted slot,
  `markov_w2` [V, r] projects r -> V; the logit bias of slot i with predecessor x_{i-1} is
      vanilla: b_i = W2 e_i,                     e_i = W1[x_{i-1}]
      gated:   b_i = W2 (e_i * sigmoid(G h_i))   G = `markov_gate` [r, H], h_i the backbone hidden
      rnn:     b_i = W2 s_i,  s_i = tanh(W1[x_{i-1}] + R s_{i-1}),  s_0 = 0,  R = `markov_recurrence` [r, r]
  added to the backbone's logits. W2 starts at zero, so a fresh DSpark drafter is exactly DFlash
  (and `init_from` a DFlash drafter keeps its function at step 0). The slot's predecessor is the token
  just before it: in decoding the token the drafter itself proposed there (for the first predicted
  slot: A for raw DFlash, T1 for a DMTP variant, whatever the injection's `previous_token` says); in
  training the gold token (teacher forcing, `block_logits`).
* Confidence head: `confidence_head.proj` maps [h_i ; m_i] (m_i = e_i, or s_i for rnn; only h_i without
  `confidence_with_markov`) to a logit of P(slot i accepted | its predecessor accepted). Trained
  (`auxiliary_loss`) with BCE against whether the slot's greedy proposal equals its label, weighted by
  the same position decay as the block loss, times `confidence_loss_weight`.

Decoding (`propose`) is sequential over the block: each slot's scores are the backbone's logits plus the
bias from the token just proposed, and the sampler (argmax, or the loop's sampler at T > 0) picks from
those scores; q returned is exactly the distribution each candidate was drawn from, as rejection
sampling needs. The loop is over a fixed number of slots (a shape): no host sync, capturable.

Export: vLLM 0.32 serves `"method": "dspark"` with `Qwen3DSparkModel` drafters whose Markov head is
vanilla (`markov_head_type`, its names `markov_head.markov_w1.weight`, `markov_head.markov_w2.weight`,
`confidence_head.proj.{weight,bias}`; `sample_from_anchor: false` is DFlash's [A, MASK...] layout). The
gated and rnn variants add `markov_head.markov_gate.weight` / `markov_head.markov_recurrence.weight`,
which vLLM's dense DSpark does not read.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from dmtp.drafters.dflash import DFlashConfig, DFlashDrafter, default_sampler
from dmtp.drafters.registry import register_drafter

DSPARK_ARCH = "Qwen3DSparkModel"
MARKOV_VARIANTS = ("vanilla", "gated", "rnn")
# Written at config.json's top level (where vLLM's DSpark reads them) and read back from there.
SHAPE_KEYS = ("markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov")
# Training only (never written to an export; read from older dmtp exports that carry it, else the default).
TRAINING_KEYS = ("confidence_loss_weight",)


@dataclass
class DSparkConfig(DFlashConfig):
    """DSpark's own fields; defaults are a fresh drafter's (conf/drafter/dspark.yaml repeats them)."""
    markov_rank: int = 32
    markov_head_type: str = "vanilla"       # vanilla | gated | rnn
    enable_confidence_head: bool = True
    confidence_head_with_markov: bool = True
    confidence_loss_weight: float = 1.0
    training_options: ClassVar[tuple[str, ...]] = TRAINING_KEYS

    def check_options(self) -> None:
        for k in (*SHAPE_KEYS, *TRAINING_KEYS):
            if getattr(self, k) is None:
                setattr(self, k, next(f.default for f in fields(self) if f.name == k))
        if type(self.markov_rank) is not int or self.markov_rank < 1:
            raise ValueError(f"markov_rank must be an integer >= 1 (DFlash is drafter=dflash), got {self.markov_rank!r}")
        if self.markov_head_type not in MARKOV_VARIANTS:
            raise ValueError(f"markov_head_type must be one of {', '.join(MARKOV_VARIANTS)}, "
                             f"got {self.markov_head_type!r}")
        for k in ("enable_confidence_head", "confidence_head_with_markov"):
            if getattr(self, k) not in (True, False):
                raise ValueError(f"{k} must be true or false, got {getattr(self, k)!r}")
        if isinstance(self.confidence_loss_weight, bool) or not isinstance(self.confidence_loss_weight, (int, float)) \
                or not self.confidence_loss_weight >= 0:
            raise ValueError(f"confidence_loss_weight must be a number >= 0, got {self.confidence_loss_weight!r}")
        self.confidence_loss_weight = float(self.confidence_loss_weight)

    def options_to_hf(self) -> dict:
        return {k: getattr(self, k) for k in SHAPE_KEYS}

    def to_hf_config(self) -> dict:
        d = super().to_hf_config()
        # vLLM's DSpark reads its fields at the top level; [A, MASK...] with A the bonus token.
        d.update({k: getattr(self, k) for k in SHAPE_KEYS}, sample_from_anchor=False)
        return d

    @classmethod
    def options_from_hf(cls, pick) -> dict:
        if pick("markov_rank") is None:
            raise ValueError(f"{DSPARK_ARCH} config lacks markov_rank")
        options = {k: pick(k) for k in (*SHAPE_KEYS, *TRAINING_KEYS)}
        # A published config that does not name them means what vLLM reads there: no confidence head,
        # a head on the hidden alone (dmtp writes both, so its own exports round-trip either way).
        for k in ("enable_confidence_head", "confidence_head_with_markov"):
            options[k] = bool(options[k]) if options[k] is not None else False
        return options


class MarkovHead(nn.Module):
    """W1 [V, r] (`markov_w1`), W2 [V, r] (`markov_w2`), and the variant's gate or recurrence."""

    def __init__(self, vocab_size: int, rank: int, hidden_size: int, variant: str):
        super().__init__()
        self.variant = variant
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)
        if variant == "gated":
            self.markov_gate = nn.Linear(hidden_size, rank, bias=False)
        if variant == "rnn":
            self.markov_recurrence = nn.Linear(rank, rank, bias=False)
        if not self.markov_w1.weight.is_meta:
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """W1 ~ N(0, 1) (an embedding: unit-scale codes, so W2 learns at once), W2 = 0 (a fresh head adds
        no bias: DFlash exactly), gate and recurrence ~ N(0, 0.02)."""
        nn.init.normal_(self.markov_w1.weight)
        nn.init.zeros_(self.markov_w2.weight)
        for name in ("markov_gate", "markov_recurrence"):
            if hasattr(self, name):
                nn.init.normal_(getattr(self, name).weight, std=0.02)

    def step(self, prev: torch.Tensor, hidden: torch.Tensor, state: torch.Tensor | None):
        """One slot: prev [...], hidden [..., H], state [..., r] or None (slot 1) -> (code m [..., r], bias [..., V]).
        m is the slot's Markov code: e (vanilla), e * gate (gated) or the new state s (rnn)."""
        e = self.markov_w1(prev)
        if self.variant == "gated":
            e = e * torch.sigmoid(self.markov_gate(hidden.to(e.dtype)))
        elif self.variant == "rnn":
            e = torch.tanh(e if state is None else e + self.markov_recurrence(state))
        return e, self.markov_w2(e)

    def codes(self, prev_tokens: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Teacher-forced codes of every slot: prev_tokens [..., n], hidden [..., n, H] -> [..., n, r]."""
        if self.variant != "rnn":
            return self.step(prev_tokens, hidden, None)[0]
        state, out = None, []
        for i in range(prev_tokens.shape[-1]):
            state, _ = self.step(prev_tokens[..., i], hidden[..., i, :], state)
            out.append(state)
        return torch.stack(out, dim=-2)


class ConfidenceHead(nn.Module):
    """`proj`: [h ; m] (or h) -> one logit of acceptance."""

    def __init__(self, input_dim: int):
        super().__init__()
        self.proj = nn.Linear(input_dim, 1, bias=True)
        if not self.proj.weight.is_meta:
            nn.init.zeros_(self.proj.weight)   # starts at P = 0.5 everywhere
            nn.init.zeros_(self.proj.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).squeeze(-1)


@register_drafter(name="dspark", published=DSPARK_ARCH, dmtp_published="DMTPDSparkDraftModel", config=DSparkConfig)
class DSparkDrafter(DFlashDrafter):
    """DSpark: DFlash layers + `markov_head` + `confidence_head` (optional); same inputs and layout."""

    auxiliary_loss_name = "confidence_loss"
    tensor_prefixes = (*DFlashDrafter.tensor_prefixes, "markov_head.", "confidence_head.")

    def __init__(self, config: DSparkConfig):
        if not isinstance(config, DSparkConfig):
            raise ValueError(f"DSparkDrafter needs a DSparkConfig, got {type(config).__name__}")
        super().__init__(config)
        c = config
        self.markov_head = MarkovHead(c.vocab_size, c.markov_rank, c.hidden_size, c.markov_head_type)
        if c.enable_confidence_head:
            self.confidence_head = ConfidenceHead(c.hidden_size + (c.markov_rank if c.confidence_head_with_markov else 0))
        else:
            self.confidence_head = None

    # -- the heads on teacher-forced predecessors (training, and the confidence of proposed blocks) ------
    def block_logits(self, hidden, lm_head_weight, prev_tokens):
        codes = self.markov_head.codes(prev_tokens, hidden)
        return self.logits(hidden, lm_head_weight) + self.markov_head.markov_w2(codes).to(hidden.dtype)

    def _confidence_logit(self, hidden: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        x = torch.cat([hidden, codes.to(hidden.dtype)], -1) if self.config.confidence_head_with_markov else hidden
        return self.confidence_head(x)

    @property
    def has_confidence(self) -> bool:
        return self.confidence_head is not None

    def confidence(self, hidden, prev_tokens):
        if self.confidence_head is None:
            return None
        return torch.sigmoid(self._confidence_logit(hidden, self.markov_head.codes(prev_tokens, hidden)).float())

    def auxiliary_loss(self, hidden, lm_head_weight, labels, prev_tokens, weights, step=None, logits=None):
        """confidence_loss_weight * sum w * BCE(confidence, 1[greedy proposal == label]) / sum w (0 without the head)."""
        if self.confidence_head is None or self.config.confidence_loss_weight == 0.0:
            return torch.zeros((), device=hidden.device)
        if logits is None:
            logits = self.block_logits(hidden, lm_head_weight, prev_tokens)
        accepted = (logits.argmax(-1) == labels).float()           # measured: greedy verification's rule
        codes = self.markov_head.codes(prev_tokens, hidden)
        bce = F.binary_cross_entropy_with_logits(self._confidence_logit(hidden, codes).float(), accepted,
                                                 reduction="none")
        w = weights.float()
        return self.config.confidence_loss_weight * (bce * w).sum() / w.sum().clamp(min=1e-6)

    # -- decoding: sequential in the previous token --------------------------------------------------------
    def propose(self, hidden, lm_head_weight, first_prev, temperature=0.0, generator=None, sampler=None,
                forced=None, vocab=None):
        """Slot by slot: scores = backbone logits + Markov bias of the token just proposed; `sampler`
        picks (see DFlashDrafter.propose). hidden [..., n, H], first_prev [...] -> (tokens [..., n],
        q [..., n, V] or None): q[i] is the distribution candidate i was drawn from given candidates < i.
        `forced` slots (the MTP's tokens of the multi-step variant) enter the chain as they are."""
        sampler = sampler or default_sampler(temperature, generator)
        return markov_walk(self.markov_head, self.logits(hidden, lm_head_weight, vocab), hidden, first_prev, sampler,
                           forced)


def markov_walk(markov_head: MarkovHead, base: torch.Tensor, hidden: torch.Tensor, first_prev: torch.Tensor,
                sampler, forced=None):
    """DSpark's sequential draft, the one rule dmtp's loop and its vLLM proposer run.

    Slot i's scores are the backbone's logits `base` [..., n, V] plus the Markov bias of the token before it
    (`first_prev` [...] for slot 1, then the token picked at i - 1); `sampler(scores)` -> (token, q or None)
    picks. `forced` (tokens, use) [..., n]: slots whose token is given (the MTP's, in the multi-step variant),
    which the chain walks through. -> (tokens [..., n], q [..., n, V] or None)."""
    prev, state = first_prev, None
    tokens, qs = [], []
    for i in range(hidden.shape[-2]):
        state, bias = markov_head.step(prev, hidden[..., i, :], state)
        pick, p = sampler(base[..., i, :] + bias.to(base.dtype))
        if p is not None:
            qs.append(p)
        if forced is not None:   # the block holds the MTP's token here: the chain goes through it
            pick = torch.where(forced[1][..., i], forced[0][..., i], pick)
        prev = pick
        tokens.append(pick)
    return torch.stack(tokens, dim=-1), (torch.stack(qs, dim=-2) if qs else None)


__all__ = ["ConfidenceHead", "DSPARK_ARCH", "DSparkConfig", "DSparkDrafter", "MARKOV_VARIANTS", "MarkovHead",
           "markov_walk"]
