"""The variant catalogue is the one list of injection variants: the Hydra YAMLs, the loader, the sweep
report and the README table all agree with it, and saved drafters rebuild from it."""
import json
from pathlib import Path

import pytest
import yaml

from dmtp.configs import CONF_DIR
from dmtp.drafters.block_drafter import fresh_drafter_for, load_block_drafter
from dmtp.injection import CATALOGUE, Injection
from dmtp.injection.catalogue import make_injection
from dmtp.injection.catalogue import register_variant
from dmtp.injection.readme_table import README, render_table, table_in
from dmtp.reports.sweep import INTERFACES

YAMLS = {p.stem: yaml.safe_load(p.read_text()) for p in (Path(CONF_DIR) / "injection").glob("*.yaml")}


def test_every_yaml_names_a_registered_variant_and_every_variant_has_one():
    assert set(YAMLS) == set(CATALOGUE)


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_yaml_agrees_with_the_catalogue(name):
    cfg, entry = dict(YAMLS[name]), CATALOGUE[name]
    assert cfg.pop("_target_") == entry.target_path
    assert cfg.pop("_partial_") is True          # the drafter supplies the structural arguments
    unknown = set(cfg) - set(entry.options)
    assert not unknown, f"conf/injection/{name}.yaml sets {unknown}, not options of {entry.cls.__name__}"
    for key, value in cfg.items():                # a YAML that lists an option shows the class default
        assert value == entry.options[key].default, f"{name}.{key}: YAML {value!r} != class default"


def test_readme_table_is_the_catalogue():
    assert table_in(README.read_text()) == render_table(), \
        "README.md's variants table is stale: run python -m dmtp.injection.readme_table"


def test_report_labels_come_from_the_catalogue():
    for name, entry in CATALOGUE.items():
        assert INTERFACES[name] == entry.label
        assert INTERFACES[f"{name}+dflash2"] == f"DFlash2 {entry.label}"


def test_options_come_from_the_signature():
    assert list(CATALOGUE["multi_mtp_zero_init"].options) == ["max_mtp_tokens", "mtp_threshold", "num_mtp_tokens"]
    rank = CATALOGUE["hidden_residual_t1"].options["rank"]
    assert (rank.default, rank.annotation) == (64, "int")
    assert CATALOGUE["token_only"].options == {}
    with pytest.raises(ValueError, match="'rank' is not an option of injection token_only"):
        make_injection("token_only", 16, 1, 3, 8, rank=8)


def test_needs_mtp_is_derived_per_variant():
    for entry in CATALOGUE.values():
        assert entry.cls.needs_mtp == (entry.cls.uses_mtp or entry.cls.needs_mtp_context)
    assert not CATALOGUE["raw_dflash"].cls.needs_mtp and CATALOGUE["mtp_context_only"].cls.needs_mtp


def test_a_name_registers_once():
    with pytest.raises(ValueError, match="registered twice"):
        register_variant(name="token_only", slots="[T1]", injected="")(type("Again", (Injection,), {}))
    assert CATALOGUE["token_only"].cls.__name__ == "TokenOnly"


def test_built_options_are_saved_and_rebuild(micro_target, tmp_path):
    drafter = fresh_drafter_for(micro_target, "hidden_residual_t1", 3, rank=8)
    assert drafter.injection.variant_options == {"rank": 8}
    drafter.save(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["dmtp"]["injection_kwargs"] == {"rank": 8}
    loaded = load_block_drafter(tmp_path)[0].injection
    assert loaded.variant_options == {"rank": 8} and loaded.residual.down.out_features == 8
    defaults = fresh_drafter_for(micro_target, "multi_mtp_zero_init", 3).injection
    assert defaults.variant_options == {"max_mtp_tokens": 3, "mtp_threshold": None, "num_mtp_tokens": None}


def test_an_export_with_the_old_normalised_options_still_loads(micro_target, tmp_path):
    """Exports before the catalogue saved hand-set init_kwargs (mtp_threshold as a float or null)."""
    fresh_drafter_for(micro_target, "multi_mtp_zero_init", 3).save(tmp_path)
    cfg_path = tmp_path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["dmtp"]["injection_kwargs"] = {"max_mtp_tokens": 3, "mtp_threshold": 0.6, "num_mtp_tokens": 2}
    cfg_path.write_text(json.dumps(cfg))
    loaded = load_block_drafter(tmp_path)[0].injection
    assert (loaded.mtp_threshold, loaded.mtp_steps, loaded.max_mtp_tokens) == (0.6, 2, 3)
