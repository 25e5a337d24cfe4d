"""The LightningModule's options as three small records: what the loss trains toward (`Objective`), the exact
validation walk (`WalkOptions`) and joint training of the MTP (`JointMTP`).

Each checks its own values.

conf/train.yaml's `model:` keeps its flat keys (`model.num_anchors=512`, `model.val_walk=false`, ...);
`FLAT_KEYS` is the one table from a flat key to its record and field, read by `grouped`, which the Hydra entry
point (`dmtp.training.module.dmtp_module`) calls.
"""
from __future__ import annotations

from dataclasses import dataclass

from dmtp.configs import records_from_flat
from dmtp.training.losses import require_loss, require_temperature

# data: CE on the data tokens | target: CE on the target's own greedy token at each position |
# target_kl: KL from the target's whole next-token distribution (soft distillation labels)
LABEL_SOURCES = ("data", "target", "target_kl")
# data: T1 is the data token (teacher forcing) | mtp: T1 is the MTP's own greedy token, as in decoding;
# a block whose T1 differs from the data token gets no loss (nothing after a rejected T1 is verified)
T1_SOURCES = ("data", "mtp")


@dataclass(frozen=True)
class Objective:
    """Anchored blocks per row, the per-slot loss (`loss`: ce | tv | dspark, dmtp/training/losses.py) with its
    position decay, and where its labels and T1 come from."""
    num_anchors: int = 32
    loss: str = "ce"
    loss_gamma: float = 4.0
    label_source: str = "data"
    t1_source: str = "data"
    label_temperature: float = 1.0   # the distributions KL / TV compare: softmax(logits / T) (the serving temperature)

    def __post_init__(self):
        n = self.num_anchors
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:   # 0 trained one block per row, silently
            raise ValueError(f"model.num_anchors must be an integer >= 1 (blocks drawn per row), got {n!r}")
        require_loss(self.loss)
        object.__setattr__(self, "label_temperature", require_temperature(self.label_temperature))
        if self.label_source not in LABEL_SOURCES:
            raise ValueError(f"label_source must be one of {', '.join(LABEL_SOURCES)}, got {self.label_source!r}")
        if self.t1_source not in T1_SOURCES:
            raise ValueError(f"t1_source must be one of {', '.join(T1_SOURCES)}, got {self.t1_source!r}")

    @property
    def loss_mix(self) -> tuple[float, float]:
        """(CE weight, TV weight) of `loss`."""
        return require_loss(self.loss)


@dataclass(frozen=True)
class WalkOptions:
    """The exact greedy walk over the held-out rows at each validation, and the MTP chained `mtp_chain_steps`
    times on its own over the same rows beside it (0: off; the module checks it against the drafter's block)."""
    enabled: bool = True
    mtp_chain_steps: int = 4


@dataclass(frozen=True)
class JointMTP:
    """The MTP's own layers train with the drafter, with their own next-token loss weighted `loss_weight`."""
    train: bool = False
    loss_weight: float = 1.0

    def __post_init__(self):
        if self.train not in (True, False):
            raise ValueError(f"train_mtp must be true or false, got {self.train!r}")
        w = self.loss_weight
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not w >= 0:
            raise ValueError(f"mtp_loss_weight must be a number >= 0, got {w!r}")
        object.__setattr__(self, "loss_weight", float(w))


RECORDS = {"objective": Objective, "walk": WalkOptions, "joint": JointMTP}
FLAT_KEYS: dict[str, tuple[str, str]] = {
    **{k: ("objective", k) for k in ("num_anchors", "loss", "loss_gamma", "label_source", "t1_source",
                                     "label_temperature")},
    "val_walk": ("walk", "enabled"), "val_mtp_chain_steps": ("walk", "mtp_chain_steps"),
    "train_mtp": ("joint", "train"), "mtp_loss_weight": ("joint", "loss_weight"),
}


def grouped(flat: dict) -> dict:
    """conf/train.yaml's flat `model.*` options -> {record name: record}; an unknown key is one line."""
    return records_from_flat(flat, FLAT_KEYS, RECORDS, "model")


# conf/train.yaml's `model:` keys that are the entry point's own arguments (dmtp.training.module.dmtp_module), not options
MODULE_ARGUMENTS = ("_target_", "_partial_", "optimizer", "scheduler")


MODULE = "dmtp.training.module.dmtp_module"   # conf/train.yaml's `model:` entry point (its `_target_`)


def options_of(model_cfg) -> dict | None:
    """conf/train.yaml's whole `model:` node -> its records, as `dmtp_module` builds them (before any module is);
    None for another module than dmtp's."""
    if model_cfg.get("_target_") != MODULE:
        return None
    return grouped({k: model_cfg[k] for k in model_cfg if k not in MODULE_ARGUMENTS})


__all__ = ["FLAT_KEYS", "JointMTP", "LABEL_SOURCES", "MODULE_ARGUMENTS", "Objective", "RECORDS", "T1_SOURCES",
           "WalkOptions", "grouped", "options_of"]
