"""`python -m dmtp.infer engine=vllm`: a method decoded inside vLLM, reported like dmtp's own loop.

`VLLMDecoder` is a `dmtp.serving.base.Decoder` (`generate(...) -> DecodeResult`, `num_candidates`,
`fixed_shapes`, `info()`, ...), so the printed table, the comparisons and metrics.json are dmtp's, unchanged;
dmtp.serving.vllm.adapter registers it as engine `vllm`. Methods: `ar` (the target alone) and a drafter
vLLM runs (method `dflash`: a raw DFlash export). The accepted drafts come per request and round from
vLLM (`per_step_accepted`, before the EOS / budget cut, dmtp's `accepted_raw`); the cut ones follow
dmtp's rule (`committed_accepted`). Times: `wall_s` around vLLM's batch call; time to first token per
request from vLLM's own request metrics; `prefill_s` is the last request's first-token latency (all
prompts are submitted at once); vLLM has no per-stage times, so that table stays empty.

vLLM schedules its own batches (continuous batching); `batch_size` caps the requests it runs at once
(`max_num_seqs`, unless `vllm_engine_args` set it). One engine lives at a time: starting one stops the
previous (GPU memory).
"""
from __future__ import annotations

import time
from collections.abc import Sequence

from dmtp.serving.vllm.engine import make_llm, sampling_params, shutdown


_live: dict[str, object] = {}   # the one engine alive: {"decoder": VLLMDecoder}


def committed_accepted(tokens: int, accepted_raw: Sequence[int]) -> list[int]:
    """dmtp's accepted counts after the EOS / budget cut, from the raw ones and the output length: each
    round commits its accepted drafts and one correction or bonus token, the last round only what is
    left of the output; its last committed token is that correction or bonus slot."""
    done, out = 1, []   # the first output token comes from the prefill
    for x in accepted_raw:
        room = tokens - done
        out.append(max(0, min(x, room - 1)))
        done += min(x + 1, room)
    return out


class VLLMDecoder:
    """A method decoded inside vLLM (dmtp.serving.base.Decoder)."""
    fixed_shapes = False          # no graphs captured by dmtp: warm up with a short batch
    predicts_confidence = False   # vLLM verifies whole blocks
    signals_acceptance = False    # (whatever its scheduler does, dmtp's verify_length does not reach it)

    def __init__(self, name: str, target_path: str, eos_ids: Sequence[int], drafter_dir: str | None = None,
                 engine_args: dict | None = None, dtype: str = "float32", num_candidates: int = 0):
        """`num_candidates`: the drafter's K (its block_size - 1), vLLM's num_speculative_tokens (vLLM's block
        is 1 + K; it does not read block_size)."""
        self.name, self.target_path, self.eos_ids = name, str(target_path), list(eos_ids)
        self.drafter_dir, self.engine_args, self.dtype = drafter_dir, dict(engine_args or {}), dtype
        self.num_candidates = num_candidates if drafter_dir is not None else 0
        self.llm = None

    def _engine(self, batch_size: int):
        if self.llm is None:
            previous = _live.pop("decoder", None)
            if previous is not None:
                previous.close()
            spec = None if self.drafter_dir is None else {
                "method": "dflash", "model": str(self.drafter_dir), "num_speculative_tokens": self.num_candidates,
                "draft_sample_method": draft_sample_method(self.drafter_dir)}
            args = {"max_num_seqs": batch_size, "disable_log_stats": False, **self.engine_args}
            self.llm = make_llm(self.target_path, args, speculative_config=spec, dtype=self.dtype)
            _live["decoder"] = self
        return self.llm

    def generate(self, prompts, max_new_tokens: int = 64, sampling=None, batch_size: int = 8, seed: int = 0,
                 progress: bool = False):
        from vllm.inputs import TokensPrompt

        from dmtp.decode.loop import DecodeResult
        from dmtp.decode.sampling import SamplingConfig

        sampling = sampling or SamplingConfig()
        llm = self._engine(batch_size)
        params = [sampling_params(max_new_tokens, self.eos_ids, sampling.temperature, sampling.top_k, sampling.top_p,
                                  seed=None if sampling.greedy else seed + i) for i in range(len(prompts))]
        started = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts], params,
                            use_tqdm=progress)
        wall = time.perf_counter() - started
        tokens = [list(o.outputs[0].token_ids) for o in outs]
        if self.num_candidates:
            raw = [list(o.outputs[0].spec_decode_metrics.per_step_accepted) for o in outs]
        else:   # the target alone: one token per round after the prefill's
            raw = [[0] * max(0, len(t) - 1) for t in tokens]
        ttft = [float(o.metrics.first_token_latency) for o in outs]   # kept: the engine logs stats
        return DecodeResult(self.name, self.num_candidates, tokens,
                            [committed_accepted(len(t), r) for t, r in zip(tokens, raw)], raw,
                            [len(p) for p in prompts], wall, max(ttft, default=0.0), ttft, {},
                            sum(len(r) for r in raw), 1, sampling, {"engine": "vllm"})

    def info(self) -> dict:
        """vLLM runs its own model runner and attention backend; dmtp captures and compiles nothing."""
        return {"runner": "vllm", "attention": "vllm", "cuda_graphs": False, "compiled": False, "compile_s": 0.0}

    def close(self) -> None:
        if self.llm is not None:
            shutdown(self.llm)
            self.llm = None


def draft_sample_method(drafter_dir) -> str:
    """vLLM's `draft_sample_method` for a drafter: "probabilistic" (sampled requests get drafts with their
    proposal distributions, as dmtp's rejection and block verification; greedy ones the argmax), "greedy" for
    DFlash2, whose V1 walk is greedy only (dmtp.serving.vllm.dflash2_proposer)."""
    from dmtp.drafters.checkpoint import read_drafter_config
    from dmtp.drafters.dflash2 import DFLASH2_ARCH

    names = read_drafter_config(drafter_dir).get("architectures") or []
    return "greedy" if DFLASH2_ARCH in names else "probabilistic"


def vllm_decoders(methods: Sequence[str], named: set[str], target_path: str, eos_ids: Sequence[int], drafter=None,
                  drafter_dir=None, variant: str | None = None, engine_args: dict | None = None,
                  dtype: str = "float32") -> dict[str, VLLMDecoder]:
    """{label: decoder} for the methods vLLM runs.

    A method it cannot run is one error when asked for by name, else skipped with one printed line: the native-MTP
    chains (vLLM has no `mtp` method for a dense target) and DMTP variants the plug-in cannot host
    (dmtp.serving.vllm.plugin_model.serving_layout_problem; the plug-in serves the others, docs/vllm-plugin.md)."""
    decoders, skipped = {}, []
    for m in methods:
        if m == "ar":
            decoders[m] = VLLMDecoder(m, target_path, eos_ids, engine_args=engine_args, dtype=dtype)
            continue
        problem = _plugin_problem(drafter) if m == "drafter" and drafter is not None else None
        if m == "drafter" and drafter is not None and problem is None:
            decoders[variant] = VLLMDecoder(variant, target_path, eos_ids, str(drafter_dir), engine_args, dtype,
                                            num_candidates=drafter.num_candidates)
            continue
        what = f"drafter {variant} ({drafter_dir})" if m == "drafter" else m
        why = (f"cannot be served by dmtp's vLLM plug-in: {problem}" if m == "drafter"
               else "is a native-MTP chain, which vLLM does not run on a dense target")
        if m in named:
            raise ValueError(f"engine=vllm cannot decode {what}: it {why}; engine=dmtp decodes it")
        skipped.append(f"{what} ({why})")
    if skipped:
        print(f"[dmtp] engine=vllm skips {'; '.join(skipped)}")
    return decoders


def _plugin_problem(drafter) -> str | None:
    """None when vLLM serves this drafter: raw DFlash natively, a DMTP variant through dmtp's plug-in."""
    if not drafter.needs_mtp:
        return None
    from dmtp.serving.vllm.plugin_model import serving_layout_problem

    return serving_layout_problem(drafter.injection, drafter.backbone.config, drafter.num_candidates)


__all__ = ["VLLMDecoder", "committed_accepted", "draft_sample_method", "vllm_decoders"]
