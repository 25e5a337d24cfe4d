"""The chat-model testbed end to end at micro size: a target built on the assistant corpus records it, its MTP is
trained over chained steps, the drafter's data are its responses to whole requests (rows of one width, the loss on
the response alone), and the one loop decodes it losslessly."""
from __future__ import annotations

import json

import pytest

from built_targets import built_target
from dmtp.data.corpora import corpus_of_target, documents
from dmtp.decode import build_proposer
from dmtp.families.decoding import spec_decoder
from dmtp.models.target import TargetModel, load_tokenizer
from dmtp.tiny.targets import default_target_dir
from dmtp.training.data_options import RegenOptions, SourceOptions, ValidationOptions
from dmtp.training.datamodule import DraftDataModule


@pytest.fixture(scope="module")
def assistant_dir():
    return built_target("micro_assistant")


def test_the_build_records_its_corpus_and_chained_mtp(assistant_dir):
    report = json.loads((assistant_dir / "build_report.json").read_text())
    assert (report["corpus"], report["mtp_chain_depth"]) == ("assistant", 4)
    assert corpus_of_target(assistant_dir) == "assistant"
    # The recipe's corpus is part of the cache key: never mistaken for a stdlib build of the same sizes.
    assert default_target_dir("micro_assistant").name.startswith("micro_assistant-")


def test_drafter_rows_are_responses_to_whole_requests(assistant_dir):
    target = TargetModel.from_pretrained(assistant_dir)
    tok = load_tokenizer(assistant_dir)
    dm = DraftDataModule(tok, target, source=SourceOptions(domains=("code", "math")),
                         regen=RegenOptions(enabled=True, sequences=6, new_tokens=24, batch_size=6, shard_size=6),
                         val=ValidationOptions(domains=(), prompts=2))
    rows = dm._regenerated_rows()
    prompts = dm._regen_prompts()
    requests = {tuple(tok(d.parts[0], add_special_tokens=False)["input_ids"])
                for d in documents("code", "train", "assistant") + documents("math", "train", "assistant")}
    assert all(tuple(p) in requests for p in prompts)
    assert len({len(p) for p in prompts}) > 1          # requests of several lengths
    width = max(map(len, prompts)) + 24
    for prompt, row in zip(prompts, rows):
        assert len(row["input_ids"]) == len(row["loss_mask"]) == width
        assert row["input_ids"][:len(prompt)] == prompt
        assert not any(row["loss_mask"][:len(prompt)]) and row["loss_mask"][len(prompt)] == 1


def test_mtp415_on_the_assistant_target_is_lossless(assistant_dir):
    from dmtp.families.mtp_loading import load_native_mtp

    target = TargetModel.from_pretrained(assistant_dir)
    mtp = load_native_mtp(assistant_dir, target.embed_tokens, target.lm_head)
    tok = load_tokenizer(assistant_dir)
    prompts = [tok(d.parts[0], add_special_tokens=False)["input_ids"] for d in documents("code", "test", "assistant")[:4]]
    ar = spec_decoder(target, build_proposer("ar", target), eos_token_id=[]).generate(prompts, 16, batch_size=4).tokens
    spec = spec_decoder(target, build_proposer("mtp415", target, mtp=mtp), eos_token_id=[])
    assert spec.generate(prompts, 16, batch_size=4).tokens == ar
