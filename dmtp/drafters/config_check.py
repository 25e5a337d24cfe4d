"""What a drafter's config.json must hold before a module is built from it: each problem is one line naming
the file (a tampered or foreign config must not become a KeyError, or an IndexError once decoding runs)."""
from __future__ import annotations

import torch

# The widths the backbone is built from (DFlashConfig.from_hf_config reads them without a default).
REQUIRED_SIZES = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
_DTYPE_KEYS = ("torch_dtype", "dtype")   # transformers writes torch_dtype (newer versions: dtype)


def check_raw_drafter_config(raw, cfg_path: str) -> None:
    """The keys `DFlashConfig.from_hf_config` needs are present and sane, a key written both at the top level and in
    `dflash_config` has one value, and a dtype, if named, is a real one."""
    if not isinstance(raw, dict):
        raise ValueError(f"{cfg_path}: expected a JSON object, got {type(raw).__name__}")
    for key in REQUIRED_SIZES:
        if key not in raw:
            raise ValueError(f"{cfg_path}: missing {key!r} (a drafter config needs {', '.join(REQUIRED_SIZES)})")
        value = raw[key]
        if type(value) is not int or value < 1:
            raise ValueError(f"{cfg_path}: {key} must be an integer >= 1, got {value!r}")
    sub = raw.get("dflash_config")
    for key, value in (sub.items() if isinstance(sub, dict) else ()):   # e.g. DSpark's markov_rank, written at both
        if value is not None and raw.get(key) is not None and raw[key] != value:
            raise ValueError(f"{cfg_path}: {key} is {raw[key]!r} at the top level but {value!r} in dflash_config "
                             "(engines read one or the other: the file contradicts itself; fix it or export again)")
    for key in _DTYPE_KEYS:
        value = raw.get(key)
        if value is not None and not _is_float_dtype_name(value):
            raise ValueError(f"{cfg_path}: {key}={value!r} is not a floating-point torch dtype "
                             "(e.g. bfloat16, float16, float32)")


def check_mask_token(mask_token_id: int, vocab_size: int, cfg_path: str) -> None:
    """The MASK id embeds the drafter's empty slots: it must be a row of the vocabulary (checked when the
    drafter loads, before any decoding runs)."""
    if not 0 <= mask_token_id < vocab_size:
        raise ValueError(f"{cfg_path}: mask_token_id {mask_token_id} is outside the vocabulary "
                         f"(vocab_size {vocab_size}: ids 0..{vocab_size - 1})")


def _is_float_dtype_name(name) -> bool:
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    return isinstance(dtype, torch.dtype) and dtype.is_floating_point
