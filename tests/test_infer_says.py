"""What dmtp.infer chooses for the user is said in one line (issue 43): the target a drafter recorded, decoded
against instead of the preset; a confidence threshold that verified no candidate at all (its tau of 1 is the
threshold's, not the drafter's), with the candidates verified per round in the table."""
from __future__ import annotations

import json
import os

import torch

from cli_runner import infer_cli
from dmtp.drafters.block_drafter import fresh_drafter_for

SHORT = ["num_prompts=2", "eval.domains=[code,math]", "max_new_tokens=6", "eval.prompt_tokens=8"]


def test_the_target_a_drafter_recorded_replaces_the_preset_in_one_line(tmp_path, micro_target, micro_target_dir,
                                                                         monkeypatch, capsys):
    copy = tmp_path / "micro_copy"   # another checkpoint directory (the same files): not the preset's
    copy.mkdir()
    for f in micro_target_dir.iterdir():
        os.symlink(f, copy / f.name)
    drafter = tmp_path / "drafter"
    fresh_drafter_for(micro_target, "dual_anchor_zero_init", 3).save(drafter, target=str(copy))
    code, line, out = infer_cli(["target.preset=micro", f"drafter={drafter}", "methods=[ar,drafter]", *SHORT],
                                tmp_path / "run", monkeypatch, capsys)
    assert code == 0, line
    assert f"[dmtp] target: {copy}, the one drafter {drafter} was trained for, not target.preset=micro " \
           "(target.path=<dir> decodes it against another)" in out.splitlines()
    run = json.loads((tmp_path / "run" / "metrics.json").read_text())["run"]
    assert (run["target"], run["target_from"], run["target_mismatch"]) == (str(copy), "drafter", None)
    # Trained for the preset itself: nothing to say.
    fresh_drafter_for(micro_target, "dual_anchor_zero_init", 3).save(drafter, target=str(micro_target_dir))
    code, _, out = infer_cli(["target.preset=micro", f"drafter={drafter}", "methods=[drafter]", *SHORT],
                             tmp_path / "run2", monkeypatch, capsys)
    assert code == 0 and "[dmtp] target:" not in out


def test_a_threshold_that_verifies_no_candidate_says_so_and_the_table_shows_what_was_verified(
        tmp_path, micro_target, micro_target_dir, monkeypatch, capsys):
    drafter = fresh_drafter_for(micro_target, "raw_dflash", 3, backbone={"architecture": "dspark"})
    with torch.no_grad():   # a confidence head that predicts rejection everywhere: survival ~1e-9 < 0.5
        drafter.backbone.confidence_head.proj.weight.zero_()
        drafter.backbone.confidence_head.proj.bias.fill_(-20.0)
    drafter.save(tmp_path / "dspark", target=str(micro_target_dir))
    args = [f"target.path={micro_target_dir}", f"drafter={tmp_path / 'dspark'}", "methods=[ar,drafter]", *SHORT]
    code, line, out = infer_cli([*args, "confidence_threshold=0.5"], tmp_path / "run", monkeypatch, capsys)
    assert code == 0, line
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    mine = metrics["overall"]["raw_dflash+dspark"]
    assert (mine["tau_per_request"], mine["verified_per_round"]) == (1.0, 0.0)
    said = [s for s in out.splitlines() if "verified no candidate" in s]
    assert said == [f"[dmtp] confidence_threshold=0.5 verified no candidate of raw_dflash+dspark in any of its "
                    f"{mine['rounds']} rounds (its predicted survival never reached 0.5): its tau 1 and T1 0 are the "
                    "threshold's, not the drafter's; lower it (0 = off) or train the confidence head"]
    table = (tmp_path / "run" / "table.txt").read_text()
    assert said[0] in table.splitlines()
    lines = table.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("workload"))
    header = lines[at].replace("95% CI", "95%_CI").split()
    verified = header.index("verified")
    rows = {(r.split()[0], r.split()[1]): r.replace(", ", ",").split() for r in lines[at + 2:at + 8] if len(r.split()) > 5}
    assert rows[("code", "raw_dflash+dspark")][verified] == rows[("all", "raw_dflash+dspark")][verified] == "0.000"
    assert rows[("all", "ar")][verified] == "0.000"
    # Off: every candidate verified, in every row, and nothing said.
    code, _, out = infer_cli(args, tmp_path / "run_off", monkeypatch, capsys)
    off = json.loads((tmp_path / "run_off" / "metrics.json").read_text())["overall"]["raw_dflash+dspark"]
    assert code == 0 and off["verified_per_round"] == 7.0 and "verified no candidate" not in out
