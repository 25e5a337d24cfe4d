"""The training text's sources are one catalogue (dmtp.data.sources): every shipped data config names a
registered source, a source is registered once, and a missing option or an unknown source is one line."""
from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dmtp.data.sources import SOURCES, DataSource, source_named
from dmtp.data.sources.catalogue import register_source
from dmtp.training.data_options import SourceOptions

CONF = Path(__file__).resolve().parents[1] / "conf" / "data"


def test_every_shipped_data_config_names_a_registered_source():
    named = {OmegaConf.load(p).get("source", "embedded") for p in CONF.glob("*.yaml")}
    assert named <= set(SOURCES) and {"embedded", "files", "hf"} <= set(SOURCES)
    for name, source in SOURCES.items():   # each source lives in its own file of the package
        assert source.examples.__module__ == f"dmtp.data.sources.{name}"


def test_an_unknown_or_incomplete_source_is_one_line():
    with pytest.raises(ValueError, match=r"^data.source must be one of embedded, files, hf, got 'web'$"):
        SourceOptions(source="web")
    with pytest.raises(ValueError, match="data=files needs data.files"):
        SourceOptions(source="files")
    with pytest.raises(ValueError, match="data=hf needs data.hf_dataset"):
        SourceOptions(source="hf")


def test_a_source_registers_once():
    with pytest.raises(ValueError, match="registered twice"):
        register_source(DataSource("files", source_named("files").examples))


def test_the_files_source_reads_jsonl_text_and_conversations(tmp_path):
    from dmtp.data.sources.files import read_files

    f = tmp_path / "train.jsonl"
    f.write_text('{"text": "def f(): return 1"}\n\n{"messages": [{"role": "user", "content": "hi"}]}\n')
    assert read_files([str(f)]) == [{"text": "def f(): return 1"}, {"messages": [{"role": "user", "content": "hi"}]}]
    assert read_files([str(f)], limit=1) == [{"text": "def f(): return 1"}]
