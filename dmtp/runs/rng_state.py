"""Random state that survives a resume, so a resumed run repeats the uninterrupted one step for step.

Training draws its block anchors from the global RNGs (`sample_anchors`), which Lightning does not
checkpoint, and which other work between steps also draws from (a DataLoader iterator's seed at each
validation or epoch start). `ResumableRNG` makes training's draws a stream of their own: it records
the RNGs after every training step, puts them back before the next one, and carries them in every
checkpoint, so a resumed run continues the very same stream. `dmtp.train` always adds it.
"""
from __future__ import annotations

import random

import lightning as L
import numpy as np
import torch


def collect_rng_states() -> dict:
    """Every global RNG, as tensors and plain numbers (loadable with `weights_only=True`)."""
    np_state = np.random.get_state(legacy=False)
    states = {"torch": torch.get_rng_state(), "python": random.getstate(),
              "numpy": {"key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
                        "pos": int(np_state["state"]["pos"]), "has_gauss": int(np_state["has_gauss"]),
                        "gauss": float(np_state["gauss"])}}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    n = states["numpy"]
    np.random.set_state({"bit_generator": "MT19937", "state": {"key": n["key"].numpy().astype(np.uint32),
                                                               "pos": n["pos"]},
                         "has_gauss": n["has_gauss"], "gauss": n["gauss"]})
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


class ResumableRNG(L.Callback):
    def __init__(self):
        self._after_step: dict | None = None   # the RNGs after the latest training step (or from a checkpoint)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._after_step is not None:
            set_rng_states(self._after_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._after_step = collect_rng_states()

    def state_dict(self) -> dict:
        return {"rng": self._after_step if self._after_step is not None else collect_rng_states()}

    def load_state_dict(self, state_dict: dict) -> None:
        self._after_step = state_dict.get("rng")
