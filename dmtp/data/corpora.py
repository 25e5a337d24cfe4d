"""Embedded corpora that exist on every machine with Python, each in three domains: code, prose and math.

`stdlib` (the base-model testbed's):
- code:  the standard library's own source (found via `sysconfig`), test suites excluded.
- prose: the standard library's documentation text: `pydoc_data/topics.py` and module docstrings.
- math:  generated arithmetic word problems with worked answers (`mathgen`).
`assistant` (the chat-model testbed's, `dmtp.data.assistant`): generated requests and their responses
(a function stub and its body, "explain this function" and its explanation, a word problem and its worked
answer). A document of it is an exchange: `prompt_chars` marks where the request ends, and its prompts are
whole requests.

Splits are by document (a file, a topic, a docstring, a problem), assigned by a hash of the
document's name, so they are deterministic, machine-independent and never overlap.
"""
from __future__ import annotations

import ast
import hashlib
import json
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from dmtp.data.assistant import EXCHANGES
from dmtp.data.mathgen import math_documents

DOMAINS = ("code", "prose", "math")
CORPORA = ("stdlib", "assistant")
# Exchanges drawn per assistant domain (duplicates dropped: code keeps ~16k distinct requests, prose ~23k, math ~60k).
ASSISTANT_DRAWS = 60000
ASSISTANT_SEED = 0
SPLITS = ("train", "validation", "test")
# Percent of documents per split; the rest of 100 goes to train.
VALIDATION_PCT, TEST_PCT = 5, 5
MATH_PROBLEMS = 30000
MATH_SEED = 1234

_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__",
              "lib2to3", "ensurepip", "turtledemo", "config-3", "pydoc_data"}


@dataclass(frozen=True)
class Document:
    name: str
    text: str
    prompt_chars: int = 0   # an exchange's request is text[:prompt_chars] (0: not an exchange)

    @property
    def parts(self) -> tuple[str, ...]:
        """What is tokenized on its own: an exchange's request and response (a boundary a BPE must not merge
        across, as a chat template's turn boundary), else the whole text."""
        return (self.text[:self.prompt_chars], self.text[self.prompt_chars:]) if self.prompt_chars else (self.text,)


def split_of(name: str) -> str:
    bucket = int(hashlib.sha1(name.encode()).hexdigest(), 16) % 100
    if bucket < TEST_PCT:
        return "test"
    if bucket < TEST_PCT + VALIDATION_PCT:
        return "validation"
    return "train"


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _stdlib_sources() -> list[Path]:
    root = stdlib_dir()
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if any(p in _SKIP_DIRS or p.startswith("config-") or p.startswith("test_") for p in rel):
            continue
        files.append(path)
    return files


def _read(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None
    return text if 200 <= len(text) <= 400_000 else None


@lru_cache(maxsize=None)
def _code_documents() -> tuple[Document, ...]:
    root = stdlib_dir()
    docs = []
    for path in _stdlib_sources():
        text = _read(path)
        if text is not None:
            docs.append(Document("code:" + path.relative_to(root).as_posix(), text))
    if not docs:
        raise RuntimeError(f"no standard-library sources found under {root}")
    return tuple(docs)


@lru_cache(maxsize=None)
def _prose_documents() -> tuple[Document, ...]:
    from pydoc_data.topics import topics

    docs = [Document(f"prose:topic:{key}", text.strip() + "\n") for key, text in sorted(topics.items())
            if len(text) >= 200]
    root = stdlib_dir()
    for path in _stdlib_sources():
        text = _read(path)
        if text is None:
            continue
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        # One document per module: its module, class and function docstrings, in source order.
        nodes = [tree] + [n for n in ast.walk(tree)
                          if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
        parts = [ast.get_docstring(n, clean=True) or "" for n in nodes]
        doc = "\n\n".join(p.strip() for p in parts if len(p) >= 120)
        if len(doc) >= 300:
            docs.append(Document("prose:module:" + path.relative_to(root).as_posix(), doc + "\n"))
    return tuple(docs)


@lru_cache(maxsize=None)
def _math_documents() -> tuple[Document, ...]:
    return tuple(Document(f"math:{i}", text) for i, text in enumerate(math_documents(MATH_SEED, MATH_PROBLEMS)))


@lru_cache(maxsize=None)
def _assistant_documents(domain: str) -> tuple[Document, ...]:
    seen: dict[str, Document] = {}
    for i in range(ASSISTANT_DRAWS):
        e = EXCHANGES[domain](ASSISTANT_SEED, i)
        if e.request not in seen:   # named by the request, so a request never straddles two splits
            name = f"assistant-{domain}:" + hashlib.sha1(e.request.encode()).hexdigest()[:16]
            seen[e.request] = Document(name, e.request + e.response, prompt_chars=len(e.request))
    return tuple(seen.values())


_BUILDERS = {"stdlib": {"code": _code_documents, "prose": _prose_documents, "math": _math_documents},
             "assistant": {d: (lambda d=d: _assistant_documents(d)) for d in DOMAINS}}


def documents(domain: str, split: str, corpus: str = "stdlib") -> list[Document]:
    """The documents of one corpus's domain and split, in a fixed order."""
    if corpus not in _BUILDERS:
        raise ValueError(f"unknown corpus {corpus!r}; choose from {', '.join(CORPORA)}")
    if domain not in _BUILDERS[corpus]:
        raise ValueError(f"unknown corpus domain {domain!r}; choose from {', '.join(DOMAINS)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
    return [d for d in _BUILDERS[corpus][domain]() if split_of(d.name) == split]


def texts(domain: str, split: str, corpus: str = "stdlib") -> list[str]:
    return [d.text for d in documents(domain, split, corpus)]


def encode_documents(tokenizer, docs: list[Document]) -> list[list[int]]:
    """Token ids of each document, its parts encoded apart and concatenated (no special tokens)."""
    parts = [p for d in docs for p in d.parts]
    encoded = iter(tokenizer(parts, add_special_tokens=False)["input_ids"]) if parts else iter(())
    return [[t for _ in d.parts for t in next(encoded)] for d in docs]


def corpus_of_target(path) -> str:
    """The corpus an embedded target was built on (its build_report.json's `corpus`); stdlib for targets
    built before corpora had names, and for any other checkpoint (a user's model reads the stdlib prompts)."""
    report = Path(path) / "build_report.json" if path is not None else None
    if report is None or not report.is_file():
        return "stdlib"
    return json.loads(report.read_text()).get("corpus", "stdlib")
