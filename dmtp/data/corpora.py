"""Embedded corpora that exist on every machine with Python: code, prose and math.

- code:  the standard library's own source (found via `sysconfig`), test suites excluded.
- prose: the standard library's documentation text: `pydoc_data/topics.py` and module docstrings.
- math:  generated arithmetic word problems with worked answers (`mathgen`).

Splits are by document (a file, a topic, a docstring, a problem), assigned by a hash of the
document's name, so they are deterministic, machine-independent and never overlap.
"""
from __future__ import annotations

import ast
import hashlib
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from dmtp.data.mathgen import math_documents

DOMAINS = ("code", "prose", "math")
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


_BUILDERS = {"code": _code_documents, "prose": _prose_documents, "math": _math_documents}


def documents(domain: str, split: str) -> list[Document]:
    """The documents of one domain and split, in a fixed order."""
    if domain not in _BUILDERS:
        raise ValueError(f"unknown corpus domain {domain!r}; choose from {', '.join(DOMAINS)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
    return [d for d in _BUILDERS[domain]() if split_of(d.name) == split]


def texts(domain: str, split: str) -> list[str]:
    return [d.text for d in documents(domain, split)]
