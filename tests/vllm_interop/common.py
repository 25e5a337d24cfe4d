"""What every vLLM test module shares: the environment vLLM reads (set on import, before vLLM is
imported), the skip line, the engine options and the decoding budget."""
from __future__ import annotations

import os

for _key, _value in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                     "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}.items():
    os.environ.setdefault(_key, _value)

SKIP_REASON = "vLLM is not installed here (bash tools/vllm_env.sh; tests/vllm_interop run in .venv-vllm)"
# Engine options every served test uses: float32 like dmtp's loop (make_llm's default), no graph
# capture, short contexts.
ENGINE_ARGS = {"enforce_eager": True, "max_model_len": 512}
NEW_TOKENS = 64
