"""Composing dmtp's Hydra configs from Python (tests, tools, notebooks) with the compose API, building a
component from its config group (`instantiate`: its own error, one line), and grouping a group's flat options
into the typed records a component takes (`records_from_flat`)."""
from __future__ import annotations

import re
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.errors import InstantiationException
from hydra.utils import instantiate as hydra_instantiate
from omegaconf import OmegaConf, open_dict

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")

# The real configs shrunk to the micro target: seconds per run on 2 CPU cores.
TINY_OVERRIDES = ["debug=tiny_budget", "logger=none", "callbacks=none", "data.max_examples=40"]


_PLAIN_VALUE = re.compile(r"[\w./:@~+-]*")


def override(key: str, value) -> str:
    """`key=value` as a shell reads it into a Hydra override: a value holding what the override grammar parses ('=',
    ',', spaces, brackets, quotes: a sweep job's directory, `0_injection=raw_dflash,seed=0`) is quoted for Hydra and
    the whole for the shell, `"key='value'"`, so a printed command runs as pasted."""
    text = str(value)
    if _PLAIN_VALUE.fullmatch(text):
        return f"{key}={text}"
    if any(c in text for c in "'\"$`\\"):
        raise ValueError(f"{key}: {text!r} holds a quote, '$' or '\\'; rename it to pass it as an override")
    return f"\"{key}='{text}'\""


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


def records_from_flat(flat: dict, flat_keys: dict[str, tuple[str, str]], records: dict[str, type], group: str) -> dict:
    """A config group's flat options -> {record name: record}, each key placed by `flat_keys` (key -> (record,
    field)), the one table of that group; an unknown key is one line naming it.

    Config values become plain Python (lists become tuples, as frozen records hold them); each record checks its own
    fields."""
    unknown = sorted(set(flat) - set(flat_keys))
    if unknown:
        raise ValueError(f"unknown {group} option(s) {', '.join(f'{group}.{k}' for k in unknown)}; "
                         f"known: {', '.join(sorted(flat_keys))}")
    fields: dict[str, dict] = {name: {} for name in records}
    for key, value in flat.items():
        record, name = flat_keys[key]
        value = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        fields[record][name] = tuple(value) if isinstance(value, list) else value
    return {name: cls(**fields[name]) for name, cls in records.items()}
