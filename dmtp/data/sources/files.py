"""data.source=files: local JSONL / JSON / Parquet files, each record plain text (`text_key`) or a conversation."""
from __future__ import annotations

import json
from pathlib import Path

from dmtp.data.records import encode_record
from dmtp.data.sources.catalogue import DataSource, register_source
from dmtp.errors import reason


def read_files(files: list[str], limit: int | None = None) -> list[dict]:
    """Every record of `files` in order (at most `limit`); a missing, empty or unreadable file is one line."""
    records = []
    for f in files:
        path = Path(f).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"training data file not found: {path}")
        before = len(records)
        records.extend(_parquet_rows(path) if path.suffix == ".parquet" else _json_rows(path))
        if len(records) == before:
            raise ValueError(f"training data file {path} holds no records")
    return records[:limit] if limit else records


def _parquet_rows(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except (OSError, ValueError) as e:   # pyarrow's ArrowInvalid is a ValueError
        raise ValueError(f"training data file {path} is not a readable Parquet file ({reason(e)})") from None


def _json_rows(path: Path) -> list[dict]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"training data file {path} is not UTF-8 text (a binary file?); "
                         "expected JSONL, JSON or Parquet") from None
    if path.suffix == ".json" and text.lstrip().startswith("["):
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: invalid JSON ({e.msg})") from None
    return rows


def file_examples(options, tokenizer, corpus: str, seed: int) -> list[tuple[list[int], list[int]]]:
    records = read_files(list(options.files), options.max_examples)
    return [encode_record(tokenizer, r, options.text_key) for r in records]


def _missing(options) -> str | None:
    if not options.files:
        return ("data=files needs data.files, a list of local JSONL/JSON/Parquet files "
                "(e.g. 'data.files=[/data/train.jsonl]')")
    return None


SOURCE = register_source(DataSource("files", file_examples, _missing))
