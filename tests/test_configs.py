"""Every shipped config composes, and every group option instantiates."""
from pathlib import Path

import pytest
from hydra.utils import instantiate

from dmtp.injection import VARIANTS
from dmtp.injection.catalogue import CATALOGUE
from dmtp.configs import CONF_DIR, compose_train

GROUPS = {p.name: sorted(f.stem for f in p.glob("*.yaml")) for p in Path(CONF_DIR).iterdir() if p.is_dir()}


def test_every_injection_variant_has_a_config_and_vice_versa():
    assert set(GROUPS["injection"]) == set(VARIANTS)


@pytest.mark.parametrize("group,option", [(g, o) for g, opts in GROUPS.items() if g != "hydra" for o in opts])
def test_option_composes(group, option):
    prefix = "+" if group == "sweep" else ""  # sweeps are appended: python -m dmtp.train -m +sweep=<name>
    cfg = compose_train([f"{prefix}{group}={option}"], tiny=False)
    overlays = ("logger", "callbacks", "experiment", "debug", "sweep", "recipe", "production")   # they leave no node
    if group not in overlays:
        assert cfg[group] is not None


def test_default_config_shape():
    """No arguments train the seed's production method: dual-anchor zero-init DMTP on the DFlash backbone, DFlash's
    position-decayed CE on the target's greedy responses, T1 from the data, the MTP frozen and uncorrected, on data
    covering every workload the protocol decodes (SPEC §8); the held-out contrast is the shipped prompt sets."""
    cfg = compose_train(tiny=False)
    assert cfg.injection._target_.endswith("DualAnchorZeroInit") and cfg.drafter.get("architecture", "dflash") == "dflash"
    assert (cfg.model.loss, cfg.model.label_source, cfg.data.regen_temperature) == ("ce", "target", 0.0)
    assert cfg.model.t1_source == "data" and not cfg.model.train_mtp and cfg.drafter.mtp_correction_rank == 0
    assert cfg.target.preset == "assistant" and cfg.target.path is None
    assert set(cfg.data.domains) == {"code", "prose", "math"}
    assert {"code_tasks", "prose_tasks"} <= set(cfg.decode_eval.domains)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_injection_instantiates(name):
    cfg = compose_train([f"injection={name}"])   # multi_mtp_zero_init's own M = 3 fits every block size below
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


def test_the_default_run_is_the_seeds_dmtp_row():
    """No arguments train what `injection=dual_anchor_zero_init` names; the toolkit's stacks are one experiment each."""
    assert compose_train(tiny=False) == compose_train(["injection=dual_anchor_zero_init"], tiny=False)
    assert compose_train(tiny=False) == compose_train(["experiment=study_dmtp", "decode_eval.methods=[ar,mtp415,mtp:7,drafter]"], tiny=False)
    greedy = compose_train(["experiment=greedy"], tiny=False)
    assert greedy.injection._target_.endswith("DualAnchorZeroInit") and greedy.drafter.mtp_correction_rank > 0
    assert greedy.drafter.architecture == "dspark"
    assert (greedy.model.loss, greedy.model.label_source, greedy.data.regen_temperature) == ("ce", "target", 0.0)
    sampled = compose_train(["experiment=sampled"], tiny=False)
    assert sampled.injection._target_.endswith("MultiMTPZeroInit") and sampled.injection.max_mtp_tokens == 7
    assert sampled.drafter.mtp_correction_rank > 0 and sampled.model.loss == "dspark"


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_variant_alone_is_the_seeds_row(name):
    """`injection=<variant>` swaps the variant only: the seed's backbone, loss and recipe stay, nothing of the
    toolkit's stacks (DSpark heads, the MTP correction, a chain longer than the variant's own) leaks in."""
    cfg = compose_train([f"injection={name}"], tiny=False)
    default = compose_train(tiny=False)
    assert cfg.model.loss == "ce" and set(cfg.injection) <= {"_target_", "_partial_", *CATALOGUE[name].options}
    assert cfg.drafter == default.drafter and cfg.model == default.model and cfg.data == default.data
    assert compose_train([f"injection={name}", "recipe=sampled"], tiny=False).model.loss == "dspark"


def _recipe(cfg) -> tuple:
    return cfg.model.loss, cfg.model.label_source, cfg.model.label_temperature, cfg.data.regen_temperature


SAMPLED_RECIPE, GREEDY_RECIPE = ("dspark", "target_kl", 1.0, 1.0), ("ce", "target", 1.0, 0.0)


@pytest.mark.parametrize("row", [o for o in GROUPS["experiment"] if o.startswith("study_")])
def test_study_rows_name_their_recipe(row):
    """Each study row keeps the recipe its published numbers came from, whatever the default."""
    expected = SAMPLED_RECIPE if row.endswith("_sampled") else GREEDY_RECIPE
    assert _recipe(compose_train([f"experiment={row}"], tiny=False)) == expected


@pytest.mark.parametrize("sweep", ["ablation", "drafters", "dspark", "dspark_main", "main"])
def test_base_model_sweeps_keep_the_greedy_recipe(sweep):
    assert _recipe(compose_train([f"+sweep={sweep}"], tiny=False)) == GREEDY_RECIPE


def test_a_printed_override_composes_as_pasted(tmp_path):
    """A sweep job's directory holds '=' and ','; the override dmtp prints for it must reach Hydra whole."""
    import shlex

    from dmtp.configs import override

    job = tmp_path / "0_injection=raw_dflash,seed=0" / "drafter"
    assert override("init_from", "/plain/dir_1.x") == "init_from=/plain/dir_1.x"
    (arg,) = shlex.split(override("init_from", job))          # what the shell hands Python
    assert compose_train([arg], tiny=False).init_from == str(job)
    with pytest.raises(ValueError, match="quote"):
        override("init_from", "/a/it's")
