"""Composing dmtp's Hydra configs from Python (tests, tools, notebooks) with the compose API, and building a
component from its config group (`instantiate`: its own error, one line)."""
from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.errors import InstantiationException
from hydra.utils import instantiate as hydra_instantiate
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


def instantiate(node, *args, **kwargs):
    """Hydra's instantiate, but a component's own error surfaces as itself (one clear line), not
    wrapped in Hydra's multi-line InstantiationException."""
    try:
        return hydra_instantiate(node, *args, **kwargs)
    except InstantiationException as e:
        if e.__cause__ is not None:
            raise e.__cause__ from None
        raise
