"""vLLM as an engine for dmtp: build it, map dmtp's prompts and sampling to it, read its counters.

Everything here imports vLLM lazily, so dmtp imports (and its other commands run) where vLLM is not
installed; asking for the vLLM engine there is one line naming the install command.

Correspondences (vLLM 0.32; see ../shared/reference/vllm-serving.md):
- dmtp's prompts are token ids: `TokensPrompt(prompt_token_ids=...)`, so no tokenizer round trip.
- dmtp stops at exactly its `eos_ids`: vLLM's own EOS handling is turned off (`ignore_eos`) and the
  same ids are `stop_token_ids`, so a custom EOS list means the same in both engines.
- greedy = temperature 0; top_k 0 = off and top_p 1 = off mean the same in both.
- spec-decoding counters: `vllm:spec_decode_num_drafts` is dmtp's number of verification rounds and
  `vllm:spec_decode_num_accepted_tokens_per_pos[k]` the rounds whose accepted length exceeds k; per
  request (`per_request_spec_decode_metrics="detailed"`), `per_step_accepted` is the accepted drafts
  of each round: all counted before the EOS / budget cut, like dmtp's `DecodeResult.accepted_raw`.
"""
from __future__ import annotations

import importlib.util
from collections.abc import Sequence

VLLM_MISSING = ("vLLM is not installed in this environment: `bash tools/env/vllm_env.sh` makes .venv-vllm/ "
                "(CPU), `pip install -e \".[vllm]\"` on GPUs (see README, Serving with vLLM)")


class VLLMMissing(ImportError, ValueError):
    """vLLM asked for where it is not installed: an ImportError, and bad input to a command (one line, exit 2)."""


def require_vllm() -> None:
    """VLLMMissing where vLLM is not installed, found without importing it (asked before anything loads)."""
    if importlib.util.find_spec("vllm") is None:
        raise VLLMMissing(VLLM_MISSING)


def import_vllm():
    """The vllm module, or VLLMMissing whose message is the one line to act on."""
    try:
        import vllm
    except ImportError as e:
        raise VLLMMissing(f"{VLLM_MISSING} ({e})") from None
    return vllm


def make_llm(model: str, engine_args: dict | None = None, speculative_config: dict | None = None,
             dtype: str = "float32"):
    """An offline `vllm.LLM` on a local checkpoint directory (its own tokenizer files). `engine_args`
    are vLLM's own engine options, passed through as given (tensor_parallel_size, max_model_len,
    gpu_memory_utilization, enforce_eager, ...); they override the defaults here."""
    vllm = import_vllm()
    args = {"model": str(model), "tokenizer": str(model), "dtype": dtype, "seed": 0}
    if speculative_config is not None:
        args["speculative_config"] = dict(speculative_config)
        args["disable_log_stats"] = False   # the spec-decoding counters are what is compared
        args["per_request_spec_decode_metrics"] = "detailed"   # accepted drafts per request and round
    args.update(dict(engine_args or {}))
    return vllm.LLM(**args)


def sampling_params(max_new_tokens: int, eos_ids: Sequence[int], temperature: float = 0.0, top_k: int = 0,
                    top_p: float = 1.0, seed: int | None = None):
    """vLLM's SamplingParams for dmtp's settings (stop exactly at `eos_ids`, see the module doc)."""
    from vllm import SamplingParams

    return SamplingParams(max_tokens=int(max_new_tokens), temperature=float(temperature), top_k=int(top_k),
                          top_p=float(top_p), seed=seed, ignore_eos=True, stop_token_ids=[int(e) for e in eos_ids],
                          detokenize=False)


def generate(llm, prompts: Sequence[Sequence[int]], params) -> tuple[list[list[int]], list[list[int]]]:
    """(output token ids, accepted drafts per verification round) per prompt, in order; the rounds are
    empty without speculative decoding. `params`: one SamplingParams or one per prompt."""
    from vllm.inputs import TokensPrompt

    outs = llm.generate([TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts], params,
                        use_tqdm=False)
    completions = [o.outputs[0] for o in outs]
    rounds = [list(c.spec_decode_metrics.per_step_accepted) if c.spec_decode_metrics is not None else []
              for c in completions]
    return [list(c.token_ids) for c in completions], rounds


def generate_tokens(llm, prompts: Sequence[Sequence[int]], params) -> list[list[int]]:
    """Output token ids per prompt, in order."""
    return generate(llm, prompts, params)[0]


def spec_decode_counts(llm) -> tuple[int, list[int]]:
    """(drafts, accepted per position) from vLLM's counters since the engine started."""
    drafts, per_pos = 0, []
    for metric in llm.get_metrics():
        if metric.name == "vllm:spec_decode_num_drafts":
            drafts = int(metric.value)
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            per_pos = [int(v) for v in metric.values]
    return drafts, per_pos


def shutdown(llm) -> None:
    """Stop the engine's processes now (the training run goes on in this process)."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()


__all__ = ["VLLM_MISSING", "import_vllm", "make_llm", "sampling_params", "generate", "generate_tokens",
           "spec_decode_counts",
           "shutdown"]
