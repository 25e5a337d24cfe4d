"""An exported drafter says which target it belongs to and how well it does: config.json's "dmtp" section
names the target and fingerprints it (config.json and MTP files' sha256), README.md beside the weights is a
model card (recipe, the final walk's table, each dmtp.infer table), and decoding against another target of the
same shapes is one warning line (other shapes stay refused)."""
from __future__ import annotations

import hashlib
import json
import os

import torch

from dmtp.configs import compose_config, compose_train
from dmtp.drafters.block_drafter import fresh_drafter_for
from dmtp.inference.drafter_choice import load_drafter_for
from dmtp.models import model_card
from dmtp.models.model_card import set_card_section


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_export_records_its_target_and_writes_a_card(micro_target, micro_target_dir, tmp_path):
    recipe = {"injection": {"name": "dual_anchor_zero_init"}, "trainer": {"max_steps": 7}}
    out = tmp_path / "drafter"
    fresh_drafter_for(micro_target, "dual_anchor_zero_init", 3).save(out, target=str(micro_target_dir),
                                                                       train_config=recipe)
    meta = json.loads((out / "config.json").read_text())["dmtp"]
    assert meta["target"] == str(micro_target_dir)
    assert meta["target_config_sha256"] == sha256(micro_target_dir / "config.json")
    assert meta["target_mtp_sha256"] == {"mtp.safetensors": sha256(micro_target_dir / "mtp.safetensors")}
    assert (meta["injection"], meta["train_config"]) == ("dual_anchor_zero_init", recipe)
    card = (out / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: dmtp\n") and "base_model" not in card   # a local target: no hub link
    for shown in (str(micro_target_dir), meta["target_config_sha256"], "`dual_anchor_zero_init`", "| block size | `8` |",
                  "## Training recipe", "max_steps: 7"):
        assert shown in card, shown
    # A section written twice is replaced, not stacked; a second one goes after it.
    assert set_card_section(out, "walk", "Final validation walk", "tau 1.0")
    assert set_card_section(out, "walk", "Final validation walk", "tau 2.0")
    assert set_card_section(out, "infer x", "dmtp.infer", "table")
    card = (out / "README.md").read_text()
    assert card.count("## Final validation walk") == 1 and "tau 2.0" in card and "tau 1.0" not in card
    assert card.index("tau 2.0") < card.index("## dmtp.infer") and card.endswith("<!-- /dmtp:infer x -->\n")


def test_a_hub_target_is_named_and_linked_without_hashes(micro_target, tmp_path):
    out = tmp_path / "drafter"
    fresh_drafter_for(micro_target, "raw_dflash", 3).save(out, target="Qwen/Qwen3-8B")
    meta = json.loads((out / "config.json").read_text())["dmtp"]
    assert (meta["target"], meta["target_config_sha256"], meta["target_mtp_sha256"]) == ("Qwen/Qwen3-8B", None, None)
    assert "base_model: Qwen/Qwen3-8B" in (out / "README.md").read_text()


def test_a_readme_dmtp_did_not_write_is_left_alone(tmp_path):
    (tmp_path / "README.md").write_text("# someone's drafter\n")
    assert not set_card_section(tmp_path, "walk", "walk", "table")
    assert (tmp_path / "README.md").read_text() == "# someone's drafter\n"
    assert not set_card_section(tmp_path / "none", "walk", "walk", "table")   # no card at all


def test_another_target_of_the_same_shapes_is_one_warning_line(micro_target, micro_target_dir, tmp_path, capsys):
    """The drafter records a copy of the target whose config.json differs (a key added); decoded against the
    original it loads, with one line saying so. The same target: no line."""
    other = tmp_path / "other_target"
    other.mkdir()
    for f in micro_target_dir.iterdir():
        if f.name != "config.json":
            os.symlink(f, other / f.name)
    config = json.loads((micro_target_dir / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "note": "fine-tuned"}))
    out = tmp_path / "drafter"
    fresh_drafter_for(micro_target, "raw_dflash", 3).save(out, target=str(other))
    capsys.readouterr()
    load_drafter_for(micro_target, out, torch.float32, torch.device("cpu"))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"[dmtp] warning: drafter {out} was trained for {other} "
                                                   "(config.json sha256 ")
    assert f"but decodes against {micro_target.path} (config.json sha256 " in lines[0]
    fresh_drafter_for(micro_target, "raw_dflash", 3).save(out, target=str(micro_target_dir))
    load_drafter_for(micro_target, out, torch.float32, torch.device("cpu"))
    assert capsys.readouterr().out == ""


def _infer(micro_target_dir, drafter, out):
    from dmtp.inference.compare import compare_methods

    return compare_methods(compose_config("infer", [
        f"target.path={micro_target_dir}", f"drafter.path={drafter}", "methods=[ar,drafter]", "num_prompts=1",
        "eval.domains=[code]", "max_new_tokens=4", "eval.prompt_tokens=8", "progress=false", "warmup=false",
        f"output_dir={out}"]))


def test_infer_adds_its_table_to_the_card_and_never_fails_for_it(micro_target, micro_target_dir, tmp_path, capsys,
                                                                 monkeypatch):
    drafter = tmp_path / "drafter"
    fresh_drafter_for(micro_target, "dual_anchor_zero_init", 3).save(drafter, target=str(micro_target_dir))
    for _ in range(2):   # the same run directory twice: its section is replaced
        _infer(micro_target_dir, drafter, tmp_path / "run")
    assert f"[dmtp] table added to the drafter's card: {drafter / 'README.md'}" in capsys.readouterr().out
    card = (drafter / "README.md").read_text()
    table = (tmp_path / "run" / "table.txt").read_text().strip()
    assert card.count(f"## `dmtp.infer` against {micro_target_dir}: dual_anchor_zero_init, eval embedded") == 1
    assert table in card
    _infer(micro_target_dir, drafter, tmp_path / "run2")   # another run: a second section
    assert (drafter / "README.md").read_text().count("## `dmtp.infer` against") == 2

    def read_only(*_):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(model_card, "write_text", read_only)
    metrics = _infer(micro_target_dir, drafter, tmp_path / "run3")
    out = capsys.readouterr().out
    assert metrics["overall"] and f"[dmtp] the drafter's card {drafter / 'README.md'} was not updated: " \
                                  "Read-only file system" in out


def test_training_puts_the_final_walk_in_the_card(tmp_path, capsys):
    from dmtp.training.job import train

    train(compose_train(["trainer.max_steps=1", "trainer.val_check_interval=1", "trainer.enable_progress_bar=false"],
                        output_dir=tmp_path))
    printed = capsys.readouterr().out
    card = (tmp_path / "drafter" / "README.md").read_text()
    meta = json.loads((tmp_path / "drafter" / "config.json").read_text())["dmtp"]
    assert meta["target_config_sha256"] and meta["target_mtp_sha256"] and "## Training recipe" in card
    walk = card.split("## Final validation walk (exact greedy acceptance)\n\n```\n")[1].split("\n```")[0]
    assert walk and walk in printed   # the table the run printed
