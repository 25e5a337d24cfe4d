"""The one list of target families, and what reads it: the MTP lookup by `model_type` and the choice of
the runtime that drives a target (`make_target_runner`).

`FAMILIES` is tried in order. Each family's static-cache runner says itself why it cannot drive a target
(`why_unsupported(target)`: None when it can, else a short reason naming the piece it does not cover).
`runner=auto` takes the first runner that can, and falls back to the exact `RecomputeTargetRunner` (the
oracle) with one line saying why; `runner=fast` insists on a static-cache runner and fails with that
reason; `runner=recompute` always takes the oracle. A new family is a file in this package and one entry
below.
"""
from __future__ import annotations

import warnings

from dmtp.decode.runners.base import StaticCacheRunner, TargetRunner
from dmtp.decode.runners.recompute import RecomputeTargetRunner
from dmtp.families import deepseek_v3, dense, glm4_moe, hybrid
from dmtp.families.base import Family
from dmtp.models.target import TargetModel

FAMILIES: tuple[Family, ...] = (dense.FAMILY, hybrid.FAMILY, deepseek_v3.FAMILY, glm4_moe.FAMILY)


def _by_model_type(attribute: str) -> dict[str, Family]:
    table: dict[str, Family] = {}
    for family in FAMILIES:
        for model_type in getattr(family, attribute):
            if model_type in table:
                raise ValueError(f"model_type {model_type!r} is registered by two families "
                                 f"({table[model_type].name}, {family.name})")
            table[model_type] = family
    return table


_FAMILY_OF = _by_model_type("model_types")
_MTP_FAMILY_OF = _by_model_type("mtp_types")
# The model types whose native MTP dmtp builds.
MTP_MODEL_TYPES = tuple(sorted(_MTP_FAMILY_OF))


def family_named(name: str) -> Family:
    for family in FAMILIES:
        if family.name == name:
            return family
    raise ValueError(f"family must be one of {', '.join(f.name for f in FAMILIES)}, got {name!r}")


def family_of(model_type: str) -> Family | None:
    """The family whose runner takes `model_type` (None: no family does)."""
    return _FAMILY_OF.get(model_type)


def mtp_family_of(model_type: str) -> Family | None:
    """The family that builds the native MTP of `model_type` (None: no family does)."""
    return _MTP_FAMILY_OF.get(model_type)


# ----------------------------------------------------------------------------------------------------
# which runtime drives a target
# ----------------------------------------------------------------------------------------------------

RUNNER_KINDS = ("auto", "fast", "recompute")

# Tried in order.
STATIC_RUNNERS: tuple[type[StaticCacheRunner], ...] = tuple(f.runner for f in FAMILIES)


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


__all__ = ["FAMILIES", "MTP_MODEL_TYPES", "RUNNER_KINDS", "STATIC_RUNNERS", "family_named", "family_of",
           "make_target_runner", "mtp_family_of", "static_runner_for"]
