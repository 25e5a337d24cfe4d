"""data.source=hf: a Hugging Face dataset (`hf_dataset`, `hf_config`, `hf_split`), loaded by `datasets`."""
from __future__ import annotations

from dmtp.data.records import encode_record
from dmtp.data.sources.catalogue import DataSource, register_source


def read_dataset(name: str, config: str | None, split: str, limit: int | None = None) -> list:
    import datasets

    try:
        ds = datasets.load_dataset(name, config, split=split)
    except Exception as e:  # noqa: BLE001 - report any loader failure in one line
        raise FileNotFoundError(f"could not load dataset {name!r} ({type(e).__name__}: "
                                f"{str(e).splitlines()[0][:160]})") from None
    return list(ds.select(range(min(limit, len(ds)))) if limit else ds)


def dataset_examples(options, tokenizer, corpus: str, seed: int) -> list[tuple[list[int], list[int]]]:
    records = read_dataset(options.hf_dataset, options.hf_config, options.hf_split, options.max_examples)
    return [encode_record(tokenizer, r, options.text_key) for r in records]


def _missing(options) -> str | None:
    if not options.hf_dataset:
        return "data=hf needs data.hf_dataset (e.g. data.hf_dataset=mlabonne/open-perfectblend)"
    return None


SOURCE = register_source(DataSource("hf", dataset_examples, _missing))
