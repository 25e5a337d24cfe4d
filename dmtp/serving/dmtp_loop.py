"""dmtp's own decoding loop (`SpecDecoder`, dmtp.decode) as an engine: every method (ar, mtp415, mtp:<k>,
drafter) in this process, and the regeneration writer (ar or mtp415)."""
from __future__ import annotations

from collections.abc import Sequence

from dmtp.decode.loop import SpecDecoder
from dmtp.serving.base import DecoderRequest, Engine
from dmtp.families.decoding import build_decoder   # the one way a loop decoder is built (tests/test_one_setup_loader.py)


def options(cfg) -> dict:
    """The loop's options in conf/infer.yaml (top-level keys: they predate engines)."""
    return dict(mtp_steps=cfg.mtp_steps, runner=cfg.runner, attention=cfg.attention, cuda_graphs=cfg.cuda_graphs,
                compile=cfg.get("compile", False), warmup_rounds=cfg.warmup_rounds)


def decoders(request: DecoderRequest) -> dict[str, SpecDecoder]:
    """Every method: the loop runs them all (the drafter with the MTP it decodes with, its own tuned one or the
    target's)."""
    target, drafter = request.target, request.drafter
    out = {}
    for m in request.methods:
        label = drafter.label if m == "drafter" else m
        out[label] = build_decoder(target.model, m, target.eos_token_id,
                                   mtp=drafter.mtp if m == "drafter" else request.mtp,
                                   drafter=drafter and drafter.model, name=label, draft_vocab=request.draft_vocab,
                                   **request.options)
    return out


def writer(target, method: str, eos_ids: Sequence[int], mtp=None, engine_args: dict | None = None) -> SpecDecoder:
    """The loop with `method`, untimed, with CUDA graphs where there is CUDA (regeneration decodes at scale)."""
    return build_decoder(target, method, list(eos_ids), mtp=mtp, time_stages=False,
                         cuda_graphs=target.device.type == "cuda")


ENGINE = Engine(name="dmtp", title="dmtp's loop", options=options, decoders=decoders, writer=writer,
                regen_methods=("ar", "mtp415"))
