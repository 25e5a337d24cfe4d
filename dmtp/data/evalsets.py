"""Evaluation prompt sets for decoding benchmarks.

Loads GSM8K, HumanEval, MATH500, Alpaca and MT-Bench from local files in their
public formats and turns them into :class:`EvalRequest` objects, then renders the
per-turn prompts with a tokenizer's chat template.

Accepted ``path`` values for :func:`load_eval_set`:

* a ``.jsonl`` / ``.jsonl.gz`` file (one JSON object per line),
* a ``.json`` file holding a list of objects (or a dict with one such list),
* a ``.parquet`` file,
* a directory holding such files (searched recursively; test-split files are
  preferred when a directory mixes splits; a ``datasets`` ``save_to_disk``
  directory is loaded with ``datasets.load_from_disk``),
* anything else that does not exist locally is passed to
  ``datasets.load_dataset`` as a Hub id, written ``id[:config][@split]``
  (per-set defaults, e.g. ``openai/gsm8k`` -> config ``main``, split ``test``).

Public field names used (extra fields are kept in ``EvalRequest.meta``):

* GSM8K     ``{question, answer}``
* HumanEval ``{task_id, prompt, canonical_solution, test, entry_point}``
* MATH500   ``{problem, solution, answer, subject, level, unique_id}``
* Alpaca    ``{instruction, input, output}``
* MT-Bench  ``{question_id, category, turns: [str, str]}`` (``question.jsonl``)
* prompts   ``{prompt}`` or ``{text}``: a plain prompt set, continued as written (completion style, no
  chat template); local files only

Only the fields needed to build the prompt (and the id, where the format has
one) are required; every other field is optional.
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

__all__ = [
    "EVAL_SETS",
    "EvalRequest",
    "load_eval_set",
    "render_prompt",
    "build_turn_messages",
    "build_turn_prompts",
    "iter_turns",
]


@dataclass
class EvalRequest:
    """One benchmark prompt: one or more user turns."""

    id: str
    turns: list[str]  # user messages (1 for single-turn, 2 for MT-Bench)
    domain: str  # e.g. "gsm8k"
    raw_prompt: str | None = None  # completion-style sets (HumanEval): text to continue, no chat template
    meta: dict[str, Any] = field(default_factory=dict)  # remaining public fields (answers, tests, category, ...)
    source: str = ""  # where the record is: "<file> line <n>" (JSONL) or "<file> record <i>" (named in errors)


# --------------------------------------------------------------------------- per-set specs


@dataclass(frozen=True)
class _SetSpec:
    required: tuple[str, ...]
    preferred_files: tuple[str, ...] = ()  # file names to use when a directory holds several
    preferred_subdirs: tuple[str, ...] = ()  # config folders to prefer (e.g. gsm8k "main" over "socratic")
    hf_config: str | None = None
    hf_split: str = "test"
    aliases: tuple[tuple[str, str], ...] = ()  # (public name, alternative name seen in other releases)
    local_only: bool = False  # never a Hub id: a missing path is a missing file


_SPECS: dict[str, _SetSpec] = {
    "gsm8k": _SetSpec(required=("question",), preferred_subdirs=("main",), hf_config="main"),
    "humaneval": _SetSpec(
        required=("task_id", "prompt"),
        preferred_files=("HumanEval.jsonl", "HumanEval.jsonl.gz", "human-eval-v2-20210705.jsonl"),
        preferred_subdirs=("openai_humaneval",),
    ),
    "math500": _SetSpec(required=("problem",), preferred_files=("test.jsonl",)),
    "alpaca": _SetSpec(
        required=("instruction",),
        preferred_files=("alpaca_data.json", "alpaca_eval.json"),
        hf_split="train",
    ),
    "mtbench": _SetSpec(
        required=("question_id", "turns"),
        preferred_files=("question.jsonl",),
        hf_split="train",
        # HuggingFaceH4/mt_bench_prompts spells the fields prompt_id / prompt
        aliases=(("question_id", "prompt_id"), ("turns", "prompt")),
    ),
    "prompts": _SetSpec(required=(), local_only=True),
}
PLAIN_PROMPT_KEYS = ("prompt", "text")   # the "prompts" set: either key holds the text to continue

EVAL_SETS: tuple[str, ...] = tuple(_SPECS)

_DATA_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".parquet")
# JSON files that describe a dataset rather than hold its rows
_METADATA_FILES = {"dataset_info.json", "state.json", "dataset_dict.json", "dataset_infos.json", "config.json"}


# --------------------------------------------------------------------------- file readers


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())


def _read_jsonl(path: str) -> Iterator[tuple[str, dict]]:
    """(\"line <n>\", record) for every non-blank line."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    yield f"line {lineno}", json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}: line {lineno} is not valid JSON ({_one_line(e)})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read JSONL ({_one_line(e)})") from None


def _read_json(path: str) -> Iterator[dict]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read JSON ({_one_line(e)})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        # a JSONL file saved with a .json name
        if e.msg.startswith("Extra data"):
            yield from (rec for _, rec in _read_jsonl(path))
            return
        raise ValueError(f"{path}: not valid JSON ({_one_line(e)})") from None
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) == 1:
            data = lists[0]
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
    yield from data


def _read_parquet(path: str) -> Iterator[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - pyarrow ships with datasets
        try:
            import pandas as pd
        except ImportError:
            raise ValueError(f"{path}: reading Parquet needs pyarrow or pandas (pip install pyarrow)") from None
        try:
            yield from pd.read_parquet(path).to_dict(orient="records")
        except Exception as e:
            raise ValueError(f"{path}: cannot read Parquet ({_one_line(e)})") from None
        return
    try:
        pf = pq.ParquetFile(path)
    except Exception as e:
        raise ValueError(f"{path}: cannot read Parquet ({_one_line(e)})") from None
    for batch in pf.iter_batches(batch_size=1024):
        yield from batch.to_pylist()


def _read_file(path: str) -> Iterator[tuple[str, dict]]:
    """(where in the file, record): "line <n>" in JSONL, "record <i>" (0-based) in JSON and Parquet."""
    low = path.lower()
    if low.endswith(".jsonl") or low.endswith(".jsonl.gz"):
        return _read_jsonl(path)
    if low.endswith(".json"):
        return ((f"record {i}", rec) for i, rec in enumerate(_read_json(path)))
    if low.endswith(".parquet"):
        return ((f"record {i}", rec) for i, rec in enumerate(_read_parquet(path)))
    raise ValueError(f"{path}: unsupported file type (expected .jsonl, .jsonl.gz, .json or .parquet)")


def _dir_files(root: str, spec: _SetSpec) -> list[str]:
    files: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith(".") or name in _METADATA_FILES:
                continue
            if name.lower().endswith(_DATA_SUFFIXES):
                files.append(os.path.join(dirpath, name))
    if not files:
        return []
    # 1) a well-known file name of this set
    for pref in spec.preferred_files:
        hits = [f for f in files if os.path.basename(f) == pref]
        if hits:
            return hits[:1]
    # 2) a preferred config folder (gsm8k: main/ rather than socratic/)
    for sub in spec.preferred_subdirs:
        hits = [f for f in files if sub in os.path.relpath(f, root).split(os.sep)[:-1]]
        if hits:
            files = hits
            break
    # 3) when the folder mixes splits, keep the evaluation split
    for split in ("test", "validation", "eval"):
        hits = [f for f in files if _split_of(os.path.relpath(f, root)) == split]
        if hits and len(hits) < len(files):
            return hits
    return files


def _split_of(relpath: str) -> str | None:
    """Split named by a file (``test-00000-of-00001.parquet``, ``test.jsonl``) or its folder."""
    parts = relpath.split(os.sep)
    stem = parts[-1].split(".")[0]
    for cand in [stem.split("-")[0], stem.split("_")[0], *parts[:-1]]:
        c = cand.lower()
        if c in ("test", "validation", "eval", "train", "dev"):
            return c
    return None


def _load_from_disk(path: str, split: str) -> tuple[str, list[dict]]:
    try:
        import datasets
    except ImportError:
        raise ValueError(f"{path}: looks like a datasets save_to_disk folder but `datasets` is not installed") from None
    try:
        ds = datasets.load_from_disk(path)
    except Exception as e:
        raise ValueError(f"{path}: datasets.load_from_disk failed ({type(e).__name__}: {_one_line(e)})") from None
    if isinstance(ds, datasets.DatasetDict):
        if split in ds:
            ds = ds[split]
        elif len(ds) == 1:
            ds = next(iter(ds.values()))
        else:
            raise ValueError(f"{path}: dataset has splits {sorted(ds)} but no {split!r} split")
    return path, list(ds)


def _load_hub(spec_str: str, spec: _SetSpec) -> Iterable[dict]:
    """``id[:config][@split]`` through ``datasets.load_dataset`` (network or local HF cache)."""
    ident, split = spec_str, spec.hf_split
    if "@" in ident:
        ident, split = ident.rsplit("@", 1)
    config = spec.hf_config
    if ":" in ident:
        ident, config = ident.split(":", 1)
    try:
        import datasets
    except ImportError:
        raise FileNotFoundError(f"{spec_str}: no such local file or directory (and `datasets` is not installed)") from None
    try:
        ds = datasets.load_dataset(ident, config, split=split)
    except Exception as e:
        # Retry without the default config: many ids have only a default one.
        if config is not None and config == spec.hf_config:
            try:
                ds = datasets.load_dataset(ident, split=split)
            except Exception:
                ds = None
        else:
            ds = None
        if ds is None:
            raise FileNotFoundError(
                f"{spec_str}: no such local file or directory, and datasets.load_dataset({ident!r}, "
                f"{config!r}, split={split!r}) failed: {type(e).__name__}: {_one_line(e)[:300]}"
            ) from None
    return ds


def _iter_source(path: str, spec: _SetSpec) -> Iterator[tuple[str, str, dict]]:
    """Yields (file the record came from, where in it, record)."""
    if os.path.isfile(path):
        for where, rec in _read_file(path):
            yield path, where, rec
        return
    if os.path.isdir(path):
        files = _dir_files(path, spec)
        if not files:
            if any(os.path.exists(os.path.join(path, m)) for m in ("state.json", "dataset_dict.json")):
                src, rows = _load_from_disk(path, spec.hf_split)
                for i, rec in enumerate(rows):
                    yield src, f"record {i}", rec
                return
            raise FileNotFoundError(f"{path}: directory holds no .jsonl/.json/.parquet files")
        for f in files:
            for where, rec in _read_file(f):
                yield f, where, rec
        return
    if os.path.exists(path):
        raise ValueError(f"{path}: not a regular file or directory")
    looks_local = spec.local_only or path.startswith((".", "/", "~")) or path.lower().endswith(_DATA_SUFFIXES)
    if looks_local:
        raise FileNotFoundError(f"{path}: no such file or directory")
    for i, rec in enumerate(_load_hub(path, spec)):
        yield path, f"record {i}", rec


# --------------------------------------------------------------------------- record -> request


def _field(rec: dict, name: str, spec: _SetSpec, src: str, idx: int) -> Any:
    if name in rec and rec[name] is not None:
        return rec[name]
    for public, alt in spec.aliases:
        if public == name and rec.get(alt) is not None:
            return rec[alt]
    have = ", ".join(sorted(map(str, rec))) or "none"
    raise ValueError(f"{src}: record {idx} is missing required field {name!r} (fields: {have})")


def _text(value: Any, name: str, src: str, idx: int) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{src}: record {idx} field {name!r} must be a string, got {type(value).__name__}")
    return value


def _to_request(name: str, spec: _SetSpec, src: str, idx: int, rec: Any) -> EvalRequest:
    if not isinstance(rec, dict):
        raise ValueError(f"{src}: record {idx} is a {type(rec).__name__}, expected a JSON object")
    for req in spec.required:
        _field(rec, req, spec, src, idx)
    used: set[str] = set(spec.required) | {alt for _, alt in spec.aliases}
    raw_prompt = None
    if name == "gsm8k":
        rid = str(rec.get("id", idx))
        turns = [_text(rec["question"], "question", src, idx)]
    elif name == "humaneval":
        rid = str(rec["task_id"])
        prompt = _text(rec["prompt"], "prompt", src, idx)
        turns, raw_prompt = [prompt], prompt
    elif name == "math500":
        rid = str(rec.get("unique_id") or idx)
        turns = [_text(rec["problem"], "problem", src, idx)]
    elif name == "alpaca":
        rid = str(rec.get("id", idx))
        instr = _text(rec["instruction"], "instruction", src, idx)
        extra = rec.get("input") or ""
        extra = _text(extra, "input", src, idx)
        used.add("input")
        turns = [f"{instr}\n\n{extra}" if extra.strip() else instr]
    elif name == "mtbench":
        rid = str(_field(rec, "question_id", spec, src, idx))
        raw_turns = _field(rec, "turns", spec, src, idx)
        if not isinstance(raw_turns, (list, tuple)) or not raw_turns:
            raise ValueError(f"{src}: record {idx} field 'turns' must be a non-empty list of strings")
        turns = [_text(t, "turns", src, idx) for t in raw_turns]
    elif name == "prompts":
        key = next((k for k in PLAIN_PROMPT_KEYS if rec.get(k) is not None), None)
        if key is None:
            have = ", ".join(sorted(map(str, rec))) or "none"
            raise ValueError(f"{src}: record {idx} has neither {' nor '.join(map(repr, PLAIN_PROMPT_KEYS))} "
                             f"(fields: {have})")
        rid = str(rec.get("id", idx))
        prompt = _text(rec[key], key, src, idx)
        turns, raw_prompt = [prompt], prompt
        used.update(PLAIN_PROMPT_KEYS)
    else:  # pragma: no cover - guarded by load_eval_set
        raise ValueError(f"unknown eval set {name!r}")
    meta = {k: v for k, v in rec.items() if k not in used}
    return EvalRequest(id=f"{name}/{rid}", turns=turns, domain=name, raw_prompt=raw_prompt, meta=meta)


def load_eval_set(name: str, path: str, limit: int | None = None) -> list[EvalRequest]:
    """Load the first ``limit`` prompts (all when ``None``) of eval set ``name`` from ``path``.

    Raises a one-line ``ValueError`` (unknown set, bad format, missing/ill-typed
    field) or ``FileNotFoundError`` (path missing locally and not loadable as a
    Hub dataset) naming the file and the problem.
    """
    key = str(name).lower().replace("-", "").replace("_", "")
    aliases = {"humaneval": "humaneval", "openaihumaneval": "humaneval", "math": "math500", "mtbench": "mtbench"}
    key = aliases.get(key, key)
    if key not in _SPECS:
        raise ValueError(f"unknown eval set {name!r}; expected one of {', '.join(EVAL_SETS)}")
    if limit is not None and (not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be a non-negative int or None, got {limit!r}")
    spec = _SPECS[key]
    path = os.path.expanduser(os.fspath(path))
    out: list[EvalRequest] = []
    if limit == 0:
        return out
    for idx, (src, where, rec) in enumerate(_iter_source(path, spec)):
        request = _to_request(key, spec, src, idx, rec)
        request.source = f"{src} {where}"
        out.append(request)
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise ValueError(f"{path}: no records found for eval set {key!r}")
    return out


# --------------------------------------------------------------------------- prompts


def _template_text(tokenizer) -> str | None:
    tmpl = getattr(tokenizer, "chat_template", None)
    if not tmpl:
        return None
    if isinstance(tmpl, dict):  # named templates
        return "\n".join(str(v) for v in tmpl.values())
    if isinstance(tmpl, (list, tuple)):
        return "\n".join(str(t.get("template", "")) if isinstance(t, dict) else str(t) for t in tmpl)
    return str(tmpl)


def _encode(tokenizer, text: str, add_special_tokens: bool) -> list[int]:
    enc = tokenizer(text, add_special_tokens=add_special_tokens)
    ids = enc["input_ids"] if not isinstance(enc, list) else enc
    return [int(i) for i in ids]


def render_prompt(tokenizer, messages: list[dict], enable_thinking: bool = False) -> list[int]:
    """Token ids of ``messages`` ready for generation.

    With a chat template: ``apply_chat_template(..., add_generation_prompt=True,
    tokenize=False)`` (passing ``enable_thinking`` only when the template mentions
    it), then encoded with ``add_special_tokens=False`` since the template already
    places BOS etc. Without a chat template: message contents joined by blank
    lines, encoded with the tokenizer's own special tokens.
    """
    tmpl = _template_text(tokenizer)
    if tmpl is None:
        text = "\n\n".join(str(m.get("content", "")) for m in messages)
        return _encode(tokenizer, text, add_special_tokens=True)
    kwargs: dict[str, Any] = {"add_generation_prompt": True, "tokenize": False}
    if "enable_thinking" in tmpl:
        kwargs["enable_thinking"] = bool(enable_thinking)
    text = tokenizer.apply_chat_template(messages, **kwargs)
    if isinstance(text, list):  # some versions return a batch for tokenize=False
        text = text[0]
    return _encode(tokenizer, text, add_special_tokens=False)


def build_turn_messages(request: EvalRequest, previous_answers: list[str]) -> list[dict]:
    """Chat messages for turn ``len(previous_answers)`` of ``request``."""
    i = len(previous_answers)
    if i >= len(request.turns):
        raise ValueError(f"{request.id}: has {len(request.turns)} turn(s), cannot build turn {i + 1}")
    messages: list[dict] = []
    for t in range(i):
        messages.append({"role": "user", "content": request.turns[t]})
        messages.append({"role": "assistant", "content": previous_answers[t]})
    messages.append({"role": "user", "content": request.turns[i]})
    return messages


def build_turn_prompts(
    tokenizer,
    request: EvalRequest,
    previous_answers: list[str],
    *,
    enable_thinking: bool = False,
    use_raw_prompt: bool = False,
) -> list[int]:
    """Prompt ids for turn ``i = len(previous_answers)``.

    Messages are ``[user turn0, assistant previous_answers[0], user turn1, ...]``,
    so MT-Bench's second turn carries the model's own first answer. With
    ``use_raw_prompt=True`` a completion-style request (``raw_prompt`` set, e.g.
    HumanEval) is encoded as plain text to continue, without chat template.
    """
    if use_raw_prompt and request.raw_prompt is not None:
        if previous_answers:
            raise ValueError(f"{request.id}: raw (completion) prompts are single-turn")
        return _encode(tokenizer, request.raw_prompt, add_special_tokens=True)
    return render_prompt(tokenizer, build_turn_messages(request, previous_answers), enable_thinking=enable_thinking)


def iter_turns(
    request: EvalRequest,
    generate_fn: Callable[[Any], str],
    tokenizer=None,
    *,
    enable_thinking: bool = False,
    use_raw_prompt: bool = False,
) -> list[str]:
    """Run every turn of ``request`` through ``generate_fn``; returns the answers.

    With a ``tokenizer``, ``generate_fn`` receives the prompt token ids of each
    turn (built by :func:`build_turn_prompts` from the answers so far). Without
    one it receives the list of chat message dicts instead.
    """
    answers: list[str] = []
    for _ in range(len(request.turns)):
        if tokenizer is None:
            prompt: Any = build_turn_messages(request, answers)
        else:
            prompt = build_turn_prompts(
                tokenizer, request, answers, enable_thinking=enable_thinking, use_raw_prompt=use_raw_prompt
            )
        answer = generate_fn(prompt)
        if not isinstance(answer, str):
            raise TypeError(f"{request.id}: generate_fn must return str, got {type(answer).__name__}")
        answers.append(answer)
        if use_raw_prompt and request.raw_prompt is not None:
            break
    return answers
