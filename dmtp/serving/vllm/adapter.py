"""vLLM as an engine (dmtp.serving: vllm_decoder.py decodes, regen_vllm.py writes). vLLM is imported only
when an engine starts, so this file loads where vLLM is not installed; starting it there is one line naming
the install command (dmtp.serving.vllm.engine.VLLM_MISSING)."""
from __future__ import annotations

from collections.abc import Sequence

from dmtp.serving.base import DecoderRequest, Engine, plain_dict


def options(cfg) -> dict:
    """vLLM's own engine options, passed through as given (`vllm_engine_args`)."""
    return plain_dict(cfg.get("vllm_engine_args"))


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def decoders(request: DecoderRequest) -> dict:
    """The methods vLLM runs (ar, raw DFlash natively, DMTP through dmtp's plug-in); the others are one error
    when named, else skipped with one line (dmtp.serving.vllm.decoder.vllm_decoders)."""
    from dmtp.serving.vllm.decoder import vllm_decoders

    target, drafter = request.target, request.drafter
    return vllm_decoders(request.methods, request.named, target.path, [target.eos_token_id],
                         drafter and drafter.model, drafter and drafter.path, drafter and drafter.label,
                         request.options, _dtype_name(request.dtype))


def writer(target, method: str, eos_ids: Sequence[int], mtp=None, engine_args: dict | None = None):
    """vLLM's offline batch API on the target's checkpoint (the target alone: `regen_methods`)."""
    from dmtp.serving.vllm.regen import VLLMWriter

    return VLLMWriter(str(target.path), eos_ids, engine_args, dtype=_dtype_name(target.dtype))


def require_installed() -> None:
    from dmtp.serving.vllm.engine import require_vllm

    require_vllm()


ENGINE = Engine(name="vllm", title="vLLM", options=options, decoders=decoders, writer=writer, regen_methods=("ar",),
                require_installed=require_installed)
