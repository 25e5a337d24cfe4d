"""Strict loading of a target's native MTP layer: its family's block (`dmtp.families`), the checkpoint's
tensors (`dmtp.models.mtp_checkpoint`: layouts, FP8, the tuned copy).

Every MTP parameter must be present with the right shape and every MTP tensor in the checkpoint must be
consumed; anything else is a one-line error naming the tensor. `tuned=`: the tensors of a jointly trained
MTP (model.train_mtp) saved beside its drafter, read instead of the checkpoint's, as strictly.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from dmtp.families.base import Family
from dmtp.families.catalogue import MTP_MODEL_TYPES, mtp_family_of
from dmtp.models.mtp import NativeMTP
from dmtp.models.mtp_checkpoint import (FP8_DTYPES, block_keys, dequantize_fp8, num_mtp_layers, read_checkpoint_mtp,
                                        read_tuned)
from dmtp.models.mtp_errors import MTPLoadError


def build_native_mtp(family: Family, cfg: dict, embed_tokens: nn.Embedding, lm_head: nn.Module,
                     keys: list[str] | None = None) -> NativeMTP:
    """A freshly built (unloaded) MTP of `family` for the text config `cfg`, sharing the target's embedding
    and head; `keys`: the checkpoint's block tensor names, when there is one."""
    spec = family.mtp_spec(cfg)
    return NativeMTP(spec, embed_tokens, lm_head, block=family.mtp_block(spec, cfg, keys=keys))


def load_native_mtp(path: str | Path, embed_tokens: nn.Embedding, lm_head: nn.Module,
                    dtype: torch.dtype | None = None, device=None, tuned: str | Path | None = None) -> NativeMTP:
    """Build the checkpoint's MTP and load its tensors strictly, sharing the target's embedding/head.
    `tuned`: a `mtp.safetensors` written by `save_tuned_mtp` for this checkpoint: its tensors replace
    the checkpoint's (same names, same shapes, every one of them)."""
    root = Path(path)
    config, cfg, index, layout, names = read_checkpoint_mtp(root)
    model_type = cfg.get("model_type") or config.get("model_type", "?")
    if layout == "none":
        declared = num_mtp_layers(cfg)
        raise MTPLoadError(f"checkpoint {root} has no MTP layer: no 'mtp.*' or 'model.layers.{cfg.get('num_hidden_layers')}.*'"
                           f" tensors (config declares {declared} MTP layer(s))")
    if num_mtp_layers(cfg) > 1:
        raise MTPLoadError(f"{root}: {num_mtp_layers(cfg)} MTP layers declared; dmtp drives exactly one")
    family = mtp_family_of(model_type)
    if family is None:
        raise MTPLoadError(f"MTP of model_type {model_type!r} is not supported (supported: {', '.join(MTP_MODEL_TYPES)})")
    mtp = build_native_mtp(family, cfg, embed_tokens, lm_head, keys=block_keys(names))
    expected = mtp.state_dict()

    # FP8 checkpoints carry `<name>.weight_scale_inv` next to a quantised `<name>.weight`.
    scales = {k[: -len("_scale_inv")]: k for k in names if k.endswith(".weight_scale_inv")}
    for weight_key, scale_key in scales.items():
        if weight_key not in names:
            raise MTPLoadError(f"FP8 scale {scale_key!r} in {root} has no weight {weight_key!r}")
    block_size = (config.get("quantization_config") or {}).get("weight_block_size") or [128, 128]
    tuned_tensors = read_tuned(Path(tuned), names, root) if tuned is not None else None
    loaded = {}
    for key, name in names.items():
        if key.endswith(".weight_scale_inv"):
            continue
        if name not in expected:
            raise MTPLoadError(f"unexpected MTP tensor {key!r} in {root} (no parameter {name!r} in the {model_type} MTP)")
        if tuned_tensors is not None:
            tensor = tuned_tensors[key]
            if list(tensor.shape) != list(expected[name].shape):
                raise MTPLoadError(f"shape mismatch for MTP tensor {key!r} in {tuned}: {list(tensor.shape)}, "
                                   f"expected {list(expected[name].shape)}")
            loaded[name] = tensor
            continue
        tensor = index.get(key)
        if key in scales:
            tensor = dequantize_fp8(tensor, index.get(scales[key]), tuple(block_size))
        elif tensor.dtype in FP8_DTYPES:
            raise MTPLoadError(f"FP8 MTP tensor {key!r} in {root} has no '{key}_scale_inv' to dequantise it")
        if list(tensor.shape) != list(expected[name].shape):
            raise MTPLoadError(f"shape mismatch for MTP tensor {key!r}: checkpoint {list(tensor.shape)}, "
                               f"expected {list(expected[name].shape)}")
        loaded[name] = tensor
    missing = sorted(set(expected) - set(loaded))
    if missing:
        prefix = "mtp." if layout == "mtp" else f"model.layers.{cfg.get('num_hidden_layers')}."
        raise MTPLoadError(f"checkpoint {root} is missing MTP tensor(s): {', '.join(prefix + m for m in missing[:5])}"
                           + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    mtp.load_state_dict(loaded, strict=True)
    target_param = embed_tokens.weight
    mtp = mtp.to(dtype=dtype or target_param.dtype, device=device or target_param.device)
    return mtp.eval().requires_grad_(False)


__all__ = ["MTPLoadError", "build_native_mtp", "load_native_mtp"]
