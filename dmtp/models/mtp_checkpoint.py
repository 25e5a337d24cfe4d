"""A target checkpoint's native MTP tensors: where they are, what they are called, how they are read
(dequantised, checked), and the tuned copy saved beside a drafter.

Knows no family: the MTP is built and loaded by `dmtp.families.mtp_loading.load_native_mtp`, which reads these.

Layouts (see shared/reference/mtp.md):
- `mtp.*`: Qwen3-Next / Qwen3.5 / Qwen3.6 naming (also the embedded tiny target, with a Qwen3 block):
  mtp.fc, mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden, mtp.layers.0.*, mtp.norm.
- `model.layers.{L}.*` with L = num_hidden_layers: DeepSeek-V3 / GLM-4.5+ naming:
  eh_proj -> fc, enorm -> pre_fc_norm_embedding, hnorm -> pre_fc_norm_hidden,
  shared_head.norm -> norm, the decoder layer's own tensors -> layers.0.*;
  the duplicated embed_tokens / shared_head.head are skipped (the target's are shared).

Only the MTP's tensors are read, lazily per key, from `model.safetensors` or the shards named by
`model.safetensors.index.json`, or from the checkpoint's own `mtp.safetensors` beside them (the
embedded targets: the MTP kept apart from the causal LM, which engines such as vLLM then load as is). Every MTP parameter must be present with the right shape and every
MTP tensor in the checkpoint must be consumed; anything else is a one-line error naming the tensor.

A jointly trained MTP (model.train_mtp) is saved beside its drafter as `mtp.safetensors`, under the
checkpoint's own names (`save_tuned_mtp`), and `load_native_mtp(..., tuned=<file>)` reads its
tensors from there instead, as strictly: the target checkpoint itself is never modified.
"""
from __future__ import annotations

import json

from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from dmtp.atomic_io import save_safetensors
from dmtp.models.mtp import NativeMTP
from dmtp.models.mtp_errors import MTPLoadError
from dmtp.models.safe_weights import require_finite, unreadable

# An MTP's tensors in a file of their own, under the target checkpoint's names (`mtp.*`, ...): in a
# target directory, its native MTP kept apart from the causal LM's weights and unlisted by
# model.safetensors.index.json, so that engines loading the causal LM alone (vLLM's dense Qwen3,
# transformers) never see it (the embedded targets are written so); beside a drafter, the MTP tuned
# with it (model.train_mtp).
MTP_FILE_NAME = "mtp.safetensors"
TUNED_MTP_NAME = MTP_FILE_NAME


def text_config(config: dict) -> dict:
    """The language model's config: `text_config` of multimodal checkpoints, else the config itself."""
    if "text_config" in config:
        return config["text_config"]
    if (config.get("architectures") and any("ConditionalGeneration" in a for a in config["architectures"])) \
            or "vision_config" in config:
        arch = (config.get("architectures") or [config.get("model_type", "?")])[0]
        raise MTPLoadError(f"multimodal config ({arch}) has no text_config: cannot read the language model's dimensions")
    return config


def num_mtp_layers(cfg: dict) -> int:
    return int(cfg.get("mtp_num_hidden_layers") or cfg.get("num_nextn_predict_layers") or 0)


class CheckpointIndex:
    """Key -> file map of a safetensors checkpoint (single file or sharded), read lazily, plus the
    checkpoint's own `mtp.safetensors` when its index does not list it (`mtp_only_keys`)."""

    def __init__(self, path: str | Path):
        self.root = Path(path)
        if not self.root.is_dir():
            raise FileNotFoundError(f"checkpoint directory not found: {self.root}")
        index = self.root / "model.safetensors.index.json"
        single = self.root / "model.safetensors"
        if index.exists():
            self.files = {k: self.root / f for k, f in json.loads(index.read_text())["weight_map"].items()}
        elif single.exists():
            with safe_open(str(single), "pt") as f:
                self.files = {k: single for k in f.keys()}
        else:
            raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {self.root}")
        self.mtp_only_keys = self._add_mtp_file()

    def _add_mtp_file(self) -> set[str]:
        """The MTP kept apart from the causal LM's weights (the embedded targets; see MTP_FILE_NAME):
        its keys join the map; a key stored in both places is an error (which one would be meant?)."""
        mtp_file = self.root / MTP_FILE_NAME
        if not mtp_file.is_file() or mtp_file in set(self.files.values()):
            return set()
        try:
            with safe_open(str(mtp_file), "pt") as f:
                keys = set(f.keys())
        except SafetensorError as e:
            raise unreadable(mtp_file, e) from None
        both = sorted(keys & set(self.files))
        if both:
            raise MTPLoadError(f"tensor {both[0]} is stored both in {mtp_file} and in {self.root}'s model weights")
        self.files.update({k: mtp_file for k in keys})
        return keys

    def keys(self) -> list[str]:
        return list(self.files)

    def get(self, key: str) -> torch.Tensor:
        with safe_open(str(self.files[key]), "pt") as f:
            return f.get_tensor(key)

    def shape(self, key: str) -> list[int]:
        with safe_open(str(self.files[key]), "pt") as f:
            return list(f.get_slice(key).get_shape())


_DEEPSEEK_RENAMES = {"eh_proj.": "fc.", "enorm.": "pre_fc_norm_embedding.", "hnorm.": "pre_fc_norm_hidden.",
                     "shared_head.norm.": "norm."}
_DEEPSEEK_SKIP = ("embed_tokens.", "shared_head.head.")


def mtp_tensor_names(keys: list[str], cfg: dict) -> tuple[str, dict[str, str]]:
    """Detect the layout; return its name and {checkpoint key: NativeMTP parameter name}."""
    qwen = {k: k[len("mtp."):] for k in keys if k.startswith("mtp.")}
    if qwen:
        return "mtp", qwen
    layer = cfg.get("num_hidden_layers")
    prefix = f"model.layers.{layer}."
    deepseek = {}
    for k in keys:
        if not k.startswith(prefix):
            continue
        rest = k[len(prefix):]
        if rest.startswith(_DEEPSEEK_SKIP):
            continue
        for old, new in _DEEPSEEK_RENAMES.items():
            if rest.startswith(old):
                deepseek[k] = new + rest[len(old):]
                break
        else:
            deepseek[k] = "layers.0." + rest
    if deepseek:
        return "deepseek", deepseek
    return "none", {}


def dequantize_fp8(weight: torch.Tensor, scale_inv: torch.Tensor, block: int | tuple[int, int] = 128) -> torch.Tensor:
    """DeepSeek-V3 FP8 block quantisation: weight * scale_inv per block (128x128 in the releases; the
    config's `quantization_config.weight_block_size` when given).

    Ragged edge blocks are cropped."""
    rows, cols = weight.shape
    br, bc = (block, block) if isinstance(block, int) else block
    scale = scale_inv.float().repeat_interleave(br, 0)[:rows].repeat_interleave(bc, 1)[:, :cols]
    if scale.shape != weight.shape:
        raise MTPLoadError(f"FP8 scale of shape {list(scale_inv.shape)} does not cover a {list(weight.shape)} weight "
                           f"in {br}x{bc} blocks")
    return weight.float() * scale


FP8_DTYPES = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
                    if hasattr(torch, n))


def block_keys(names: dict[str, str]) -> list[str]:
    """The block's tensor names (relative to `layers.0.`), FP8 scales excluded."""
    return sorted(n[len("layers.0."):] for k, n in names.items()
                  if n.startswith("layers.0.") and not k.endswith(".weight_scale_inv"))


def read_checkpoint_mtp(root: Path):
    """-> (config, text config, index, layout, {checkpoint key: NativeMTP parameter name})."""
    if not root.is_dir():
        raise FileNotFoundError(f"checkpoint directory not found: {root}")
    if not (root / "config.json").exists():
        raise FileNotFoundError(f"no config.json in {root}: not a Hugging Face checkpoint directory")
    config = json.loads((root / "config.json").read_text())
    cfg = text_config(config)
    index = CheckpointIndex(root)
    layout, names = mtp_tensor_names(index.keys(), cfg)
    stray = sorted(index.mtp_only_keys - set(names))
    if stray:   # read strictly: the MTP's own file holds the MTP's tensors and nothing else
        raise MTPLoadError(f"{root / MTP_FILE_NAME} holds tensor {stray[0]}, which is not one of the checkpoint's "
                           f"MTP tensors ({len(stray)} such in all)")
    return config, cfg, index, layout, names


def dense_names(names: dict[str, str]) -> dict[str, str]:
    """The checkpoint keys a tuned file carries: every MTP tensor but FP8 scales (saved dequantised)."""
    return {k: n for k, n in names.items() if not k.endswith(".weight_scale_inv")}


def save_tuned_mtp(directory: str | Path, mtp: NativeMTP, target_path: str | Path,
                   state: dict[str, torch.Tensor] | None = None, dtype: torch.dtype | None = None) -> Path:
    """Write `mtp`'s tensors to `<directory>/mtp.safetensors` under `target_path`'s own checkpoint names
    (`mtp.*`, or `model.layers.{L}.*` for DeepSeek-V3 / GLM); the target checkpoint is untouched. `state`:
    its full tensors when it holds shards (FSDP); `dtype`: their precision on disk (None: as held)."""
    *_, layout, names = read_checkpoint_mtp(Path(target_path))
    if layout == "none":
        raise MTPLoadError(f"checkpoint {target_path} has no MTP layer to name the tuned tensors after")
    state = mtp.state_dict() if state is None else state
    tensors = {key: state[name].detach().cpu().contiguous() for key, name in dense_names(names).items()}
    if dtype is not None:
        tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}
    out = Path(directory) / TUNED_MTP_NAME
    require_finite(tensors, f"refusing to save the tuned MTP to {out}")
    Path(directory).mkdir(parents=True, exist_ok=True)
    save_safetensors(out, tensors, metadata={"format": "pt"})
    return out


def read_tuned(tuned: Path, names: dict[str, str], root: Path) -> dict[str, torch.Tensor]:
    """A tuned MTP file's tensors: exactly the checkpoint's MTP keys (strict both ways), all finite."""
    if not tuned.is_file():
        raise FileNotFoundError(f"tuned MTP file not found: {tuned}")
    wanted = set(dense_names(names))
    try:
        with safe_open(str(tuned), "pt") as f:
            keys = set(f.keys())
            missing, extra = sorted(wanted - keys), sorted(keys - wanted)
            if missing:
                raise MTPLoadError(f"tuned MTP {tuned} is missing tensor {missing[0]} of {root}'s MTP "
                                   f"({len(missing)} missing in all)")
            if extra:
                raise MTPLoadError(f"tuned MTP {tuned} has tensor {extra[0]}, which is not one of {root}'s MTP tensors")
            tensors = {k: f.get_tensor(k) for k in sorted(keys)}
    except SafetensorError as e:
        raise unreadable(tuned, e) from None
    require_finite(tensors, f"tuned MTP {tuned}")
    return tensors


__all__ = ["MTP_FILE_NAME", "TUNED_MTP_NAME", "CheckpointIndex", "FP8_DTYPES", "block_keys", "dequantize_fp8",
           "mtp_tensor_names", "num_mtp_layers", "read_checkpoint_mtp", "read_tuned", "save_tuned_mtp", "text_config"]
