"""The regime report (`python -m dmtp.regime`): its observables measured along the target's own text, through the
one loop, and marked against the published band; the assistant corpus its chat-model target reads."""
from __future__ import annotations

import math

import pytest
import torch

from dmtp.data.corpora import CORPORA, corpus_of_target, documents, encode_documents
from dmtp.data.prompts import held_out_prompts
from dmtp.decode import build_proposer
from dmtp.families.decoding import spec_decoder
from dmtp.inference.regime import in_band, observe_text, regime_of, regime_table, repeated_4grams
from dmtp.models.target import load_tokenizer


def test_repeated_4grams_counts_repeats_of_earlier_4grams():
    assert repeated_4grams([1, 2, 3, 4, 5, 6]) == 0.0
    assert repeated_4grams([1, 2, 3]) == 0.0
    # 1 2 3 4 1 2 3 4: 5 four-grams, the last (1 2 3 4) repeats the first
    assert repeated_4grams([1, 2, 3, 4, 1, 2, 3, 4]) == pytest.approx(1 / 5)
    assert repeated_4grams([7] * 10) == pytest.approx(6 / 7)


def test_band_marks_figures_outside_it():
    assert in_band("t1_accept_t1", 0.8) == "" and in_band("t1_accept_t1", 0.5) == "<"
    assert in_band("t1_accept_t1", 0.95) == ">" and in_band("rep4_greedy", 0.56) == ">"
    assert in_band("entropy_t1", 9.0) == " "   # no band published


def test_regime_of_the_micro_target(micro_target, micro_target_dir, micro_mtp):
    tok = load_tokenizer(micro_target_dir)
    workloads = {d: held_out_prompts(tok, d, "test", 3, 16) for d in ("code", "math")}
    rows = regime_of(micro_target, micro_mtp, workloads, eos_token_id=None, max_new_tokens=12, batch_size=3)
    for row in rows.values():
        for key in ("top1_greedy", "top1_t1", "mtp_agree_greedy", "t1_accept_t1", "rep4_greedy"):
            assert 0.0 <= row[key] <= 1.0, (key, row[key])
        assert 1.0 <= row["mtp415_tau_greedy"] <= 5.0 and 1.0 <= row["mtp415_tau_t1"] <= 5.0
        assert row["new_tokens_greedy"] == 12
        # A distribution's entropy is non-negative and its top-1 probability at least 1/V.
        assert row["entropy_greedy"] >= 0 and row["top1_greedy"] >= 1 / micro_target.config.vocab_size
    assert "code" in regime_table(rows) and "band" in regime_table(rows)


def test_observables_follow_from_the_target_logits(micro_target, micro_mtp):
    """Greedy text: the target's argmax is the written token, so its top-1 probability there is the probability of
    what it wrote; checked against one forward by hand."""
    prompt = [5, 17, 33, 2, 9]
    dec = spec_decoder(micro_target, build_proposer("ar", micro_target), eos_token_id=[])
    new = dec.generate([prompt], max_new_tokens=6).tokens[0]
    seen = observe_text(micro_target, micro_mtp, [prompt], [new])
    logits = micro_target(torch.tensor([prompt + new])).logits[0, len(prompt) - 1:-1]
    p = torch.softmax(logits.float(), -1)
    assert seen.top1 == pytest.approx(float(p.gather(-1, torch.tensor(new)[:, None]).mean()), abs=1e-6)
    assert not math.isnan(seen.mtp_agree)


def test_assistant_corpus_is_exchanges_with_whole_request_prompts(micro_target_dir):
    assert CORPORA == ("stdlib", "assistant")
    docs = documents("code", "test", "assistant")
    assert docs and all(0 < d.prompt_chars < len(d.text) for d in docs[:50])
    names = {d.name for s in ("train", "validation", "test") for d in documents("code", s, "assistant")}
    assert len(names) == sum(len(documents("code", s, "assistant")) for s in ("train", "validation", "test"))
    tok = load_tokenizer(micro_target_dir)
    request, response = docs[0].parts
    assert encode_documents(tok, docs[:1])[0] == (tok(request, add_special_tokens=False)["input_ids"]
                                                  + tok(response, add_special_tokens=False)["input_ids"])
    prompts = held_out_prompts(tok, "code", "test", 4, 16, corpus="assistant")
    assert len(prompts) == 4
    requests = {tuple(tok(d.parts[0], add_special_tokens=False)["input_ids"]) for d in docs}
    assert all(tuple(p) in requests for p in prompts)   # whole requests, not cut to prompt_tokens


def test_corpus_of_target_and_unknown_corpora(tmp_path, micro_target_dir):
    assert corpus_of_target(micro_target_dir) == "stdlib" and corpus_of_target(tmp_path) == "stdlib"
    (tmp_path / "build_report.json").write_text('{"corpus": "assistant"}')
    assert corpus_of_target(tmp_path) == "assistant"
    with pytest.raises(ValueError, match="unknown corpus 'web'; choose from stdlib, assistant"):
        documents("code", "test", "web")
