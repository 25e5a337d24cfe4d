"""Which target runtime drives a target: the catalogue of static-cache runners and `make_target_runner`.

Each static-cache runner registers once in `STATIC_RUNNERS` as (name, why_unsupported, class):
`why_unsupported(target)` returns None when the runner can drive the target, else a short reason
naming the piece it does not cover. `runner=auto` takes the first runner that can, and falls back to
the exact `RecomputeTargetRunner` (the oracle) with one line saying why; `runner=fast` insists on a
static-cache runner and fails with that reason; `runner=recompute` always takes the oracle.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable

from dmtp.decode.hybrid_runner import HybridTargetRunner, hybrid_runner_unsupported
from dmtp.decode.deepseek_runner import DeepseekV3TargetRunner, deepseek_runner_unsupported
from dmtp.decode.glm_runner import Glm4MoeTargetRunner, glm_runner_unsupported
from dmtp.decode.runner_base import TargetRunner
from dmtp.decode.target_runner import FastTargetRunner, RecomputeTargetRunner, fast_runner_unsupported
from dmtp.models.target import TargetModel

RUNNER_KINDS = ("auto", "fast", "recompute")

# (name, why_unsupported(target) -> str | None, runner class); tried in order.
STATIC_RUNNERS: list[tuple[str, Callable[[TargetModel], str | None], type[TargetRunner]]] = [
    ("dense", fast_runner_unsupported, FastTargetRunner),
    ("hybrid", hybrid_runner_unsupported, HybridTargetRunner),
    ("deepseek_v3", deepseek_runner_unsupported, DeepseekV3TargetRunner),
    ("glm4_moe", glm_runner_unsupported, Glm4MoeTargetRunner),
]


def static_runner_for(target: TargetModel) -> tuple[type[TargetRunner] | None, str]:
    """(the first static-cache runner class that drives `target`, or None; why none does)."""
    reasons = []
    for name, why_unsupported, cls in STATIC_RUNNERS:
        why = why_unsupported(target)
        if why is None:
            return cls, ""
        reasons.append(f"{name}: {why}")
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
