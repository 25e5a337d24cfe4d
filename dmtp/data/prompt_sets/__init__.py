"""Prompt sets shipped with the package: held-out workloads that no corpus split contains.

* `code_tasks`: 64 Python function stubs (a signature and a docstring each), written for this package, none
  taken from the standard library the `code` corpus is cut from: real programming tasks the target and its
  drafters never trained on (the tiny target's code is the stdlib's).
* `prose_tasks`: the same 64 tasks with a body written by hand, each behind the assistant corpus's request
  "Explain what this function does.": explanations the chat-model target writes of programs of another shape than
  its corpus's generated ones (the prose workload held out as a set, as the seed's MT-Bench).

Each is a JSONL file of {"prompt": ...} records (the `prompts` eval-set format, continued as written), decoded
beside the corpus domains by naming it in `eval.domains` / `decode_eval.domains` (dmtp.inference.prompt_choice).
"""
from __future__ import annotations

from pathlib import Path

PROMPT_SETS = {name: Path(__file__).with_name(f"{name}.jsonl") for name in ("code_tasks", "prose_tasks")}


def prompt_set_path(name: str) -> Path:
    if name not in PROMPT_SETS:
        raise ValueError(f"unknown prompt set {name!r}; shipped: {', '.join(PROMPT_SETS)}")
    return PROMPT_SETS[name]


__all__ = ["PROMPT_SETS", "prompt_set_path"]
