"""Which target runtime drives a target: the catalogue of static-cache runners and `make_target_runner`.

`STATIC_RUNNERS` lists the static-cache runner classes in the order they are tried; each says itself
why it cannot drive a target (`why_unsupported(target)`: None when it can, else a short reason naming
the piece it does not cover) and names its family (`family`). `runner=auto` takes the first runner that
can, and falls back to the exact `RecomputeTargetRunner` (the oracle) with one line saying why;
`runner=fast` insists on a static-cache runner and fails with that reason; `runner=recompute` always
takes the oracle.
"""
from __future__ import annotations

import warnings

from dmtp.decode.runners.base import StaticCacheRunner, TargetRunner
from dmtp.decode.runners.deepseek import DeepseekV3TargetRunner
from dmtp.decode.runners.dense import FastTargetRunner
from dmtp.decode.runners.glm import Glm4MoeTargetRunner
from dmtp.decode.runners.hybrid import HybridTargetRunner
from dmtp.decode.runners.recompute import RecomputeTargetRunner
from dmtp.models.target import TargetModel

RUNNER_KINDS = ("auto", "fast", "recompute")

# Tried in order.
STATIC_RUNNERS: list[type[StaticCacheRunner]] = [
    FastTargetRunner,
    HybridTargetRunner,
    DeepseekV3TargetRunner,
    Glm4MoeTargetRunner,
]


def static_runner_for(target: TargetModel) -> tuple[type[StaticCacheRunner] | None, str]:
    """(the first static-cache runner class that drives `target`, or None; why none does)."""
    reasons = []
    for cls in STATIC_RUNNERS:
        why = cls.why_unsupported(target)
        if why is None:
            return cls, ""
        reasons.append(f"{cls.family}: {why}")
    return None, "; ".join(reasons)


def make_target_runner(target: TargetModel, layer_ids=(), kind: str = "auto", attention: str = "auto") -> TargetRunner:
    """kind: auto (a static-cache runner when one covers the target, else recompute) | fast | recompute."""
    if kind not in RUNNER_KINDS:
        raise ValueError(f"runner must be one of {'|'.join(RUNNER_KINDS)}, got {kind!r}")
    if kind == "recompute":
        return RecomputeTargetRunner(target, layer_ids)
    cls, why = static_runner_for(target)
    if cls is None:
        model_type = getattr(target.config, "model_type", "?")
        if kind == "fast":
            raise ValueError(f"runner=fast: no static-cache runner covers this {model_type} target ({why})")
        warnings.warn(f"[dmtp] {model_type} target decodes through the exact recompute runner "
                      f"(O(context) per round): {why}", stacklevel=2)
        return RecomputeTargetRunner(target, layer_ids)
    return cls(target, layer_ids, attention=attention)


__all__ = ["STATIC_RUNNERS", "RUNNER_KINDS", "make_target_runner", "static_runner_for"]
