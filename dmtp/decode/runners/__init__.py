"""The target runtimes' machinery (see `base` for the interface and its conventions).

Each family's own static-cache runner lives with the family (`dmtp/families/<family>.py`), and which runner drives a
target is chosen from the families' one list (`dmtp.families.catalogue.make_target_runner`).

base.py       `TargetRunner` (the interface) and `StaticCacheRunner` (static caches, prefill, verify,
              the attention-backend choice, `bind`: transformers' parameters bound by attribute name)
moe.py        MoE MLP binding and checks (DeepSeek-V3, GLM-4-MoE, the hybrid MoE's packed experts)
recompute.py  any causal LM, exact and slow (the oracle)
"""
from dmtp.decode.runners.base import StaticCacheRunner, TargetRunner, flash_attn_available
from dmtp.decode.runners.recompute import RecomputeTargetRunner

__all__ = ["TargetRunner", "StaticCacheRunner", "RecomputeTargetRunner", "flash_attn_available"]
