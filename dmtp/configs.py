"""Composing dmtp's Hydra configs from Python (tests, tools, notebooks) with the compose API."""
from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import open_dict

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")

# The real configs shrunk to the micro target: seconds per run on 2 CPU cores.
TINY_OVERRIDES = ["debug=tiny_budget", "logger=none", "callbacks=none", "data.max_examples=40"]


def compose_config(config_name: str, overrides=(), output_dir=None):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name=config_name, overrides=list(overrides), return_hydra_config=output_dir is not None)
    if output_dir is not None:
        with open_dict(cfg):
            cfg.paths.output_dir = str(output_dir)
            cfg.hydra = None
    return cfg


def compose_train(overrides=(), output_dir=None, tiny: bool = True):
    return compose_config("train", (TINY_OVERRIDES if tiny else []) + list(overrides), output_dir)
