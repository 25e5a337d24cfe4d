"""Tests for dmtp.data.evalsets: loaders for the public eval-set formats and chat prompt rendering."""

from __future__ import annotations

import json
import os

import pytest

from dmtp.data import evalsets
from dmtp.data.evalsets import (
    EvalRequest,
    build_turn_messages,
    build_turn_prompts,
    iter_turns,
    load_eval_set,
    render_prompt,
)

# --------------------------------------------------------------------------- fixtures in public formats

GSM8K = [
    {"question": "Tom has 3 apples and buys 2 more. How many apples?", "answer": "3 + 2 = 5\n#### 5"},
    {"question": "A box holds 4 pens. How many pens in 3 boxes?", "answer": "4 * 3 = 12\n#### 12"},
    {"question": "Sara reads 10 pages a day. Pages in a week?", "answer": "10 * 7 = 70\n#### 70"},
]
HUMANEVAL = [
    {
        "task_id": "HumanEval/0",
        "prompt": 'def add(a, b):\n    """Return a + b."""\n',
        "canonical_solution": "    return a + b\n",
        "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n",
        "entry_point": "add",
    },
    {
        "task_id": "HumanEval/1",
        "prompt": 'def neg(x):\n    """Return -x."""\n',
        "canonical_solution": "    return -x\n",
        "test": "def check(candidate):\n    assert candidate(1) == -1\n",
        "entry_point": "neg",
    },
]
MATH500 = [
    {
        "problem": f"Compute ${i} + {i}$.",
        "solution": f"${i} + {i} = {2 * i}$",
        "answer": str(2 * i),
        "subject": "Algebra",
        "level": i % 5 + 1,
        "unique_id": f"test/algebra/{i}.json",
    }
    for i in range(4)
]
ALPACA = [
    {"instruction": "Give three tips for staying healthy.", "input": "", "output": "Eat, sleep, move."},
    {"instruction": "Translate to French.", "input": "Good morning", "output": "Bonjour"},
    {"instruction": "Name a color.", "input": "", "output": "Blue"},
]
MTBENCH = [
    {
        "question_id": 81,
        "category": "writing",
        "turns": ["Write a blog post about Hawaii.", "Rewrite it so every sentence starts with A."],
    },
    {
        "question_id": 101,
        "category": "reasoning",
        "turns": ["You pass the second person in a race. What position are you in?", "And if you pass the last?"],
        "reference": ["second", "impossible"],
    },
]


def _write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return str(path)


def _write_parquet(path, rows):
    try:
        import pandas as pd

        pd.DataFrame(rows).to_parquet(path, index=False)
    except ImportError:
        import datasets

        datasets.Dataset.from_list(rows).to_parquet(str(path))
    return str(path)


@pytest.fixture
def files(tmp_path):
    alpaca = tmp_path / "alpaca_data.json"
    alpaca.write_text(json.dumps(ALPACA), encoding="utf-8")
    return {
        "gsm8k": _write_jsonl(tmp_path / "gsm8k_test.jsonl", GSM8K),
        "humaneval": _write_jsonl(tmp_path / "HumanEval.jsonl", HUMANEVAL),
        "math500": _write_parquet(tmp_path / "math500.parquet", MATH500),
        "alpaca": str(alpaca),
        "mtbench": _write_jsonl(tmp_path / "question.jsonl", MTBENCH),
    }


# --------------------------------------------------------------------------- loaders


def test_gsm8k_jsonl(files):
    reqs = load_eval_set("gsm8k", files["gsm8k"])
    assert len(reqs) == 3
    assert all(isinstance(r, EvalRequest) for r in reqs)
    assert reqs[0].turns == [GSM8K[0]["question"]]
    assert reqs[0].domain == "gsm8k" and reqs[0].raw_prompt is None
    assert reqs[0].meta["answer"].endswith("#### 5")
    assert len({r.id for r in reqs}) == 3


def test_humaneval_jsonl_has_raw_prompt(files):
    reqs = load_eval_set("humaneval", files["humaneval"])
    assert [r.id for r in reqs] == ["humaneval/HumanEval/0", "humaneval/HumanEval/1"]
    r = reqs[0]
    assert r.raw_prompt == HUMANEVAL[0]["prompt"]
    assert r.turns == [HUMANEVAL[0]["prompt"]]
    assert r.meta["entry_point"] == "add" and "check" in r.meta["test"]
    assert r.meta["canonical_solution"] == "    return a + b\n"


def test_math500_parquet(files):
    reqs = load_eval_set("math500", files["math500"])
    assert len(reqs) == 4
    assert reqs[2].turns == ["Compute $2 + 2$."]
    assert reqs[2].id == "math500/test/algebra/2.json"
    assert reqs[2].meta["answer"] == "4" and reqs[2].meta["subject"] == "Algebra"


def test_alpaca_json_list_joins_input(files):
    reqs = load_eval_set("alpaca", files["alpaca"])
    assert len(reqs) == 3
    assert reqs[0].turns == ["Give three tips for staying healthy."]
    assert reqs[1].turns == ["Translate to French.\n\nGood morning"]
    assert reqs[1].meta["output"] == "Bonjour"


def test_mtbench_two_turns(files):
    reqs = load_eval_set("mtbench", files["mtbench"])
    assert [r.id for r in reqs] == ["mtbench/81", "mtbench/101"]
    assert len(reqs[0].turns) == 2 and reqs[0].turns[1].startswith("Rewrite")
    assert reqs[0].meta["category"] == "writing"
    assert reqs[1].meta["reference"] == ["second", "impossible"]


def test_limit_takes_first_n(files):
    assert [r.turns[0] for r in load_eval_set("gsm8k", files["gsm8k"], limit=2)] == [g["question"] for g in GSM8K[:2]]
    assert len(load_eval_set("math500", files["math500"], limit=1)) == 1
    assert len(load_eval_set("alpaca", files["alpaca"], limit=100)) == 3
    assert load_eval_set("mtbench", files["mtbench"], limit=0) == []
    with pytest.raises(ValueError, match="limit"):
        load_eval_set("gsm8k", files["gsm8k"], limit=-1)


def test_directory_prefers_main_test_split(tmp_path):
    # Hub snapshot layout of openai/gsm8k: main/{train,test}-*.parquet, socratic/...
    (tmp_path / "main").mkdir()
    (tmp_path / "socratic").mkdir()
    _write_parquet(tmp_path / "main" / "train-00000-of-00001.parquet", [{"question": "train q", "answer": "1"}])
    _write_parquet(tmp_path / "main" / "test-00000-of-00001.parquet", GSM8K)
    _write_parquet(tmp_path / "socratic" / "test-00000-of-00001.parquet", [{"question": "socratic q", "answer": "1"}])
    (tmp_path / "dataset_info.json").write_text("{}")
    reqs = load_eval_set("gsm8k", str(tmp_path))
    assert [r.turns[0] for r in reqs] == [g["question"] for g in GSM8K]


def test_directory_mtbench_picks_question_jsonl(tmp_path):
    _write_jsonl(tmp_path / "question.jsonl", MTBENCH)
    _write_jsonl(tmp_path / "other.jsonl", [{"bad": 1}])
    reqs = load_eval_set("mtbench", str(tmp_path))
    assert len(reqs) == 2


def test_json_with_jsonl_content_and_gz(tmp_path):
    import gzip

    p = _write_jsonl(tmp_path / "gsm.json", GSM8K)  # JSONL saved as .json
    assert len(load_eval_set("gsm8k", p)) == 3
    gz = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as f:
        for r in HUMANEVAL:
            f.write(json.dumps(r) + "\n")
    assert len(load_eval_set("humaneval", str(gz))) == 2


# --------------------------------------------------------------------------- errors


def _one_line(exc_info):
    msg = str(exc_info.value)
    assert "\n" not in msg
    return msg


def test_missing_file(tmp_path):
    p = str(tmp_path / "nope.jsonl")
    with pytest.raises(FileNotFoundError) as ei:
        load_eval_set("gsm8k", p)
    assert p in _one_line(ei)


def test_missing_field(tmp_path):
    p = _write_jsonl(tmp_path / "bad.jsonl", [GSM8K[0], {"answer": "#### 1"}])
    with pytest.raises(ValueError) as ei:
        load_eval_set("gsm8k", p)
    msg = _one_line(ei)
    assert p in msg and "'question'" in msg and "record 1" in msg
    # the bad record is beyond the limit: no error
    assert len(load_eval_set("gsm8k", p, limit=1)) == 1

    p2 = _write_parquet(tmp_path / "m.parquet", [{"solution": "x", "answer": "1"}])
    with pytest.raises(ValueError, match="problem"):
        load_eval_set("math500", p2)
    p3 = _write_jsonl(tmp_path / "he.jsonl", [{"task_id": "HumanEval/0"}])
    with pytest.raises(ValueError, match="'prompt'"):
        load_eval_set("humaneval", p3)


def test_bad_values_and_formats(tmp_path):
    p = _write_jsonl(tmp_path / "q.jsonl", [{"question_id": 1, "turns": "not a list"}])
    with pytest.raises(ValueError) as ei:
        load_eval_set("mtbench", p)
    assert "turns" in _one_line(ei)
    bad = tmp_path / "broken.jsonl"
    bad.write_text('{"question": "ok"}\n{not json\n')
    with pytest.raises(ValueError) as ei:
        load_eval_set("gsm8k", str(bad))
    assert "line 2" in _one_line(ei)
    txt = tmp_path / "data.txt"
    txt.write_text("hello")
    with pytest.raises(ValueError, match="unsupported"):
        load_eval_set("gsm8k", str(txt))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no .jsonl"):
        load_eval_set("gsm8k", str(tmp_path / "empty"))


def test_unknown_set(files):
    with pytest.raises(ValueError) as ei:
        load_eval_set("squad", files["gsm8k"])
    msg = _one_line(ei)
    assert "squad" in msg and "gsm8k" in msg


def test_hub_fallback(monkeypatch):
    datasets = pytest.importorskip("datasets")
    calls = []

    def fake_load(path, name=None, split=None, **kw):
        calls.append((path, name, split))
        if "mt_bench" in path:  # HuggingFaceH4/mt_bench_prompts spells the fields prompt_id / prompt
            return [{"prompt_id": m["question_id"], "prompt": m["turns"], "category": m["category"]} for m in MTBENCH]
        return [dict(r) for r in GSM8K]

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    reqs = load_eval_set("gsm8k", "openai/gsm8k", limit=2)
    assert len(reqs) == 2 and calls[0] == ("openai/gsm8k", "main", "test")
    mt = load_eval_set("mtbench", "someone/mt_bench:default@train")
    assert calls[-1] == ("someone/mt_bench", "default", "train")
    assert mt[0].id == "mtbench/81" and mt[0].turns == MTBENCH[0]["turns"]

    def failing_load(*a, **kw):
        raise ConnectionError("offline\nno network")

    monkeypatch.setattr(datasets, "load_dataset", failing_load)
    with pytest.raises(FileNotFoundError) as ei:
        load_eval_set("humaneval", "openai/openai_humaneval")
    msg = _one_line(ei)
    assert "openai/openai_humaneval" in msg and "load_dataset" in msg and "offline" in msg


# --------------------------------------------------------------------------- prompts

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> "
    "{% if enable_thinking is defined and enable_thinking is false %}<think></think> {% endif %}{% endif %}"
)
PLAIN_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)


@pytest.fixture(scope="module")
def tok():
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["[UNK]", "<s>", "<|user|>", "<|assistant|>", "<|end|>", "<think>", "</think>"]
    corpus = [m["turns"][0] for m in MTBENCH] + [m["turns"][1] for m in MTBENCH]
    corpus += ["Hawaii is lovely and sunny", "A first answer about islands", "hello world", "first second"]
    backend = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=specials))
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    t = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", unk_token="[UNK]")
    t.add_special_tokens({"additional_special_tokens": specials[2:]})
    t.chat_template = TEMPLATE
    return t


def _contains(seq, sub):
    return any(seq[i : i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def _tokens(tok, ids):
    return tok.convert_ids_to_tokens(ids)


def test_render_prompt_single_bos_and_thinking_off(tok):
    msgs = [{"role": "user", "content": "hello world"}]
    ids = render_prompt(tok, msgs)
    toks = _tokens(tok, ids)
    assert toks == ["<s>", "<|user|>", "hello", "world", "<|end|>", "<|assistant|>", "<think>", "</think>"]
    assert toks.count("<s>") == 1  # template BOS only, none added by encoding
    # enable_thinking=True reaches the template too: no empty think block
    toks_on = _tokens(tok, render_prompt(tok, msgs, enable_thinking=True))
    assert "<think>" not in toks_on and toks_on[-1] == "<|assistant|>"


def test_render_prompt_passes_enable_thinking_only_when_template_mentions_it(tok, monkeypatch):
    seen = []
    real = tok.apply_chat_template

    def spy(messages, **kw):
        seen.append(kw)
        return real(messages, **kw)

    monkeypatch.setattr(tok, "apply_chat_template", spy)
    render_prompt(tok, [{"role": "user", "content": "hello"}])
    assert seen[-1]["enable_thinking"] is False
    assert seen[-1]["add_generation_prompt"] is True and seen[-1]["tokenize"] is False
    monkeypatch.setattr(tok, "chat_template", PLAIN_TEMPLATE)
    render_prompt(tok, [{"role": "user", "content": "hello"}])
    assert "enable_thinking" not in seen[-1]


def test_render_prompt_without_chat_template(tok, monkeypatch):
    monkeypatch.setattr(tok, "chat_template", None)
    msgs = [{"role": "user", "content": "hello world"}, {"role": "assistant", "content": "first"}]
    ids = render_prompt(tok, msgs)
    assert ids == tok("hello world\n\nfirst")["input_ids"]
    assert _tokens(tok, ids) == ["<s>", "hello", "world", "first"]


def test_mtbench_second_turn_contains_first_answer(tok, files):
    req = load_eval_set("mtbench", files["mtbench"], limit=1)[0]
    first_answer = "A first answer about islands"
    ids0 = build_turn_prompts(tok, req, [])
    ids1 = build_turn_prompts(tok, req, [first_answer])
    ans_ids = tok(first_answer, add_special_tokens=False)["input_ids"]
    assert not _contains(ids0, ans_ids)
    assert _contains(ids1, ans_ids)
    toks = _tokens(tok, ids1)
    # user turn0, assistant answer0, user turn1, generation prompt with thinking disabled
    assert [t for t in toks if t.startswith("<|")] == [
        "<|user|>", "<|end|>", "<|assistant|>", "<|end|>", "<|user|>", "<|end|>", "<|assistant|>"
    ]
    assert toks[-2:] == ["<think>", "</think>"]
    assert ids1[: len(ids0) - 3] == ids0[: len(ids0) - 3]  # same history prefix up to turn0's <|end|>
    with pytest.raises(ValueError, match="turn"):
        build_turn_prompts(tok, req, ["a", "b"])


def test_iter_turns_uses_own_answers(tok, files):
    req = load_eval_set("mtbench", files["mtbench"], limit=1)[0]
    prompts = []

    def fake_generate(prompt_ids):
        prompts.append(list(prompt_ids))
        return "Hawaii is lovely" if len(prompts) == 1 else "A second"

    answers = iter_turns(req, fake_generate, tok)
    assert answers == ["Hawaii is lovely", "A second"]
    assert len(prompts) == 2
    assert _contains(prompts[1], tok("Hawaii is lovely", add_special_tokens=False)["input_ids"])
    assert prompts[1] == build_turn_prompts(tok, req, ["Hawaii is lovely"])


def test_iter_turns_without_tokenizer_gets_messages(files):
    req = load_eval_set("mtbench", files["mtbench"], limit=1)[0]
    seen = []
    answers = iter_turns(req, lambda msgs: seen.append(msgs) or f"ans{len(seen)}")
    assert answers == ["ans1", "ans2"]
    assert seen[1] == build_turn_messages(req, ["ans1"])
    assert [m["role"] for m in seen[1]] == ["user", "assistant", "user"]
    assert seen[1][1]["content"] == "ans1"
    with pytest.raises(TypeError):
        iter_turns(req, lambda msgs: 123)


def test_humaneval_raw_prompt_mode(tok, files):
    req = load_eval_set("humaneval", files["humaneval"], limit=1)[0]
    ids = build_turn_prompts(tok, req, [], use_raw_prompt=True)
    assert ids == tok(req.raw_prompt)["input_ids"]
    assert "<|user|>" not in _tokens(tok, ids)
    chat_ids = build_turn_prompts(tok, req, [])
    assert "<|user|>" in _tokens(tok, chat_ids)
    assert iter_turns(req, lambda ids: "    return a + b\n", tok, use_raw_prompt=True) == ["    return a + b\n"]


def test_eval_sets_constant():
    assert set(evalsets.EVAL_SETS) == {"gsm8k", "humaneval", "math500", "alpaca", "mtbench", "prompts"}
    assert os.path.basename(evalsets.__file__) == "evalsets.py"
