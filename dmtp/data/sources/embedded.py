"""data.source=embedded: the embedded corpora's training split, the `domains` asked for, shuffled by the seed."""
from __future__ import annotations

import random

from dmtp.data.corpora import documents, encode_documents
from dmtp.data.sources.catalogue import DataSource, register_source


def embedded_examples(options, tokenizer, corpus: str, seed: int) -> list[tuple[list[int], list[int]]]:
    docs = [t for d in options.domains for t in documents(d, "train", corpus)]
    random.Random(seed).shuffle(docs)
    docs = docs[: options.max_examples] if options.max_examples else docs
    return [(ids, [1] * len(ids)) for ids in encode_documents(tokenizer, docs) if ids]


SOURCE = register_source(DataSource("embedded", embedded_examples))
