"""The target runtimes of the decoding loop (see `base` for the interface and its conventions).

base.py       `TargetRunner` (the interface) and `StaticCacheRunner` (static caches, prefill, verify,
              the attention-backend choice, `bind`: transformers' parameters bound by attribute name)
dense.py      Qwen3 / Qwen2 / Llama / Mistral          recompute.py  any causal LM, exact and slow (oracle)
hybrid.py     Qwen3-Next / 3.5 / 3.6 (Gated DeltaNet)  deepseek.py   DeepSeek-V3 (MLA)
glm.py        GLM-4-MoE                                moe.py        MoE MLP binding and checks
catalogue.py  which runner drives a target (`make_target_runner`)
"""
from dmtp.decode.runners.base import StaticCacheRunner, TargetRunner, flash_attn_available
from dmtp.decode.runners.catalogue import RUNNER_KINDS, STATIC_RUNNERS, make_target_runner, static_runner_for
from dmtp.decode.runners.deepseek import DeepseekV3TargetRunner
from dmtp.decode.runners.dense import FastTargetRunner
from dmtp.decode.runners.glm import Glm4MoeTargetRunner
from dmtp.decode.runners.hybrid import HybridTargetRunner
from dmtp.decode.runners.recompute import RecomputeTargetRunner

__all__ = ["TargetRunner", "StaticCacheRunner", "FastTargetRunner", "RecomputeTargetRunner", "HybridTargetRunner",
           "DeepseekV3TargetRunner", "Glm4MoeTargetRunner", "RUNNER_KINDS", "STATIC_RUNNERS", "make_target_runner",
           "static_runner_for", "flash_attn_available"]
