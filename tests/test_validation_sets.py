"""The validation walk on prompt files of your own (`data.val_sets`), beside or instead of the embedded domains
(`data.val_domains=[]`): each prompt as the target reads it, the target's greedy continuation regenerated once and
cached like the training data."""
from __future__ import annotations

import json

import pytest

from dmtp.configs import compose_train
from dmtp.datagen import regenerate as regen_mod
from dmtp.training import datamodule
from dmtp.training.components import build_components
from test_regenerate import _hf_greedy

TEXTS = ["def add(a, b):\n    return", "The sum of 3 and 4 is", "import os\nimport sys\n\ndef main():"]


@pytest.fixture()
def prompt_file(tmp_path):
    path = tmp_path / "held_out.jsonl"
    path.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in TEXTS))
    return path


def test_prompt_file_rows_are_the_targets_greedy_continuations_cached(prompt_file, monkeypatch):
    cfg = compose_train(["debug=tiny_budget", f"data.val_sets={{prompts: {prompt_file}}}", "data.val_domains=[]",
                         "data.val_prompts=3"])
    target, tokenizer, data, _ = build_components(cfg)
    data.setup("fit")
    assert list(data.val_rows) == ["prompts"]
    rows = data.val_rows["prompts"]
    assert len(rows) == len(TEXTS)
    for row, text in zip(rows, TEXTS):
        prompt = tokenizer(text)["input_ids"][-data.val.prompt_len:]
        n = row["prompt_len"]
        assert row["input_ids"][:n] == prompt                                  # the prompt as the target reads it
        assert len(row["input_ids"]) == data.val.prompt_len + data.val.new_tokens   # one length for the batch
        assert sum(row["loss_mask"]) == row["length"] - n > 0                  # the continuation is supervised
        assert row["domain"] == "prompts"
        # The continuation is the target's own greedy one (transformers' generate as the reference).
        expected = _hf_greedy(target, prompt, data.val.new_tokens, tokenizer.eos_token_id)
        assert row["input_ids"][n:row["length"]] == expected
    # A second data module reads the continuations back from the cache: nothing is decoded again.
    monkeypatch.setattr(regen_mod, "make_writer", lambda *a, **k: pytest.fail("decoded the cached rows again"))
    again = build_components(cfg)[2]
    again.setup("fit")
    assert again.val_rows["prompts"] == rows


def test_no_validation_domains_decode_nothing_at_setup(monkeypatch):
    cfg = compose_train(["debug=tiny_budget", "data.val_domains=[]"])
    data = build_components(cfg)[2]
    monkeypatch.setattr(datamodule, "regenerate", lambda *a, **k: pytest.fail("regenerated rows for validation"))
    data.train_rows = [{"input_ids": [1] * 8, "loss_mask": [1] * 8}]   # training rows already there
    data.setup("fit")
    assert data.val_rows == {} and data.val_dataloader() == []


def test_bad_val_sets_are_one_line(prompt_file):
    for bad, match in ((f"{{nosuchset: {prompt_file}}}", "unknown eval set 'nosuchset'"),
                       ("[a, b]", "must map an eval-set name to a file")):
        with pytest.raises(ValueError, match=match):
            build_components(compose_train(["debug=tiny_budget", f"data.val_sets={bad}"]))
