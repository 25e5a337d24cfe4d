"""What a target family is: one record (`Family`), written once in `dmtp/families/<name>.py` and listed once
in `dmtp.families.catalogue`.

A family names the `model_type`s it takes, how its checkpoints store the native MTP layer, how that layer's
decoder block is built, and the static-cache runner that decodes it. Adding a family is its file, one
entry in the catalogue, a micro target (a `dmtp.tiny` preset, or a checkpoint the tests write) and its
test file; tests/test_families.py holds every registered family to that.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from dmtp.decode.runners.base import StaticCacheRunner
from dmtp.models.mtp import MTPSpec

# How a checkpoint names its MTP tensors (dmtp.models.mtp_checkpoint.mtp_tensor_names tells them apart):
#   mtp        `mtp.fc`, `mtp.layers.0.*`, ... (Qwen3-Next / 3.5 / 3.6; the embedded dense targets)
#   deepseek   `model.layers.{num_hidden_layers}.*` with eh_proj / enorm / hnorm / shared_head (DeepSeek-V3, GLM-4.5+)
MTP_LAYOUTS = ("mtp", "deepseek")


@dataclass(frozen=True)
class Family:
    name: str                 # the runner's family name (runner fall-back lines say "<name>: <why>")
    title: str                # the models it covers, for people
    model_types: tuple[str, ...]   # the text config's `model_type`s its runner takes
    mtp_layout: str           # one of MTP_LAYOUTS
    # The text config -> the MTP's spec; (spec, text config, keys) -> its decoder block. `keys` are the
    # checkpoint's block tensor names relative to `layers.0.` (None: decide from the config alone).
    mtp_spec: Callable[[dict], MTPSpec]
    mtp_block: Callable[..., nn.Module]
    runner: type[StaticCacheRunner]
    micro: str                # its micro target: a dmtp.tiny preset, or a family tests/test_real_targets.py writes
    test: str                 # the test file that checks it end to end (relative to the repository root)
    # The `model_type`s whose native MTP it builds, when fewer than `model_types` (None: all of them).
    mtp_model_types: tuple[str, ...] | None = None

    def __post_init__(self):
        if self.mtp_layout not in MTP_LAYOUTS:
            raise ValueError(f"family {self.name!r}: mtp_layout must be one of {MTP_LAYOUTS}, got {self.mtp_layout!r}")
        if self.runner.family != self.name:
            raise ValueError(f"family {self.name!r}: its runner {self.runner.__name__} says family "
                             f"{self.runner.family!r}")

    @property
    def mtp_types(self) -> tuple[str, ...]:
        return self.model_types if self.mtp_model_types is None else self.mtp_model_types


__all__ = ["Family", "MTP_LAYOUTS"]
