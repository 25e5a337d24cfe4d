"""The one list of data sources: `data.source=<name>` is looked up here; a new source is a file of this
package that registers itself, its config `conf/data/<name>.yaml` and its test."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# (the source options, the tokenizer, the embedded corpus the target was built on, the seed) -> examples:
# (token ids, loss mask) per document or record
Examples = Callable[[object, object, str, int], list[tuple[list[int], list[int]]]]


@dataclass(frozen=True)
class DataSource:
    name: str
    examples: Examples
    # The options it cannot run without -> the one-line error when one is missing, else None
    missing: Callable[[object], str | None] = lambda options: None


SOURCES: dict[str, DataSource] = {}


def register_source(source: DataSource) -> DataSource:
    if source.name in SOURCES:
        raise ValueError(f"data source {source.name!r} is registered twice")
    SOURCES[source.name] = source
    return source


def source_named(name: str) -> DataSource:
    if name not in SOURCES:
        raise ValueError(f"data.source must be one of {', '.join(SOURCES)}, got {name!r}")
    return SOURCES[name]
