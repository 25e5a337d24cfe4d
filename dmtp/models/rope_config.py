"""Rotary-embedding settings read from a Hugging Face config, one way everywhere.

transformers 5 writes them as a `rope_parameters` dict (`rope_theta`, `rope_type`, `partial_rotary_factor`,
scaling keys); older configs carry `rope_scaling` plus a top-level `rope_theta`. Both are read here, from
a config object or its dict (config.json), with transformers' own default base when none is written.
"""
from __future__ import annotations

from typing import Any

# transformers' RotaryEmbeddingConfigMixin.default_theta: the base of every family dmtp reads (Qwen3,
# Qwen3-Next / Qwen3.5, DeepSeek-V3, GLM-4-MoE, Llama) when config.json names none.
DEFAULT_ROPE_THETA = 10000.0


def _get(config: Any, key: str, default=None):
    if isinstance(config, dict):
        return config.get(key, default)
    return getattr(config, key, default)


def rope_parameters(config: Any) -> dict:
    """The rotary settings dict: `rope_parameters` (transformers 5), else `rope_scaling`, else {}."""
    return dict(_get(config, "rope_parameters") or _get(config, "rope_scaling") or {})


def rope_theta(config: Any) -> float:
    """The rotary base: rope_parameters / rope_scaling's `rope_theta`, else the top-level field, else
    transformers' default."""
    theta = rope_parameters(config).get("rope_theta")
    if theta is None:
        theta = _get(config, "rope_theta")
    return float(DEFAULT_ROPE_THETA if theta is None else theta)


def rope_type(config: Any) -> str:
    """`rope_type` (or the older `type`) of the rotary settings; "default" when unset."""
    params = rope_parameters(config)
    return params.get("rope_type") or params.get("type") or "default"
