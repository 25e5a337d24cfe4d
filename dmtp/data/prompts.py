"""Held-out prompts of the embedded domains, for validation acceptance and decoding benchmarks.

Prompts start at paragraph starts (a document's start, or the line after a blank line) spread evenly
over a whole split. Taking each document's opening instead would measure mostly module docstrings and
imports for "code" (every stdlib file opens that way), not code. In a corpus of exchanges (`assistant`) a
prompt is a whole request, as a served model's is; the response is what decoding writes.
"""
from __future__ import annotations

import re

from dmtp.data.corpora import documents

_PARAGRAPH_BREAK = re.compile(r"\n(?:[ \t]*\n)+")
# A paragraph start qualifies when this many characters per prompt token follow it in its document
# (BPE averages ~3-4 characters per token here); candidates that still come out short are skipped.
_CHARS_PER_TOKEN = 6


def paragraph_starts(text: str) -> list[int]:
    starts = [0] if text.strip() else []
    starts += [m.end() for m in _PARAGRAPH_BREAK.finditer(text) if m.end() < len(text)]
    return starts


def held_out_prompts(tokenizer, domain: str, split: str, num_prompts: int, prompt_tokens: int,
                     corpus: str = "stdlib") -> list[list[int]]:
    """`num_prompts` prompts of exactly `prompt_tokens` tokens from one domain's split, deterministic (in a
    corpus of exchanges: `num_prompts` whole requests spread over the split, `prompt_tokens` unused).

    Fewer come back only when the split has fewer distinct qualifying paragraph starts."""
    if num_prompts < 1 or prompt_tokens < 1:
        raise ValueError(f"num_prompts and prompt_tokens must be >= 1, got {num_prompts} and {prompt_tokens}")
    docs = documents(domain, split, corpus)
    if docs and docs[0].prompt_chars:
        return request_prompts(tokenizer, docs, num_prompts)
    need = _CHARS_PER_TOKEN * prompt_tokens
    candidates = [(doc.text, start) for doc in docs for start in paragraph_starts(doc.text)
                  if len(doc.text) - start >= need or start == 0]
    prompts: list[list[int]] = []
    taken: set[int] = set()
    seen: set[tuple[int, ...]] = set()
    count = min(num_prompts, len(candidates))
    for k in range(count):
        # evenly spaced over the candidates; on a short one, the next untaken candidate after it
        i = (2 * k + 1) * len(candidates) // (2 * count)
        while i < len(candidates):
            if i not in taken:
                taken.add(i)
                text, start = candidates[i]
                ids = tokenizer(text[start: start + 2 * need], add_special_tokens=False)["input_ids"]
                prompt = tuple(ids[:prompt_tokens])
                if len(prompt) == prompt_tokens and prompt not in seen:  # boilerplate paragraphs repeat
                    seen.add(prompt)
                    prompts.append(list(prompt))
                    break
            i += 1
    return prompts


def request_prompts(tokenizer, docs, num_prompts: int) -> list[list[int]]:
    """The requests of `num_prompts` exchanges evenly spaced over `docs`, tokenized as the target read them."""
    count = min(num_prompts, len(docs))
    picked = [docs[(2 * k + 1) * len(docs) // (2 * count)] for k in range(count)]
    return [list(ids) for ids in tokenizer([d.parts[0] for d in picked], add_special_tokens=False)["input_ids"]]
