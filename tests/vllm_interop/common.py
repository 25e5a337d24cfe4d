"""What every vLLM test module shares: the environment vLLM reads (set on import, before vLLM is
imported), the skip line, the engine options and the decoding budget."""
from __future__ import annotations

import os

for _key, _value in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                     "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}.items():
    os.environ.setdefault(_key, _value)

SKIP_REASON = "vLLM is not installed here (bash tools/env/vllm_env.sh; tests/vllm_interop run in .venv-vllm)"
# Engine options every served test uses: float32 like dmtp's loop (make_llm's default), no graph
# capture, short contexts.
ENGINE_ARGS = {"enforce_eager": True, "max_model_len": 512}
NEW_TOKENS = 64


def train_interop_drafter(tmp_path_factory, injection: str, num_layers: int = 1, overrides: tuple[str, ...] = ()):
    """A `num_layers` `injection` drafter trained 40 steps on micro_vllm's own greedy responses (enough for
    acceptance to be non-trivial, so equal acceptance in vLLM and dmtp means something). `overrides`: more
    training overrides (e.g. `drafter=dflash2`)."""
    from dmtp.configs import compose_train
    from dmtp.training.job import train

    run = tmp_path_factory.mktemp("-".join([injection, *overrides]).replace("=", "_")) / "run"
    cfg = compose_train(["target=micro_vllm", f"injection={injection}", f"drafter.num_layers={num_layers}",
                         "trainer.max_steps=40",
                         "trainer.val_check_interval=1000", "model.val_walk=false", "trainer.enable_progress_bar=false",
                         "data.regen_sequences=96", "data.regen_new_tokens=64", "data.seq_len=96", *overrides],
                        output_dir=run)
    return train(cfg)["drafter"]
