"""How a decode run picks tokens: greedy or sampled, the verification rule, confidence scheduling and the
verify length (`SamplingConfig`; one frozen record per run, part of the key of every captured round)."""
from __future__ import annotations

from dataclasses import dataclass


VERIFICATION_MODES = ("target_only", "rejection", "block")
# How many candidates a round verifies: all of them, one length per batch chosen from measured costs
# (dmtp/decode/verify_length/policy.py), or a fixed number (0 = no drafts verified: the target alone).
VERIFY_LENGTHS = ("full", "auto")
# The modes that verify drafts sampled from the proposers' q (the loop holds each one's acceptance rule).
DRAFT_PROB_MODES = ("rejection", "block")
# How a proposer drafts a slot when sampling with q (rejection, block): a sample from its q, or its argmax
# (q one-hot there, so min(1, p/q) = p and the residual is p without the draft: both rules are exact). Per
# slot source: the MTP's slots and the block drafter's slots each have their own.
DRAFT_RULES = ("sample", "argmax")


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 = greedy. `verification`: target_only (sample the target at every slot, accept
    while equal; drafts are the proposers' argmax), rejection (drafts sampled from the proposers' q,
    each accepted with min(1, p/q), token by token) or block (the same drafts verified jointly, Sun et
    al. 2025: on average never fewer accepted than rejection).

    Both accept more than target_only at temperature > 0, with the same output distribution; at temperature 0 every
    mode is greedy."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    verification: str = "target_only"
    # Confidence-scheduled verification (0 = off): each round verifies only the leading candidates whose
    # predicted survival (the product of the drafter's confidence up to them; DSpark's confidence head)
    # reaches this threshold; the others are masked (never accepted), the shapes stay the block's. Any
    # verification mode; lossless, since the cut depends on the drafts only, never on the target.
    confidence_threshold: float = 0.0
    # Candidates verified per round, one length L for the whole batch (the verify forward runs [A, c1..cL]:
    # its shape is L + 1 rows, one captured program per L): "full" (L = K, every candidate), "auto" (per
    # batch, the L that maximizes the expected tokens per second from a cost table measured once per batch
    # shape and the proposer's predicted acceptance, calibrated against the realized one; L = 0 turns
    # drafting off), or an integer 0..K. L is chosen before the round drafts, from earlier rounds only, so
    # verifying the shorter block with the rules of the shorter block is exact in every mode.
    verify_length: str | int = "full"
    # The draft rule of the MTP's slots and of the block drafter's slots under rejection/block verification
    # (DRAFT_RULES); target_only and greedy runs always draft the argmax.
    mtp_draft: str = "sample"
    block_draft: str = "sample"

    def __post_init__(self):
        if self.verification not in VERIFICATION_MODES:
            raise ValueError(f"verification must be one of {VERIFICATION_MODES}, got {self.verification!r}")
        if isinstance(self.confidence_threshold, bool) or not isinstance(self.confidence_threshold, (int, float)) \
                or not 0 <= self.confidence_threshold <= 1:
            raise ValueError(f"confidence_threshold must be in [0, 1] (0 = off), got {self.confidence_threshold!r}")
        if not (self.verify_length in VERIFY_LENGTHS or (type(self.verify_length) is int and self.verify_length >= 0)):
            raise ValueError(f"verify_length must be full, auto or an integer >= 0 (candidates verified per round), "
                             f"got {self.verify_length!r}")
        for name in ("mtp_draft", "block_draft"):
            if getattr(self, name) not in DRAFT_RULES:
                raise ValueError(f"draft_rule.{name.removesuffix('_draft')} must be one of {DRAFT_RULES}, "
                                 f"got {getattr(self, name)!r}")
        # Named as on the command line (dmtp.infer temperature= top_p= top_k=).
        if not self.temperature >= 0:   # also catches NaN
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1 = off), got {self.top_p}")
        if self.top_k != int(self.top_k) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k}")

    def check_vocabulary(self, vocab_size: int) -> None:
        """top_k larger than the target's vocabulary is refused, not clamped: it would silently mean
        "off" (every token kept), which the user did not write; 0 says that."""
        if self.top_k > vocab_size:
            raise ValueError(f"top_k={self.top_k} exceeds the target's vocabulary of {vocab_size} tokens; "
                             f"use top_k in 1..{vocab_size}, or 0 (off)")

    @property
    def greedy(self) -> bool:
        """A temperature > 0, however small, samples (dmtp.models.temperature scales it without overflow:
        a tiny one is the greedy one-hot, the limit of softmax(x / T))."""
        return self.temperature <= 0.0

    @property
    def uses_draft_probs(self) -> bool:
        return self.verification in DRAFT_PROB_MODES and not self.greedy

    def draft_rule(self, source: str) -> str:
        """The rule a slot of `source` ("mtp" or "block") drafts with: "argmax" unless q is sampled from."""
        return getattr(self, f"{source}_draft") if self.uses_draft_probs else "argmax"

    @property
    def schedules_verification(self) -> bool:
        return self.confidence_threshold > 0

    @property
    def chooses_length(self) -> bool:
        """The verify length is chosen per batch from measured costs (verify_length=auto)."""
        return self.verify_length == "auto"

    def fixed_length(self, num_candidates: int, method: str = "the proposer") -> int | None:
        """The verify length of every round for `method`, a proposer of `num_candidates` (None: chosen per batch);
        a fixed length above K is refused in one line naming the method (one length holds for every method)."""
        if self.verify_length == "auto":
            return None
        if self.verify_length == "full":
            return num_candidates
        if self.verify_length > num_candidates:
            raise ValueError(f"verify_length={self.verify_length} exceeds the {num_candidates} candidates {method} "
                             f"drafts per round (one verify_length holds for every method run); use "
                             f"0..{num_candidates}, full or auto, or leave {method} out of methods")
        return self.verify_length

    def key(self) -> tuple:
        return (float(self.temperature), int(self.top_k), float(self.top_p), self.verification,
                float(self.confidence_threshold), str(self.verify_length), self.mtp_draft, self.block_draft)


def draft_rules(rule) -> dict:
    """`draft_rule: {mtp: sample|argmax, block: sample|argmax}` (either may be left out) -> SamplingConfig's fields."""
    rule = dict(rule or {})
    unknown = set(rule) - {"mtp", "block"}
    if unknown:
        raise ValueError(f"draft_rule: unknown slot source {sorted(unknown)[0]!r} (mtp, block)")
    return {f"{source}_draft": str(value) for source, value in rule.items()}


__all__ = ["DRAFT_PROB_MODES", "DRAFT_RULES", "SamplingConfig", "VERIFICATION_MODES", "VERIFY_LENGTHS", "draft_rules"]
