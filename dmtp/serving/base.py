"""What every serving engine gives dmtp: a `Decoder` (decode prompts, report like dmtp's loop) and, for
regeneration, a writer (the target alone writes responses); an `Engine` is one registration of both.

The comparison (dmtp.inference), regeneration (dmtp.datagen.regenerate) and the benches read only
what is declared here, so an engine is one file in this package plus its line in `catalogue.py`.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Decoder(Protocol):
    """One method decoded by one engine. `generate` returns a `dmtp.decode.loop.DecodeResult` (tokens,
    accepted drafts per round before and after the EOS / budget cut, times), so the report, the
    comparisons and metrics.json are the same whatever decoded."""

    # Draft candidates per round (0: the target alone); the block verified is 1 + this.
    num_candidates: int
    # Warm up at the measured shapes (graphs, compiled stages) rather than with a short batch.
    fixed_shapes: bool
    # Its drafter predicts acceptance (DSpark's confidence head): confidence-scheduled verification applies.
    predicts_confidence: bool
    # Its proposer predicts each candidate's acceptance (a confidence head, the MTP's top-1): verify_length=auto
    # applies.
    signals_acceptance: bool

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int = 64, sampling=None,
                 batch_size: int = 8, seed: int = 0, progress: bool = False): ...

    def info(self) -> dict:
        """metrics.json's run record of how it decodes: runner, attention, cuda_graphs, compiled, compile_s."""
        ...

    def close(self) -> None:
        """Stop what it runs apart (an engine's processes); the run goes on in this process."""
        ...


class Writer(Protocol):
    """The target alone writing responses (regeneration): `.generate(...).tokens`, then `close()`."""

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, sampling, batch_size: int = 0,
                 seed: int = 0): ...

    # close() where it runs something apart (regeneration calls it when the writer has one)


@dataclass
class DecoderRequest:
    """What `dmtp.infer` loaded, for an engine to build its decoders from. `target` and `drafter` are
    dmtp.inference.setup's LoadedTarget / LoadedDrafter (None: no drafter); `named`: the methods asked for
    by name (a method the engine cannot run is an error for those, a skipped line for the others)."""
    methods: list[str]
    named: set[str]
    target: Any
    drafter: Any
    mtp: Any
    dtype: Any                 # torch.dtype
    options: dict = field(default_factory=dict)   # the engine's own, from `Engine.options(cfg)`
    # The drafting heads' reduced vocabulary (dmtp.models.draft_vocab.DraftVocab; None: the whole head): dmtp's loop
    # only (dmtp.infer refuses it with another engine)
    draft_vocab: Any = None


@dataclass(frozen=True)
class Engine:
    name: str                  # engine=<name> (dmtp.infer), data.regen_engine=<name> (training)
    title: str                 # how messages name it
    # dmtp.infer's config -> this engine's own options (its keys in conf/infer.yaml).
    options: Callable[[Any], dict]
    # DecoderRequest -> {label: Decoder}; vLLM-like engines import their package inside, never at import time.
    decoders: Callable[[DecoderRequest], dict]
    # (target model, method, eos ids, mtp, engine options) -> Writer; None: it cannot regenerate.
    writer: Callable[..., Writer] | None = None
    regen_methods: tuple[str, ...] = ()   # the methods its writer decodes with
    # () -> None, or one line (a ValueError) where the package it runs on is not installed: asked before anything loads
    require_installed: Callable[[], None] | None = None


def plain_dict(node) -> dict:
    """An OmegaConf node, a dict or None as a plain dict (engine options pass through to the engine as given)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node or {})


__all__ = ["Decoder", "Writer", "DecoderRequest", "Engine", "plain_dict"]
