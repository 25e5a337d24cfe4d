"""`python -m dmtp.bench.speed_profile`: a profile measured at a small shape on the CPU holds every stage the
methods' rounds read, each with where it came from, and what the projection needs to price every method."""
import json

import pytest

from dmtp.bench.speed_profile import main
from dmtp.speed import load_profile, projected_speedup, round_recipe
from dmtp.speed.recipe import BlockForward, RoundRecipe


@pytest.fixture(scope="module")
def measured(tmp_path_factory, micro_target_dir):
    out = tmp_path_factory.mktemp("profiles")
    assert main(["--target", str(micro_target_dir), "--batch", "1", "2", "--blocks", "4", "--context", "16", "--reps", "1",
                 "--draft-vocab", "64", "--name", "micro-test", "--out", str(out), "--device", "cpu"]) == 0
    return out


def test_the_profile_files_and_their_provenance(measured):
    for batch in (1, 2):
        data = json.loads((measured / f"micro-test.b{batch}.json").read_text())
        assert data["batch"] == batch and data["context"] == 16 and data["device"].startswith("cpu")
        assert {"commit", "torch", "date", "command", "clock"} <= set(data["provenance"])
        assert all(s["source"].startswith("measured") and s["ms"] >= 0 for s in data["stages"].values())
        assert set(data["rounds"]) == {"ar", "mtp415", "mtp:7", "raw_dflash l1 t1 b4", "dual_anchor_zero_init l1 t1 b4"}


def test_every_method_it_measured_projects(measured):
    p = load_profile(measured / "micro-test.b1.json")
    recipes = [round_recipe("ar"), round_recipe("mtp:3"), round_recipe("mtp:3", draft_vocab=64),
               RoundRecipe("raw", 4, slots="raw", block=BlockForward("dflash", 4, 3, 2, 3)),
               RoundRecipe("dmtp", 4, 1, True, True, "fusion", BlockForward("dspark", 4, 2, 1, 2, True), 64),
               RoundRecipe("d2", 4, 0, False, slots="raw", block=BlockForward("dflash2", 4, 1, 1, 3))]
    for r in recipes:
        got = projected_speedup(r, 2.0, p)
        assert got.ok and got.derived == (), (r.method, got.missing)
    assert not projected_speedup("mtp415", 2.0, p).ok   # verify/r5: wider than its largest block (4)


def test_the_draft_head_micro_benchmark(tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tools" / "bench" / "bench_draft_head.py"
    spec = importlib.util.spec_from_file_location("bench_draft_head", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--hidden", "32", "--vocab", "1024", "--sizes", "128", "--reps", "2", "--out", str(tmp_path / "r.json")])
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert [(r["dtype"], r["V"]) for r in rows] == [("float32", 1024), ("float32", 128), ("bfloat16", 1024),
                                                   ("bfloat16", 128)]
    assert rows[1]["bytes x full"] == 0.125 and rows[0]["x full"] == 1.0
