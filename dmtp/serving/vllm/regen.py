"""The target writes its training data through vLLM (`data.regen_engine=vllm`).

`VLLMWriter` is the writer `dmtp.datagen.regenerate` asks for when `RegenSettings.engine == "vllm"`: the
same `generate(prompts, max_new_tokens, sampling, batch_size, seed) -> .tokens` as dmtp's own
`SpecDecoder`, so the shards, their cache key and their resumption are regenerate's, unchanged.
vLLM's offline batch API (`LLM.generate` on token-id prompts) does the decoding, with continuous
batching and whatever parallelism `engine_args` ask for (`data.vllm_engine_args={tensor_parallel_size: 8}`).

Greedy tokens equal dmtp's own regeneration (tests/vllm_interop). Sampled ones follow the same distribution
from vLLM's own random streams: each prompt gets its own seed (the shard's seed + its index), so a
shard is reproducible whatever vLLM's batching; `batch_size` is dmtp's and is not used here (vLLM
schedules its own batches; `max_num_seqs` in `engine_args` caps them).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dmtp.serving.vllm.engine import generate_tokens, make_llm, sampling_params, shutdown


@dataclass
class WrittenTokens:
    tokens: list[list[int]]   # per prompt: the response, ending at its first EOS or at the budget


class VLLMWriter:
    def __init__(self, target_path: str, eos_ids: Sequence[int], engine_args: dict | None = None,
                 dtype: str = "float32"):
        self.eos_ids = list(eos_ids)
        self.llm = make_llm(target_path, engine_args, dtype=dtype)

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, sampling, batch_size: int = 0,
                 seed: int = 0) -> WrittenTokens:
        params = [sampling_params(max_new_tokens, self.eos_ids, sampling.temperature, sampling.top_k, sampling.top_p,
                                  seed=None if sampling.greedy else seed + i) for i in range(len(prompts))]
        return WrittenTokens(generate_tokens(self.llm, prompts, params))

    def close(self) -> None:
        shutdown(self.llm)


__all__ = ["VLLMWriter", "WrittenTokens"]
