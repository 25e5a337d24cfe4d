"""The data module's options are typed records, one per concern (dmtp.training.data_options); conf/data keeps its
flat keys, and one table says which record each belongs to."""
from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dmtp.configs import compose_train
from dmtp.training.data_options import (FLAT_KEYS, LoaderOptions, RegenOptions, SourceOptions, ValidationOptions,
                                        grouped)
from dmtp.training.datamodule import DraftDataModule

DATA_OPTIONS = ("embedded", "regenerated", "files", "hf")


@pytest.mark.parametrize("option", DATA_OPTIONS)
def test_every_shipped_data_key_has_its_record(option):
    extra = {"files": ["data.files=[/x.jsonl]"], "hf": ["data.hf_dataset=some/set"]}.get(option, [])
    data = OmegaConf.to_container(compose_train([f"data={option}", *extra], tiny=False).data, resolve=True)
    flat = {k: v for k, v in data.items() if k not in ("_target_", "_partial_", "seed")}
    assert set(flat) <= set(FLAT_KEYS)
    records = grouped(flat)
    assert isinstance(records["source"], SourceOptions) and isinstance(records["regen"], RegenOptions)
    assert isinstance(records["val"], ValidationOptions) and isinstance(records["loader"], LoaderOptions)
    assert records["loader"].seq_len == flat["seq_len"] and records["val"].prompts == flat["val_prompts"]
    assert records["regen"].enabled == flat["regenerate"] and records["source"].source == flat["source"]
    assert records["regen"].settings(3).new_tokens == flat["regen_new_tokens"]


def test_unknown_or_bad_options_are_one_line():
    with pytest.raises(ValueError, match="unknown data option"):
        grouped({"regen_new_tokenz": 5})
    with pytest.raises(ValueError, match="unknown corpus domain"):
        grouped({"val_domains": ["poetry"]})
    with pytest.raises(ValueError, match="data=hf needs data.hf_dataset"):
        grouped({"source": "hf"})


def test_the_data_module_takes_records_not_thirty_options():
    params = list(inspect.signature(DraftDataModule.__init__).parameters)
    assert params == ["self", "tokenizer", "target", "source", "regen", "val", "loader", "features", "seed"]


def test_the_feature_cache_options_are_the_spec_s_fields_with_its_defaults():
    """What the feature cache stores is declared once (FeatureSpec): each stored field is a data.feature_<name>
    key of the shipped config, with the spec's default."""
    from dataclasses import fields

    from dmtp.datagen.feature_spec import FeatureSpec
    from dmtp.training.data_options import STORED

    data = OmegaConf.load(Path(__file__).resolve().parents[1] / "conf" / "data" / "embedded.yaml")
    defaults = {f.name: f.default for f in fields(FeatureSpec)}
    assert set(STORED) == {"codec", "rank", "mtp_rank", "mtp_hidden", "last_hidden", "labels", "top_k"}
    assert {name: data[f"feature_{name}"] for name in STORED} == {name: defaults[name] for name in STORED}
    assert all(FLAT_KEYS[f"feature_{name}"] == ("features", name) for name in STORED)
