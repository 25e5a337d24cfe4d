"""The embedded targets ship built (dmtp.tiny.shipped): unpacked on first use after every weight file is checked
against its recorded sha256, named by their weights' digest in every table, and a rebuild says whether it
reproduced them."""
import json
import shutil

import pytest

from dmtp.models.provenance import file_sha256, weights_digest
from dmtp.tiny import shipped
from dmtp.tiny.shipped import compare_with_shipped, shipped_copy, unpack_shipped
from dmtp.tiny.targets import default_target_dir, ensure_tiny_target


@pytest.mark.parametrize("preset", ["tiny", "tiny_hybrid", "assistant", "assistant_early", "assistant_hybrid"])
def test_the_embedded_targets_ship_with_their_hashes(preset):
    source = shipped_copy(default_target_dir(preset).name)
    assert source is not None, f"the {preset} target must ship with the package (its recipe's build)"
    report = json.loads((source / "build_report.json").read_text())
    assert report["preset"] == preset
    assert report.get("corpus", "stdlib") == ("assistant" if preset.startswith("assistant") else "stdlib")
    assert {f.name for f in source.glob("*.safetensors")} == set(report["weights_sha256"])
    for name, digest in report["weights_sha256"].items():
        assert file_sha256(source / name) == digest


@pytest.fixture
def fake_shipped(tmp_path, micro_target_dir, monkeypatch):
    """The micro target as if the package shipped it, and an empty cache."""
    ship = tmp_path / "shipped"
    shutil.copytree(micro_target_dir, ship / micro_target_dir.name)
    monkeypatch.setattr(shipped, "SHIPPED_DIR", ship)
    monkeypatch.setenv("DMTP_HOME", str(tmp_path / "home"))
    return ship / micro_target_dir.name


def test_first_use_unpacks_the_shipped_build(fake_shipped, capsys):
    path = ensure_tiny_target("micro")
    assert path == default_target_dir("micro") and path.name == fake_shipped.name
    assert weights_digest(path) == weights_digest(fake_shipped)
    assert "unpacked from the package" in capsys.readouterr().out
    assert json.loads((path / "build_report.json").read_text())[shipped.UNPACKED] is True
    assert "was unpacked from the package: the shipped weights" in compare_with_shipped(path)


def test_a_tampered_shipped_file_is_refused_and_nothing_is_published(fake_shipped):
    weights = fake_shipped / "mtp.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    target = default_target_dir("micro")
    with pytest.raises(ValueError, match=r"mtp.safetensors has sha256 [0-9a-f]{64}, its build report records"):
        unpack_shipped(target)
    assert not target.exists()


def test_a_build_says_whether_it_reproduced_the_shipped_weights(fake_shipped, tmp_path):
    built = tmp_path / "built" / fake_shipped.name
    shutil.copytree(fake_shipped, built)
    assert "reproduced the shipped weights" in compare_with_shipped(built)
    other = built / "mtp.safetensors"
    data = bytearray(other.read_bytes())
    data[-1] ^= 1
    other.write_bytes(bytes(data))
    line = compare_with_shipped(built)
    assert "differ from the shipped ones" in line and weights_digest(built) in line
    assert "ships no build" in compare_with_shipped(tmp_path / "built" / "tiny-00000000")
