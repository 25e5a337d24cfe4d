"""Prompt sets shipped with the package: held-out workloads that no corpus split contains.

* `code_tasks`: 64 Python function stubs (a signature and a docstring each), written for this package, none
  taken from the standard library the `code` corpus is cut from: real programming tasks the target and its
  drafters never trained on (the tiny target's code is the stdlib's).

Each is a JSONL file of {"prompt": ...} records (the `prompts` eval-set format, continued as written), decoded
beside the corpus domains by naming it in `eval.domains` / `decode_eval.domains` (dmtp.inference.prompt_choice).
"""
from __future__ import annotations

from pathlib import Path

PROMPT_SETS = {"code_tasks": Path(__file__).with_name("code_tasks.jsonl")}


def prompt_set_path(name: str) -> Path:
    if name not in PROMPT_SETS:
        raise ValueError(f"unknown prompt set {name!r}; shipped: {', '.join(PROMPT_SETS)}")
    return PROMPT_SETS[name]


__all__ = ["PROMPT_SETS", "prompt_set_path"]
