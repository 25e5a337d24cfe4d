"""A drafter's published layout on disk: `config.json` (the architecture's `to_hf_config`; dmtp's own record
under "dmtp") and `model.safetensors` (the drafter's tensors under their published names, extras under
their own). `load_drafter` picks the class from config.json's `architectures` (the registry), checks the
raw config first (`config_check`), and reads the tensors strictly.
"""
from __future__ import annotations

import json
import os

import torch
from safetensors import SafetensorError, safe_open

from dmtp.atomic_io import save_safetensors, write_json
from dmtp.drafters.config_check import check_mask_token, check_raw_drafter_config
from dmtp.drafters.dflash import DFlashConfig, DFlashDrafter
from dmtp.drafters.registry import ARCHITECTURES, drafter_class, owned_prefixes, stored_aliases
from dmtp.models.safe_weights import require_finite, unreadable

CONFIG_NAME, WEIGHTS_NAME = "config.json", "model.safetensors"


def save_drafter(path, drafter: DFlashDrafter, extra_tensors: dict[str, torch.Tensor] | None = None,
                 extra_config: dict | None = None, dmtp_architecture: bool = False,
                 state: dict[str, torch.Tensor] | None = None, dtype: torch.dtype | None = None) -> None:
    """Writes `config.json` (published layout; `extra_config` under "dmtp") and `model.safetensors`
    (drafter tensors under their published names, `extra_tensors` under their own keys).
    `dmtp_architecture`: name the export by its DMTP architecture (`dmtp_published`), not the
    backbone's published one. `state`: the drafter's full tensors when it holds shards (FSDP), else its
    own; `dtype`: the floating tensors' precision on disk (None: as held), named in config.json."""
    extra_tensors = extra_tensors or {}
    bad = [k for k in extra_tensors if k.startswith(owned_prefixes())]
    if bad:
        raise ValueError(f"extra tensor key {bad[0]!r} collides with drafter names {owned_prefixes()}; prefix it")
    state = drafter.state_dict() if state is None else state
    tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    tensors.update({k: v.detach().cpu().contiguous() for k, v in extra_tensors.items()})
    require_finite(tensors, f"refusing to export the drafter to {path}")
    tensors = cast_floats(tensors, dtype)
    os.makedirs(path, exist_ok=True)
    cfg = drafter.config.to_hf_config()
    floats = {t.dtype for t in tensors.values() if t.is_floating_point()}
    if len(floats) == 1:   # what engines read to pick the drafter's precision
        cfg["torch_dtype"] = str(floats.pop()).removeprefix("torch.")
    if dmtp_architecture:
        cfg["architectures"] = [ARCHITECTURES[drafter.config.architecture].dmtp_published]
    if extra_config is not None:
        cfg["dmtp"] = extra_config
    # Each file replaced whole (a kill leaves the previous export's file); the weights first, so that a
    # directory gains its config.json only once its weights are there.
    save_safetensors(os.path.join(path, WEIGHTS_NAME), tensors, metadata={"format": "pt"})
    write_json(os.path.join(path, CONFIG_NAME), cfg)


def cast_floats(tensors: dict[str, torch.Tensor], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """Floating tensors in `dtype` (None: unchanged); integer ones as they are."""
    if dtype is None:
        return tensors
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}


def read_drafter_config(path) -> dict:
    """A drafter directory's config.json, or one line naming the file when it is not JSON."""
    cfg_path = os.path.join(os.fspath(path), CONFIG_NAME)
    try:
        with open(cfg_path) as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{cfg_path} is not valid JSON ({getattr(e, 'msg', e)}); is it a drafter config.json?") from None


def load_drafter(path, dtype: torch.dtype = torch.float32):
    """Returns (drafter, extra_tensors, extra_config). config.json's `architectures` picks the class
    (a registered architecture's published or DMTP name; anything else loads as DFlash v1).

    Strict on drafter tensors: a missing, unexpected (under fc./hidden_norm./norm./layers./candidate_selector.) or
    mis-shaped tensor raises ValueError. Other keys are extras. Checkpoints written by the reference package's
    classes load too (their codebook names carry `.weight`)."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"drafter directory not found: {path}")
    cfg_path, w_path = os.path.join(path, CONFIG_NAME), os.path.join(path, WEIGHTS_NAME)
    for p in (cfg_path, w_path):
        if not os.path.isfile(p):
            raise FileNotFoundError(f"drafter file not found: {p}")
    raw = read_drafter_config(path)
    check_raw_drafter_config(raw, cfg_path)
    try:
        config = DFlashConfig.from_hf_config(raw)
    except (ValueError, TypeError, KeyError) as e:   # a field of the wrong kind or out of range
        raise ValueError(f"{cfg_path}: {e}") from None
    check_mask_token(config.mask_token_id, config.vocab_size, cfg_path)
    with torch.device("meta"):
        drafter = drafter_class(config)(config)
    expected = {k: v.shape for k, v in drafter.state_dict().items()}
    state, extras = {}, {}
    aliases, owned = stored_aliases(), owned_prefixes()
    try:
        weights = safe_open(w_path, framework="pt")
    except SafetensorError as e:
        raise unreadable(w_path, e) from None
    with weights as f:
        keys = list(f.keys())
        for stored in keys:
            k = aliases.get(stored, stored)
            if k in expected:
                if k in state:
                    raise ValueError(f"{w_path}: tensor {k} is stored twice (also as {stored})")
                t = f.get_tensor(stored)
                if tuple(t.shape) != tuple(expected[k]):
                    raise ValueError(f"{w_path}: tensor {k} has shape {tuple(t.shape)}, expected {tuple(expected[k])}")
                state[k] = t.to(dtype)
            elif k.startswith(owned):
                raise ValueError(f"{w_path}: unexpected drafter tensor {k}")
            else:
                extras[k] = f.get_tensor(stored)
    require_finite({**state, **extras}, f"drafter {w_path}")
    missing = [k for k in expected if k not in state]
    if missing:
        raise ValueError(f"{w_path}: missing drafter tensor {missing[0]} ({len(missing)} missing in all)")
    drafter.load_state_dict(state, strict=True, assign=True)
    return drafter, extras, raw.get("dmtp") or {}


__all__ = ["CONFIG_NAME", "WEIGHTS_NAME", "cast_floats", "load_drafter", "read_drafter_config", "save_drafter"]
