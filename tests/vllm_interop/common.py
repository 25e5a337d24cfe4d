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
    training overrides (e.g. `drafter=dflash2`; an `experiment=` brings its own recipe)."""
    from dmtp.configs import compose_train
    from dmtp.training.job import train

    recipe = [] if any(o.startswith("experiment=") for o in overrides) else ["recipe=greedy"]

    run = tmp_path_factory.mktemp("-".join([injection, *overrides]).replace("=", "_")) / "run"
    cfg = compose_train(["target=micro_vllm", f"injection={injection}", f"drafter.num_layers={num_layers}",
                         "trainer.max_steps=40",
                         "trainer.val_check_interval=1000", "model.val_walk=false", "trainer.enable_progress_bar=false",
                         "data.regen_sequences=96", "data.regen_new_tokens=64", "data.seq_len=96", *recipe, *overrides],
                        output_dir=run)
    return train(cfg)["drafter"]


def per_position(accepted: list[list[int]], k: int) -> list[int]:
    """Accepted drafts per position (vLLM's `..._num_accepted_tokens_per_pos`) from rounds' accepted counts."""
    return [sum(a > i for rounds in accepted for a in rounds) for i in range(k)]


def second_token_p_value(target, prompt: list[int], eos: int, second_tokens: list[int]) -> tuple[float, int]:
    """(p, bins): the chi-square test of sampled second tokens of `prompt` (temperature 1) against the target's own
    marginal sum_x p(x | prompt) p(y | prompt, x) (an EOS first token ends a request: excluded). Bins: the
    tokens expected >= 5 times, the rest pooled; a lossless sampler fails p > 1e-4 with probability 1e-4."""
    import torch

    ids = torch.tensor([prompt])
    with torch.no_grad():
        p_first = target(ids).logits[0, -1].softmax(-1)
        p_first[eos] = 0
        p_first /= p_first.sum()
        firsts = torch.arange(p_first.shape[0])[:, None]
        p_second = target(torch.cat([ids.expand(len(firsts), -1), firsts], 1)).logits[:, -1].softmax(-1)
    expected = (p_first @ p_second) * len(second_tokens)
    observed = torch.bincount(torch.tensor(second_tokens), minlength=expected.shape[0]).double()
    binned = expected >= 5
    e = torch.cat([expected[binned], expected[~binned].sum()[None]]).double()
    o = torch.cat([observed[binned], observed[~binned].sum()[None]])
    chi2 = ((o - e) ** 2 / e).sum()
    p_value = torch.special.gammaincc(torch.tensor((len(e) - 1) / 2.0, dtype=torch.float64), chi2 / 2).item()
    return p_value, int(binned.sum())
