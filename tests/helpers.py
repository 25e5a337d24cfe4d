"""Config composition for tests: the real Hydra configs, shrunk to the micro target."""
from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import open_dict

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")

# Small enough for seconds per run on 2 CPU cores.
TINY_OVERRIDES = ["debug=tiny_budget", "logger=none", "callbacks=none", "data.max_examples=40"]


def compose_train(overrides=(), output_dir=None, tiny: bool = True):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="train", overrides=(TINY_OVERRIDES if tiny else []) + list(overrides),
                      return_hydra_config=output_dir is not None)
    if output_dir is not None:
        with open_dict(cfg):
            cfg.paths.output_dir = str(output_dir)
            cfg.hydra = None
    return cfg
