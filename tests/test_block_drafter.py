"""The block drafter is one unit: a backbone and its injection built, trained, saved and loaded together,
and no API takes the two apart."""
from __future__ import annotations

import inspect
import json

import pytest
import torch
from safetensors.torch import load_file

from dmtp.configs import compose_train
from dmtp.decode import build_proposer
from dmtp.decode.proposers import DrafterProposer, DrafterState
from dmtp.decode.reference import propose_drafter
from dmtp.drafters.block_drafter import BlockDrafter, build_block_drafter, fresh_drafter_for, load_block_drafter
from dmtp.drafters.checkpoint import save_drafter
from dmtp.drafters.dflash import DFlashDrafter
from dmtp.drafters.dflash2 import DFlash2Drafter
from dmtp.inference.drafter_choice import load_drafter_for, method_needs_mtp
from dmtp.injection.catalogue import make_injection
from dmtp.training.blocks import draft_blocks, teacher_features
from dmtp.training.evaluate import decode_after_training
from dmtp.training.components import build_components
from dmtp.training.module import DMTPModule
from dmtp.training.validation import candidate_matches, exact_acceptance
import dmtp.drafters.block_drafter as block_drafter_module


@pytest.mark.parametrize("api", [build_proposer, DMTPModule.__init__, DrafterProposer.__init__, DrafterState.__init__,
                                 draft_blocks, teacher_features, candidate_matches, exact_acceptance, propose_drafter,
                                 decode_after_training, method_needs_mtp])
def test_no_api_takes_an_injection_beside_its_drafter(api):
    assert "injection" not in inspect.signature(api).parameters


@pytest.mark.parametrize("name,architecture", [("dual_anchor_zero_init", "dflash"), ("mtp_context_only", "dflash"),
                                               ("multi_mtp_zero_init", "dflash2")])
def test_build_save_load_round_trip(micro_target, tmp_path, name, architecture):
    torch.manual_seed(0)
    extra = {"selector_rank": 8, "selector_top_k": 4} if architecture == "dflash2" else {}
    drafter = build_block_drafter(micro_target, name, 3, num_target_features=2, architecture=architecture, **extra)
    backbone_cls = DFlash2Drafter if architecture == "dflash2" else DFlashDrafter
    assert type(drafter.backbone) is backbone_cls and drafter.variant == name
    assert drafter.config.context_dim == drafter.injection.context_dim   # sized from the injection, no probe
    with torch.no_grad():
        for p in drafter.injection.parameters():
            p.add_(0.1)
    drafter.save(tmp_path, target="somewhere")
    stored = load_file(str(tmp_path / "model.safetensors"))
    assert set(stored) == set(drafter.backbone.state_dict()) | {
        "dmtp_injection." + k for k in drafter.injection.state_dict()}   # the published names + the injection's
    config = json.loads((tmp_path / "config.json").read_text())
    meta = config["dmtp"]
    assert meta["injection"] == name and meta["target"] == "somewhere"
    # Named apart from the published drafter it is not (no engine runs it as raw DFlash).
    assert config["architectures"] == ["DMTPDFlash2DraftModel" if architecture == "dflash2" else "DMTPDraftModel"]
    loaded, saved = load_block_drafter(tmp_path)
    assert saved == meta and loaded.variant == name and type(loaded.backbone) is backbone_cls
    mine, theirs = drafter.state_dict(), loaded.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


@pytest.mark.parametrize("architecture", ["dflash", "dflash2"])
def test_a_raw_dflash_export_is_exactly_the_published_layout(micro_target, tmp_path, architecture):
    extra = {"selector_rank": 8, "selector_top_k": 4} if architecture == "dflash2" else {}
    drafter = build_block_drafter(micro_target, "raw_dflash", 3, num_target_features=2, architecture=architecture,
                                  **extra)
    drafter.save(tmp_path / "export")
    save_drafter(tmp_path / "published", drafter.backbone)        # the backbone alone, as published
    export, published = (json.loads((tmp_path / d / "config.json").read_text()) for d in ("export", "published"))
    assert export.pop("dmtp") == {"injection": "raw_dflash", "injection_kwargs": {}}
    assert export == published
    assert export["architectures"] == ["DFlash2DraftModel" if architecture == "dflash2" else "DFlashDraftModel"]
    stored = load_file(str(tmp_path / "export" / "model.safetensors"))
    assert set(stored) == set(drafter.backbone.state_dict())     # the published tensor names, nothing else


def test_a_published_drafter_loads_as_raw_dflash_and_reinjects(micro_target, tmp_path):
    drafter = fresh_drafter_for(micro_target, "raw_dflash", 3)
    save_drafter(tmp_path, drafter.backbone)                     # the published layout, no "dmtp" section
    loaded, meta = load_block_drafter(tmp_path)
    assert meta == {} and loaded.variant == "raw_dflash"
    as_dmtp, _ = load_block_drafter(tmp_path, injection="dual_anchor_zero_init")
    assert as_dmtp.variant == "dual_anchor_zero_init"
    assert torch.count_nonzero(as_dmtp.injection.fusion.proj.weight) == 0   # fresh zero-init fusion
    with pytest.raises(ValueError, match=f"drafter at {tmp_path} has context width 64 .* the injection "
                                         "ContextFusion builds 128"):
        load_block_drafter(tmp_path, injection="context_fusion")


@pytest.mark.parametrize("block_size", [16, 1, 0, 33])
def test_a_loaded_drafter_blocks_are_its_config_block_size(micro_target, tmp_path, block_size):
    """A drafter directory's block_size (config.json, top level and dflash_config) sets its blocks; one the
    code cannot honour is refused in one line when it is loaded."""
    import json

    fresh_drafter_for(micro_target, "dual_anchor_zero_init", 3).save(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["block_size"] = config["dflash_config"]["block_size"] = block_size
    (tmp_path / "config.json").write_text(json.dumps(config))
    if block_size == 16:
        drafter, _ = load_block_drafter(tmp_path)
        assert (drafter.block_size, drafter.num_candidates, drafter.injection.num_slots) == (16, 15, 16)
        return
    with pytest.raises(ValueError, match=rf"config.json: drafter block_size must be an integer in 2\.\.32 .*, got {block_size}$"):
        load_block_drafter(tmp_path)


def test_context_width_mismatch_is_one_line(micro_target):
    backbone = fresh_drafter_for(micro_target, "raw_dflash", 3).backbone
    wider = make_injection("context_fusion", micro_target.hidden_size, 1, 3, 8)
    with pytest.raises(ValueError, match="^drafter has context width 64 \\(its fc input\\), but the injection "
                                         "ContextFusion builds 128$"):
        BlockDrafter(backbone, wider)
    with pytest.raises(ValueError, match="^init_from=x has context width 64"):
        BlockDrafter.around(backbone, "context_fusion", "init_from=x")


def test_training_builds_one_drafter_and_optimizes_it_whole(monkeypatch):
    built = []
    real = block_drafter_module.build_drafter
    monkeypatch.setattr(block_drafter_module, "build_drafter", lambda *a, **k: built.append(1) or real(*a, **k))
    _, _, _, module = build_components(compose_train(["injection=dual_anchor_zero_init"]))
    assert len(built) == 1                      # no throw-away drafter to learn the tapped layers
    assert isinstance(module.drafter, BlockDrafter) and not hasattr(module, "injection")
    module.scheduler_factory = None             # the optimizer alone (the scheduler needs a Trainer)
    optimized = {id(p) for group in module.configure_optimizers().param_groups for p in group["params"]}
    assert optimized == {id(p) for p in module.drafter.parameters()}   # backbone and injection together
    assert any(id(p) in optimized for p in module.drafter.injection.parameters())


def test_loaded_for_decoding_carries_its_injection_and_label(micro_target, tmp_path):
    fresh_drafter_for(micro_target, "multi_mtp_zero_init", 3).save(tmp_path)
    drafter, label = load_drafter_for(micro_target, tmp_path, torch.float32, "cpu", options={"num_mtp_tokens": 2})
    assert label == "multi_mtp_zero_init[num_mtp_tokens=2]" and drafter.injection.mtp_steps == 2
    assert method_needs_mtp("drafter", drafter) and not drafter.training
