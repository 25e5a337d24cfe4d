"""What one decoding round of a method runs, as the stages a speed profile prices (`RoundRecipe.stages`).

The one rule, read from the method's own config, never from a table of method names: the decoding loop's
`build_proposer` (dmtp.decode.loop) decides what a round runs from the same predicates this module reads.

* `ar`: the target verifies one row.
* `mtp415`, `mtp`, `mtp:<k>`: k chained MTP steps (k heads, k - 1 MTP rows after the first, which reads the
  cached hidden), the target verifies k + 1 rows, the MTP catches up on them.
* `drafter` (a `BlockDrafter`, its directory, or its config.json as a dict): its injection says how many MTP
  steps a round chains (`mtp_steps`), whether the MTP's chain fills the whole block so that no block forward runs
  (`mtp_fills_block`: the production, m = 7), whether it uses the MTP at all (raw DFlash: no); its backbone says
  the architecture (DFlash, DSpark: Markov head and confidence head, DFlash2: conv and selector), the layers,
  the tapped target layers (its context width) and the block; its config the MTP correction's rank, which runs on
  every MTP step it proposes with.
* a draft vocabulary (dmtp.models.draft_vocab) replaces every drafting head's full-vocabulary head by one over
  its V tokens: the MTP steps' and the block drafter's.

The profile keys (`dmtp.speed.profile`; `python -m dmtp.bench.speed_profile` measures each):

    verify/r<n>          the loop's verify stage over n rows (the target forward, acceptance, commit); AR = r1
    head/full/r<n>       the target's LM head on n rows per request and the pick (an MTP step's head: r1)
    head/v<V>/r<n>       the same over a draft vocabulary of V tokens (and the scatter back)
    mtp/step             one chained MTP row (its fusion, decoder layer and norm), no head
    mtp/correction       the MTP correction on one row per request
    mtp/catch_up/r<n>    the MTP's rows over the n verified rows (every method holding an MTP state)
    slots/raw            raw DFlash's block slots; fusion/t1: the slots with the MTP's tokens injected
    drafter/b<B>         a 1-layer, 1-tap DFlash drafter's stage at block B (the block forward, its head over
                         B - 1 slots, the context append of the verified rows)
    drafter/b<B>/layer   each further drafter layer; drafter/b<B>/tap: each further tapped target layer
    dspark/b<B>/markov   DSpark's Markov head over the block; dspark/b<B>/confidence: its confidence head
    dflash2/b<B>/selector  DFlash2's conv and selector over the block
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

FULL = "full"


def head_key(vocab: int | None, rows: int) -> str:
    return f"head/{FULL if vocab is None else f'v{vocab}'}/r{rows}"


@dataclass(frozen=True)
class BlockForward:
    """The block drafter's forward of a round."""
    architecture: str        # dflash | dspark | dflash2
    block_size: int          # B
    layers: int
    taps: int                # context features per position, in hidden widths (tapped layers, + the MTP's)
    predicted: int           # slots through the drafter's head
    confidence: bool = False  # DSpark's confidence head


@dataclass(frozen=True)
class RoundRecipe:
    """What one round of `method` runs (see the module docstring); `stages()` lists the profile keys it reads."""
    method: str
    verify_rows: int
    mtp_steps: int = 0              # chained MTP proposals per round
    mtp_catch_up: bool = False      # the MTP's state follows the verified rows
    mtp_correction: bool = False    # the correction runs on every MTP step
    slots: str | None = None        # raw | fusion (the block's slot build), None without a block
    block: BlockForward | None = None
    draft_vocab: int | None = None  # V of the drafting heads (None: the whole vocabulary)
    notes: tuple[str, ...] = field(default_factory=tuple)

    def stages(self) -> list[tuple[str, int]]:
        """(profile key, times per round); a negative count takes out what a composite key holds (the 1-layer
        drafter's full head when the block drafter's head differs)."""
        out: list[tuple[str, int]] = [(f"verify/r{self.verify_rows}", 1)]
        if self.mtp_steps:
            out.append((head_key(self.draft_vocab, 1), self.mtp_steps))
            if self.mtp_steps > 1:
                out.append(("mtp/step", self.mtp_steps - 1))
            if self.mtp_correction:
                out.append(("mtp/correction", self.mtp_steps))
        if self.mtp_catch_up:
            out.append((f"mtp/catch_up/r{self.verify_rows}", 1))
        if self.slots:
            out.append(("slots/raw" if self.slots == "raw" else "fusion/t1", 1))
        b = self.block
        if b is not None:
            base = f"drafter/b{b.block_size}"
            out.append((base, 1))
            if b.layers > 1:
                out.append((f"{base}/layer", b.layers - 1))
            if b.taps > 1:
                out.append((f"{base}/tap", b.taps - 1))
            measured_rows = b.block_size - 1   # the head inside drafter/b<B> (raw DFlash's slots)
            if self.draft_vocab is not None or b.predicted != measured_rows:
                out += [(head_key(None, measured_rows), -1), (head_key(self.draft_vocab, b.predicted), 1)]
            if b.architecture == "dspark":
                out.append((f"dspark/b{b.block_size}/markov", 1))
                if b.confidence:
                    out.append((f"dspark/b{b.block_size}/confidence", 1))
            elif b.architecture == "dflash2":
                out.append((f"dflash2/b{b.block_size}/selector", 1))
        return out

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RoundRecipe":
        d = dict(d)
        block = d.pop("block", None)
        d["notes"] = tuple(d.get("notes") or ())
        return cls(**d, block=BlockForward(**block) if block else None)

    def describe(self) -> str:
        """One line: what a round runs."""
        parts = [f"verify {self.verify_rows} rows"]
        if self.mtp_steps:
            head = "" if self.draft_vocab is None else f" (head over {self.draft_vocab} tokens)"
            parts.append(f"{self.mtp_steps} MTP step{'s' if self.mtp_steps > 1 else ''}{head}"
                         + (" + correction" if self.mtp_correction else ""))
        if self.block is not None:
            b = self.block
            parts.append(f"{b.architecture} block {b.block_size}, {b.layers} layer{'s' if b.layers > 1 else ''}, "
                         f"{b.taps} tap{'s' if b.taps > 1 else ''}" + (", confidence head" if b.confidence else ""))
        return "; ".join(parts)


# ----------------------------------------------------------------------------------------------------------------
# the rule
# ----------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DrafterFacts:
    """What a drafter's round depends on, from a live drafter or its saved config."""
    injection: object                 # the injection module (its layout predicates)
    architecture: str
    layers: int
    block_size: int
    confidence: bool
    correction_rank: int
    correction_greedy_only: bool
    hidden_size: int


def drafter_facts(drafter) -> DrafterFacts:
    """From a `BlockDrafter`, a drafter directory, or a drafter's config.json as a dict (`DrafterFacts` as is)."""
    if isinstance(drafter, DrafterFacts):
        return drafter
    if isinstance(drafter, (str, Path)):
        drafter = json.loads((Path(drafter) / "config.json").read_text())
    if isinstance(drafter, dict):
        return _facts_of_config(drafter)
    from dmtp.drafters.registry import ARCHITECTURES

    c = drafter.config
    correction = getattr(drafter, "mtp_correction", None)
    return DrafterFacts(drafter.injection, ARCHITECTURES[c.architecture].name if c.architecture in ARCHITECTURES
                        else "dflash", c.num_hidden_layers, drafter.injection.block_size,
                        bool(getattr(drafter, "has_confidence", False)), drafter.mtp_correction_rank,
                        bool(correction is not None and correction.greedy_only), c.hidden_size)


def _facts_of_config(raw: dict) -> DrafterFacts:
    """A saved drafter's config.json: its backbone config and its "dmtp" section (the injection is built at a
    width of 8: its layout does not depend on the width)."""
    from dmtp.drafters.dflash import DFlashConfig
    from dmtp.drafters.registry import ARCHITECTURES
    from dmtp.injection.catalogue import make_injection

    config = DFlashConfig.from_hf_config(raw)
    meta = raw.get("dmtp") or {}
    name = meta.get("injection", "raw_dflash")
    injection = make_injection(name, 8, len(config.target_layer_ids), 0, config.block_size,
                               **(meta.get("injection_kwargs") or {}))
    arch = ARCHITECTURES[config.architecture].name if config.architecture in ARCHITECTURES else "dflash"
    return DrafterFacts(injection, arch, config.num_hidden_layers, config.block_size,
                        bool(getattr(config, "enable_confidence_head", False)) and arch == "dspark",
                        int(meta.get("mtp_correction_rank", 0) or 0), bool(meta.get("mtp_correction_greedy_only")),
                        config.hidden_size)


def round_recipe(method: str, drafter=None, draft_vocab: int | None = None, mtp_steps: int = 4,
                 sampled: bool = False) -> RoundRecipe:
    """The round of `method` (ar | mtp415 | mtp | mtp:<k> | drafter, as dmtp.infer names them; a drafter's table
    label, e.g. `dual_anchor_zero_init`, with `drafter` given, counts as drafter) with `draft_vocab` tokens in its
    drafting heads. `sampled`: decoding at temperature > 0 (a correction trained on greedy tokens only is then off,
    as `BlockDrafter.proposing_mtp` decides)."""
    from dmtp.decode.loop import parse_mtp_steps

    if method == "ar":
        return RoundRecipe("ar", 1)
    if method.startswith("mtp") and (method in ("mtp", "mtp415") or method[4:].isdigit()):
        k = parse_mtp_steps(method, mtp_steps)
        return RoundRecipe(method, k + 1, mtp_steps=k, mtp_catch_up=True, draft_vocab=draft_vocab)
    if drafter is None:
        raise ValueError(f"the round of {method!r} needs its drafter (a BlockDrafter, its directory or its "
                         f"config.json): ar | mtp415 | mtp | mtp:<k> need none")
    f = drafter_facts(drafter)
    inj = f.injection
    correction = f.correction_rank > 0 and not (sampled and f.correction_greedy_only)
    k = inj.num_candidates
    if inj.mtp_fills_block:   # the MTP's chain is the whole block: no drafter forward (build_proposer)
        return RoundRecipe(method, k + 1, mtp_steps=k, mtp_catch_up=True, mtp_correction=correction,
                           draft_vocab=draft_vocab, notes=("the MTP's chain fills the block: no block forward",))
    steps = inj.mtp_steps
    taps = inj.context_dim // inj.hidden_size
    block = BlockForward(f.architecture, f.block_size, f.layers, taps, inj.num_drafter_candidates, f.confidence)
    return RoundRecipe(method, k + 1, mtp_steps=steps, mtp_catch_up=inj.needs_mtp,
                       mtp_correction=correction and steps > 0, slots="fusion" if steps else "raw", block=block,
                       draft_vocab=draft_vocab)


__all__ = ["BlockForward", "DrafterFacts", "RoundRecipe", "drafter_facts", "head_key", "round_recipe"]
