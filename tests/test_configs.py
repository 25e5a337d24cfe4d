"""Every shipped config composes, and every group option instantiates."""
from pathlib import Path

import pytest
from hydra.utils import instantiate

from dmtp.injection import VARIANTS
from dmtp.configs import CONF_DIR, compose_train

GROUPS = {p.name: sorted(f.stem for f in p.glob("*.yaml")) for p in Path(CONF_DIR).iterdir() if p.is_dir()}


def test_every_injection_variant_has_a_config_and_vice_versa():
    assert set(GROUPS["injection"]) == set(VARIANTS)


@pytest.mark.parametrize("group,option", [(g, o) for g, opts in GROUPS.items() if g != "hydra" for o in opts])
def test_option_composes(group, option):
    prefix = "+" if group == "sweep" else ""  # sweeps are appended: python -m dmtp.train -m +sweep=<name>
    cfg = compose_train([f"{prefix}{group}={option}"], tiny=False)
    if group not in ("logger", "callbacks", "experiment", "debug", "sweep"):  # global overlays leave no node
        assert cfg[group] is not None


def test_default_config_shape():
    cfg = compose_train(tiny=False)
    assert cfg.injection._target_.endswith("DualAnchorZeroInit")
    assert cfg.target.preset == "assistant" and cfg.target.path is None
    assert list(cfg.data.domains) == ["code", "math"]  # prose held out by default


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_injection_instantiates(name):
    cfg = compose_train([f"injection={name}"])
    for block_size in (4, 8, 16):
        inj = instantiate(cfg.injection)(hidden_size=32, num_target_features=3, mask_token_id=5,
                                         block_size=block_size)
        assert type(inj) is VARIANTS[name]
        assert inj.num_drafter_candidates + (1 if inj.uses_mtp else 0) == inj.num_candidates == block_size - 1
        assert inj.num_slots == block_size - inj.first_slot_offset


def test_trainer_logger_callbacks_instantiate(tmp_path):
    cfg = compose_train(["logger=tensorboard", "callbacks=default"], output_dir=tmp_path, tiny=False)
    for group in ("logger", "callbacks"):
        for node in cfg[group].values():
            assert instantiate(node) is not None
    for option in GROUPS["trainer"]:
        if option == "gpu":
            continue  # needs CUDA devices to instantiate (trainer=fsdp runs on CPU ranks: tests/test_fsdp.py)
        c = compose_train([f"trainer={option}", "trainer.devices=1", "trainer.accelerator=cpu"],
                          output_dir=tmp_path, tiny=False)
        instantiate(c.trainer, logger=False, enable_checkpointing=False)
