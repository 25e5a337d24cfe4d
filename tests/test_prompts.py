"""Held-out prompts: exact length, deterministic, spread over the split, starting at paragraph starts."""
import pytest
from transformers import AutoTokenizer

from dmtp.data import corpora
from dmtp.data.prompts import held_out_prompts, paragraph_starts


@pytest.fixture(scope="module")
def tokenizer(micro_target_dir):
    return AutoTokenizer.from_pretrained(micro_target_dir)


def test_paragraph_starts():
    text = "a = 1\n\n\ndef f():\n    pass\n    \n    return 2\n\n"
    assert [text[s:].split("\n")[0] for s in paragraph_starts(text)] == ["a = 1", "def f():", "    return 2"]
    assert paragraph_starts("") == [] and paragraph_starts("one line") == [0]


@pytest.mark.parametrize("domain", corpora.DOMAINS)
def test_prompts_have_the_asked_count_and_length_and_are_deterministic(tokenizer, domain):
    prompts = held_out_prompts(tokenizer, domain, "validation", 12, 40)
    assert len(prompts) == 12 and {len(p) for p in prompts} == {40}
    assert len({tuple(p) for p in prompts}) == 12
    assert prompts == held_out_prompts(tokenizer, domain, "validation", 12, 40)


def test_code_prompts_come_from_inside_files_and_across_the_split(tokenizer):
    """Each stdlib file opens with a docstring and imports: the prompts must mostly not be openings."""
    docs = corpora.documents("code", "validation")
    openings = {tuple(tokenizer(d.text[:400], add_special_tokens=False)["input_ids"][:32]) for d in docs}
    prompts = held_out_prompts(tokenizer, "code", "validation", 16, 32)
    assert sum(tuple(p) in openings for p in prompts) <= 2
    sources = set()
    for p in prompts:
        text = tokenizer.decode(p)
        sources |= {d.name for d in docs if text[:60] in d.text}
    assert len(sources) >= 8, sources


def test_math_prompts_are_questions(tokenizer):
    for p in held_out_prompts(tokenizer, "math", "test", 6, 24):
        assert tokenizer.decode(p).startswith("Question:")


def test_a_split_with_too_few_starts_gives_what_it_has(tokenizer):
    prompts = held_out_prompts(tokenizer, "prose", "test", 100_000, 16)
    assert 100 < len(prompts) < 100_000 and len({tuple(p) for p in prompts}) == len(prompts)


def test_bad_counts_are_one_line_errors(tokenizer):
    with pytest.raises(ValueError, match="num_prompts and prompt_tokens must be >= 1"):
        held_out_prompts(tokenizer, "code", "test", 0, 16)
    with pytest.raises(ValueError, match="unknown corpus domain"):
        held_out_prompts(tokenizer, "poetry", "test", 4, 16)
