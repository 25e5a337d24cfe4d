"""`python -m dmtp.infer` inputs: a plain prompt set (eval.name=prompts), the target config group, and
the drafter picked when none is given (the newest trained for the target being decoded)."""
from __future__ import annotations

import json
import os
import time

import pytest

from cli_runner import infer_cli
from dmtp.configs import compose_config
from dmtp.data.evalsets import load_eval_set
from dmtp.drafters.block_drafter import fresh_drafter_for
from dmtp.inference.drafter_choice import NO_DRAFTER_MESSAGE, find_latest_drafter, no_drafter_for
from dmtp.models.target import load_tokenizer

def _save_drafter(target, path, trained_for):
    fresh_drafter_for(target, "dual_anchor_zero_init", 3).save(path, target=str(trained_for))
    return path


# -- eval.name=prompts ------------------------------------------------------------------------------

def test_plain_prompt_records_read_prompt_or_text(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "def add(a, b):"}) + "\n" + json.dumps({"text": "The river", "id": "r"})
                    + "\n")
    requests = load_eval_set("prompts", str(path))
    assert [r.raw_prompt for r in requests] == ["def add(a, b):", "The river"]
    assert [r.id for r in requests] == ["prompts/0", "prompts/r"]


def test_plain_prompt_set_decodes_without_chat_template(tmp_path, micro_target_dir, capsys):
    from dmtp.inference.compare import compare_methods

    path = tmp_path / "p.jsonl"
    texts = ["def add(a, b):\n    return", "The function returns"]
    path.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    cfg = compose_config("infer", [f"target.path={micro_target_dir}", "methods=[ar]", "eval.name=prompts",
                                   f"eval.path={path}", "max_new_tokens=4", "batch_size=2", "progress=false",
                                   "warmup=false", f"output_dir={tmp_path / 'run'}"])
    metrics = compare_methods(cfg)
    assert list(metrics["workloads"]) == ["prompts"] and metrics["run"]["num_prompts"] == {"prompts": 2}
    tok = load_tokenizer(micro_target_dir)
    # the text as written: no chat template around it
    assert metrics["results"][("prompts", "ar")].prompt_lengths == [len(tok(t)["input_ids"]) for t in texts]


@pytest.mark.parametrize("content,message", [
    (None, "{path}: no such file or directory"),
    ("", "{path}: no records found for eval set 'prompts'"),
    ('{"question": "q"}\n', "{path}: record 0 has neither 'prompt' nor 'text' (fields: question)"),
])
def test_bad_plain_prompt_set_is_one_line(content, message, tmp_path, micro_target_dir, monkeypatch, capsys):
    path = tmp_path / "p.jsonl"
    if content is not None:
        path.write_text(content)
    code, line, _ = infer_cli([f"target.path={micro_target_dir}", "methods=[ar]", "eval.name=prompts",
                               f"eval.path={path}"], tmp_path / "run", monkeypatch, capsys)
    assert (code, line) == (2, "dmtp.infer: error: " + message.format(path=path))


# -- the target group -------------------------------------------------------------------------------

def test_infer_config_uses_the_target_group():
    cfg = compose_config("infer", ["target=micro", "output_dir=/tmp/x"])
    assert cfg.target.preset == "micro" and cfg.target.path is None
    cfg = compose_config("infer", ["target.preset=tiny_hybrid", "target.path=/models/x", "device=cpu",
                                   "output_dir=/tmp/x"])
    assert (cfg.target.preset, cfg.target.path, cfg.target.device) == ("tiny_hybrid", "/models/x", "cpu")
    assert compose_config("train", [])["target"]["preset"] == compose_config("infer", ["output_dir=/x"]).target.preset


# -- the drafter picked without drafter= ------------------------------------------------------------

def test_newest_drafter_for_the_target_is_picked(tmp_path, micro_target, micro_target_dir):
    mine = _save_drafter(micro_target, tmp_path / "outputs" / "a" / "drafter", micro_target_dir)
    time.sleep(0.05)
    other = _save_drafter(micro_target, tmp_path / "outputs" / "b" / "drafter", tmp_path / "another_target")
    os.utime(mine / "config.json", (time.time() - 100, time.time() - 100))
    assert find_latest_drafter(base=tmp_path) == other
    assert find_latest_drafter(base=tmp_path, target=micro_target_dir) == mine
    assert find_latest_drafter(base=tmp_path, target=tmp_path / "third") is None
    message = no_drafter_for(tmp_path / "third", base=tmp_path)
    assert message.startswith(f"no drafter trained for {tmp_path / 'third'} ") and str(other) in message
    assert no_drafter_for(tmp_path / "third", base=tmp_path / "empty") == NO_DRAFTER_MESSAGE


def test_infer_without_drafter_decodes_the_one_for_its_target(tmp_path, micro_target, micro_target_dir,
                                                               monkeypatch, capsys):
    mine = _save_drafter(micro_target, tmp_path / "outputs" / "a" / "drafter", micro_target_dir)
    time.sleep(0.05)
    _save_drafter(micro_target, tmp_path / "outputs" / "b" / "drafter", tmp_path / "another_target")   # newer
    monkeypatch.chdir(tmp_path)
    code, _, out = infer_cli([f"target.path={micro_target_dir}", "methods=[ar,drafter]", "num_prompts=1",
                              "eval.domains=[code]", "max_new_tokens=4", "eval.prompt_tokens=8"], tmp_path / "run",
                             monkeypatch, capsys)
    assert code == 0, out
    assert f"[dmtp] drafter: {mine} (the newest trained for {micro_target_dir};" in out
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["run"]["drafter"] == str(mine)


def test_drafter_given_for_another_target_is_a_one_line_error(tmp_path, micro_target, micro_target_dir,
                                                               monkeypatch, capsys):
    from dmtp.drafters.checkpoint import save_drafter
    from dmtp.drafters.dflash import DFlashConfig, DFlashDrafter

    narrow = DFlashConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=2, head_dim=16, vocab_size=micro_target.config.vocab_size,
                          num_target_layers=micro_target.num_layers, target_layer_ids=[1], mask_token_id=3)
    save_drafter(tmp_path / "narrow", DFlashDrafter(narrow))
    code, line, _ = infer_cli([f"target.path={micro_target_dir}", f"drafter={tmp_path / 'narrow'}"], tmp_path / "run",
                              monkeypatch, capsys)
    assert code == 2 and line.startswith(f"dmtp.infer: error: drafter {tmp_path / 'narrow'} was built for a "
                                         "different target (hidden size 32, ")


def test_infer_verifies_a_shorter_block_and_refuses_a_longer_one(tmp_path, micro_target, micro_target_dir,
                                                                   monkeypatch, capsys):
    """drafter.block_size: a block-16 drafter verified with blocks of 8 (labelled so); 17 is one line."""
    path = tmp_path / "d16"
    fresh_drafter_for(micro_target, "dual_anchor_zero_init", 3, block_size=16).save(path, target=str(micro_target_dir))
    args = [f"target.path={micro_target_dir}", f"drafter={path}", "methods=[drafter]", "num_prompts=1",
            "eval.domains=[code]", "max_new_tokens=6", "eval.prompt_tokens=8"]
    code, _, out = infer_cli(args + ["drafter.block_size=8"], tmp_path / "run", monkeypatch, capsys)
    assert code == 0, out
    summary = json.loads((tmp_path / "run" / "metrics.json").read_text())["overall"]
    assert list(summary) == ["dual_anchor_zero_init[block_size=8]"]
    run = summary["dual_anchor_zero_init[block_size=8]"]
    assert (run["block_size"], run["num_candidates"], len(run["p_len_ge"])) == (8, 7, 7)
    code, line, _ = infer_cli(args + ["drafter.block_size=17"], tmp_path / "refused", monkeypatch, capsys)
    assert code == 2 and line == (f"dmtp.infer: error: drafter at {path} was trained with block_size 16: it can "
                                  "verify a block of 2..16, not 17")
