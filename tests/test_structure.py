"""A base module never imports the module built on it: drafter architectures register themselves, each in its
own file (the import rules themselves, circles, tiers and commands, are tests/test_layering.py)."""
from __future__ import annotations

import json
from dataclasses import fields, replace

import pytest

from dmtp.drafters.checkpoint import load_drafter, save_drafter
from dmtp.drafters.dflash import DFlashConfig, DFlashDrafter
from dmtp.drafters.dflash2 import DFLASH2_ARCH, DFlash2Config, DFlash2Drafter
from dmtp.drafters.dspark import DSPARK_ARCH, DSparkConfig, DSparkDrafter
from dmtp.drafters.factory import build_drafter
from dmtp.drafters.registry import ARCHITECTURES, DFLASH_ARCH, architecture_named, drafter_class, register_drafter

SIZES = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
             head_dim=16, vocab_size=50, num_target_layers=2, target_layer_ids=[0], mask_token_id=3)


def test_drafter_architectures_are_registered():
    assert {a.name: (a.published, a.dmtp_published, a.config, a.module) for a in ARCHITECTURES.values()} == {
        "dflash": (DFLASH_ARCH, "DMTPDraftModel", DFlashConfig, DFlashDrafter),
        "dflash2": (DFLASH2_ARCH, "DMTPDFlash2DraftModel", DFlash2Config, DFlash2Drafter),
        "dspark": (DSPARK_ARCH, "DMTPDSparkDraftModel", DSparkConfig, DSparkDrafter)}
    config = DFlashConfig(**SIZES)
    assert drafter_class(config) is DFlashDrafter
    saved = ARCHITECTURES.pop(DFLASH_ARCH)
    try:
        with pytest.raises(ValueError, match="no drafter class is registered for architecture 'DFlashDraftModel'"):
            drafter_class(config)
    finally:
        ARCHITECTURES[DFLASH_ARCH] = saved


class _Target:
    class config:
        hidden_size, num_attention_heads, num_key_value_heads, head_dim, vocab_size = 32, 2, 2, 16, 50
        num_hidden_layers, intermediate_size, rms_norm_eps, max_position_embeddings = 2, 64, 1e-6, 256
        rope_theta = 10000.0


def test_the_factory_passes_an_architectures_options_to_its_own_config():
    """No architecture is named in the factory: options reach the registered config class, which checks them."""
    d2 = build_drafter(_Target, 32, 3, target_layer_ids=[0], architecture="dflash2", conv_kernel_size=3,
                       conv_group_size=8, selector_rank=4, selector_top_k=5, selector_alpha=0.5)
    assert type(d2) is DFlash2Drafter and (d2.config.conv_kernel_size, d2.config.selector_alpha) == (3, 0.5)
    with pytest.raises(ValueError, match="must divide"):
        build_drafter(_Target, 32, 3, target_layer_ids=[0], architecture="dflash2", conv_kernel_size=2,
                      conv_group_size=5, selector_rank=4, selector_top_k=5)
    with pytest.raises(ValueError, match="drafter architecture 'dflash' has no option conv_kernel_size "
                                         r"\(its options: none\)"):
        build_drafter(_Target, 32, 3, target_layer_ids=[0], architecture="dflash", conv_kernel_size=2)
    with pytest.raises(ValueError, match="drafter architecture must be one of dflash, dflash2, dspark, got 'dflash3'"):
        build_drafter(_Target, 32, 3, target_layer_ids=[0], architecture="dflash3")


def test_a_new_architecture_is_one_registered_class(tmp_path):
    """A third architecture registers in its own file; the factory builds it and save/load round-trip it by name."""
    from dataclasses import dataclass

    @dataclass
    class WideConfig(DFlashConfig):
        widen: int | None = None

        def check_options(self):
            if not isinstance(self.widen, int) or self.widen < 1:
                raise ValueError(f"widen must be an integer >= 1, got {self.widen!r}")

        def options_to_hf(self):
            return {"widen": self.widen}

        @classmethod
        def options_from_hf(cls, pick):
            return {"widen": pick("widen")}

    @register_drafter(name="wide", published="WideDraftModel", dmtp_published="DMTPWideDraftModel", config=WideConfig)
    class WideDrafter(DFlashDrafter):
        pass

    try:
        drafter = build_drafter(_Target, 32, 3, target_layer_ids=[0], architecture="wide", widen=2)
        assert type(drafter) is WideDrafter and architecture_named("wide").module is WideDrafter
        save_drafter(tmp_path, drafter, dmtp_architecture=True)
        raw = json.loads((tmp_path / "config.json").read_text())
        assert raw["architectures"] == ["DMTPWideDraftModel"] and raw["dflash_config"]["widen"] == 2
        loaded, _, _ = load_drafter(tmp_path)
        assert type(loaded) is WideDrafter and loaded.config == drafter.config
    finally:
        ARCHITECTURES.pop("WideDraftModel")


@pytest.mark.parametrize("name", sorted(a.name for a in ARCHITECTURES.values()))
def test_no_architecture_writes_a_training_option_to_its_export(name, tmp_path):
    """An export describes the model: an architecture's training-only fields (its config's `training_options`)
    never reach config.json, at the top level or under dflash_config; the reloaded drafter has the defaults."""
    arch = architecture_named(name)
    config = arch.config(**SIZES)
    assert set(config.training_options) <= set(arch.config.option_names())
    moved = {}
    for k in config.training_options:
        v = getattr(config, k)
        moved[k] = ("skip" if v == "replace" else "replace") if isinstance(v, str) else v + 2
    drafter = arch.module(replace(config, **moved))
    save_drafter(tmp_path, drafter)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert not set(config.training_options) & (set(raw) | set(raw["dflash_config"])), name
    loaded, _, _ = load_drafter(tmp_path)
    assert loaded.config == config, name


def test_every_option_that_configures_training_only_is_declared_as_such():
    """DSpark's confidence weight and DFlash2's selector schedule are the training-only fields there are."""
    assert {a.name: set(a.config.training_options) for a in ARCHITECTURES.values()} == {
        "dflash": set(),
        "dflash2": {"selector_alpha", "selector_warmup_steps", "selector_ramp_steps", "selector_gold_outside_topk"},
        "dspark": {"confidence_loss_weight"}}


def test_with_training_options_takes_a_runs_schedule_and_checks_it():
    config = DFlash2Config(**SIZES, conv_group_size=8)
    run = {"selector_warmup_steps": 5, "selector_alpha": None, "num_layers": 3, "confidence_loss_weight": 2.0}
    assert config.with_training_options(run) == replace(config, selector_warmup_steps=5)
    assert DFlashConfig(**SIZES).with_training_options(run) == DFlashConfig(**SIZES)
    with pytest.raises(ValueError, match="must be >= 0"):
        config.with_training_options({"selector_ramp_steps": -1})


def test_the_decode_state_the_data_module_and_the_lightning_module_are_built_from_small_records():
    """They took 14, 29 and 14 loose options; each group is now one typed record (sizes, widths, reads; source,
    regeneration, validation, loader; objective, walk, joint MTP), so a new option lands in its group, not in a
    longer signature."""
    import inspect

    from dmtp.decode.state import DecodeState, ProposerReads, StateSize, TargetWidths
    from dmtp.training.datamodule import DraftDataModule
    from dmtp.training.data_options import FeatureOptions, LoaderOptions, RegenOptions, SourceOptions, ValidationOptions

    def params(cls):
        return list(inspect.signature(cls.__init__).parameters)[1:]

    assert params(DecodeState)[:3] == ["size", "widths", "reads"] and len(params(DecodeState)) <= 6
    assert inspect.signature(DecodeState.__init__).parameters["size"].annotation == "StateSize"
    for record in (StateSize, TargetWidths, ProposerReads, SourceOptions, RegenOptions, ValidationOptions,
                   LoaderOptions, FeatureOptions):
        assert len(inspect.signature(record).parameters) <= 12, record.__name__
    assert params(DraftDataModule) == ["tokenizer", "target", "source", "regen", "val", "loader", "features", "seed"]
    from dmtp.training.module import DMTPModule
    from dmtp.training.module_options import FLAT_KEYS, RECORDS

    assert params(DMTPModule) == ["target", "mtp", "drafter", "optimizer", "scheduler", "objective", "walk", "joint"]
    # conf/train.yaml's flat model.* keys are exactly the records' fields (besides the optimizer and schedule).
    from dmtp.configs import compose_train

    flat = set(compose_train([]).model) - {"_target_", "_partial_", "optimizer", "scheduler"}
    assert flat == set(FLAT_KEYS)
    assert set(FLAT_KEYS.values()) == {(r, f.name) for r, cls in RECORDS.items() for f in fields(cls)}
