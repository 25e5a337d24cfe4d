"""Weights that travel: safetensors only, finite only, and every problem one line naming the file.

- Targets are read by transformers with `use_safetensors=True` (`model.safetensors` or its sharded
  index); a directory without them is refused, never loaded from a pickled `pytorch_model.bin`.
- A truncated or corrupt safetensors file is reported with its path (safetensors' own error names none).
- A drafter with a NaN/inf tensor is neither exported nor loaded (`require_finite`, used by both).
"""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from dmtp.errors import reason

SAFE_WEIGHTS_NAMES = ("model.safetensors", "model.safetensors.index.json")   # what transformers reads then


def require_safetensors(directory: str | Path, what: str = "target checkpoint") -> None:
    directory = Path(directory)
    if not any((directory / name).is_file() for name in SAFE_WEIGHTS_NAMES):
        pickled = sorted(p.name for p in directory.glob("*.bin")) or sorted(p.name for p in directory.glob("*.pt*"))
        found = f" (found {', '.join(pickled[:2])}: pickled weights are never loaded; convert them to safetensors)" \
            if pickled else ""
        raise FileNotFoundError(f"{what} {directory} has no {' or '.join(SAFE_WEIGHTS_NAMES)}{found}")


def unreadable(path: str | Path, err: Exception) -> ValueError:
    return ValueError(f"{path} is not a readable safetensors file ({reason(err)}); is it truncated?")


def first_unreadable(directory: str | Path) -> Path | None:
    """The first `*.safetensors` file in `directory` whose header cannot be read (None if all can)."""
    for path in sorted(Path(directory).glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt") as f:
                f.keys()
        except (SafetensorError, OSError):
            return path
    return None


def require_finite(tensors: dict[str, torch.Tensor], what: str) -> None:
    """Raise naming the first tensor with a NaN or inf entry."""
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ValueError(f"{what}: tensor {name} has non-finite values (NaN/inf); the weights are broken")
