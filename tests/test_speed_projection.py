"""Speed where users serve (dmtp.speed): each method's round from its own config, the projection's arithmetic,
the shipped 8B/H200 profile (every figure labelled, the composition reproducing its measured rounds), and the
columns every table prints."""
import json

import pytest

from dmtp.drafters.block_drafter import fresh_drafter_for
from dmtp.speed import SpeedProfile, StageCost, load_profile, project, projected_speedup, round_recipe
from dmtp.speed.projection import price, recipe_of
from dmtp.speed.recipe import BlockForward, RoundRecipe

EIGHT_B = "qwen3-8b.h200.bf16"


def _profile(stages: dict, batch: int = 1, name: str = "toy") -> SpeedProfile:
    return SpeedProfile(name, batch, {k: StageCost(v, "measured: test") for k, v in stages.items()})


# -- the rounds ---------------------------------------------------------------------------------------------------

def test_chains_and_ar():
    assert round_recipe("ar").stages() == [("verify/r1", 1)]
    assert round_recipe("mtp415").stages() == [("verify/r5", 1), ("head/full/r1", 4), ("mtp/step", 3),
                                               ("mtp/catch_up/r5", 1)]
    assert round_recipe("mtp:7", draft_vocab=512).stages() == [("verify/r8", 1), ("head/v512/r1", 7), ("mtp/step", 6),
                                                               ("mtp/catch_up/r8", 1)]
    assert round_recipe("mtp", mtp_steps=2).verify_rows == 3
    with pytest.raises(ValueError, match="needs its drafter"):
        round_recipe("drafter")


@pytest.fixture(scope="module")
def drafters(micro_target):
    t = micro_target
    return {
        "raw": fresh_drafter_for(t, "raw_dflash", 3, num_layers=2, num_target_features=3),
        "dmtp": fresh_drafter_for(t, "dual_anchor_zero_init", 3, mtp_correction_rank=4),
        "multi3": fresh_drafter_for(t, "multi_mtp_zero_init", 3, max_mtp_tokens=3, backbone={"architecture": "dspark"}),
        "production": fresh_drafter_for(t, "multi_mtp_zero_init", 3, max_mtp_tokens=7, mtp_correction_rank=4,
                                        backbone={"architecture": "dspark"}),
        "dflash2_b16": fresh_drafter_for(t, "dual_anchor_zero_init", 3, block_size=16, backbone={"architecture": "dflash2"}),
        "context": fresh_drafter_for(t, "context_fusion", 3, num_target_features=2),
    }


def test_drafter_rounds_follow_their_config(drafters):
    raw = round_recipe("drafter", drafters["raw"])
    assert raw.mtp_steps == 0 and not raw.mtp_catch_up and raw.slots == "raw" and raw.verify_rows == 8
    assert raw.block == BlockForward("dflash", 8, 2, 3, 7, False)
    assert dict(raw.stages()) == {"verify/r8": 1, "slots/raw": 1, "drafter/b8": 1, "drafter/b8/layer": 1,
                                  "drafter/b8/tap": 2}
    dmtp = dict(round_recipe("drafter", drafters["dmtp"]).stages())
    # one MTP step (its head, corrected), the T1 fusion, the drafter's head over 6 slots instead of the measured 7
    assert dmtp == {"verify/r8": 1, "head/full/r1": 1, "mtp/correction": 1, "mtp/catch_up/r8": 1, "fusion/t1": 1,
                    "drafter/b8": 1, "head/full/r7": -1, "head/full/r6": 1}
    multi = dict(round_recipe("drafter", drafters["multi3"]).stages())
    assert multi["head/full/r1"] == 3 and multi["mtp/step"] == 2 and multi["dspark/b8/markov"] == 1
    assert multi["dspark/b8/confidence"] == 1 and multi["head/full/r6"] == 1   # its head runs over all 6 slots
    # m = 7: the MTP's chain is the whole block, no block forward (as build_proposer decodes it)
    production = round_recipe("drafter", drafters["production"])
    assert production.block is None and dict(production.stages()) == {
        "verify/r8": 1, "head/full/r1": 7, "mtp/step": 6, "mtp/correction": 7, "mtp/catch_up/r8": 1}
    assert "dflash2/b16/selector" in dict(round_recipe("drafter", drafters["dflash2_b16"]).stages())
    assert round_recipe("drafter", drafters["context"]).block.taps == 3   # 2 tapped layers + the MTP's feature


def test_a_saved_drafter_gives_the_same_round(drafters, tmp_path):
    for name in ("raw", "production", "multi3"):
        drafters[name].save(tmp_path / name)
        assert round_recipe("drafter", tmp_path / name) == round_recipe("drafter", drafters[name])
        config = json.loads((tmp_path / name / "config.json").read_text())
        assert round_recipe("drafter", config, draft_vocab=64) == round_recipe("drafter", drafters[name], 64)


def test_the_round_is_what_the_loop_runs(micro_target, micro_mtp, drafters):
    """The recipe and the loop's stages agree: verify width, a chain stage, a block stage, the slot build."""
    from dmtp.decode import build_proposer
    from dmtp.families.decoding import spec_decoder

    for name, drafter in [("mtp415", None), ("ar", None), *drafters.items()]:
        method = name if drafter is None else "drafter"
        dec = spec_decoder(micro_target, build_proposer(method, micro_target, mtp=micro_mtp, drafter=drafter),
                           eos_token_id=[])
        dec.generate([[5, 6, 7, 8]], max_new_tokens=2)
        names = [s.name for s in dec.stages(dec.st)]
        recipe = round_recipe(method, drafter)
        assert recipe.verify_rows == dec.num_candidates + 1, name
        assert ("drafter" in names) == (recipe.block is not None), name
        assert ("slots" in names) == (recipe.slots == "raw"), name
        assert ("t1_fusion" in names) == (recipe.slots == "fusion"), name
        after = names[names.index("verify") + 1:]
        assert ("mtp" in after) == recipe.mtp_catch_up, name
        assert ("mtp" in names[:names.index("verify")] or "t1_fusion" in names) == (recipe.mtp_steps > 0), name


# -- the arithmetic -----------------------------------------------------------------------------------------------

def test_speedup_is_tau_times_ar_over_the_round():
    p = _profile({"verify/r1": 10.0, "verify/r5": 12.0, "head/full/r1": 0.5, "mtp/step": 0.25, "mtp/catch_up/r5": 0.5})
    r = round_recipe("mtp415")
    ms, missing, derived = price(r, p)
    assert ms == pytest.approx(12.0 + 4 * 0.5 + 3 * 0.25 + 0.5) and missing == () and derived == ()
    got = project(r, 3.0, p)
    assert got.speedup == pytest.approx(3.0 * 10.0 / 15.25) and got.cell() == f"{3 * 10 / 15.25:.2f}x"
    assert project(round_recipe("ar"), 1.0, p).speedup == pytest.approx(1.0)


def test_a_missing_stage_is_named_never_zero():
    p = _profile({"verify/r1": 10.0, "verify/r8": 11.0})
    got = project(round_recipe("mtp:7"), 5.0, p)
    assert got.speedup is None and got.cell() == "-"
    assert got.missing == ("head/full/r1", "mtp/step", "mtp/catch_up/r8")
    assert got.why() == ("mtp:7: no projection at toy b1: the profile lacks head/full/r1, mtp/step, mtp/catch_up/r8")
    no_ar = project(round_recipe("ar"), 1.0, _profile({"verify/r8": 11.0}))
    assert no_ar.speedup is None and "verify/r1" in no_ar.why()


def test_negative_counts_swap_the_block_head():
    recipe = RoundRecipe("d", 8, slots="raw", block=BlockForward("dflash", 8, 1, 1, 7), draft_vocab=64)
    p = _profile({"verify/r1": 4.0, "verify/r8": 5.0, "slots/raw": 0.1, "drafter/b8": 1.0, "head/full/r7": 0.4,
                  "head/v64/r7": 0.1})
    assert price(recipe, p)[0] == pytest.approx(5.0 + 0.1 + 1.0 - 0.4 + 0.1)


def test_derived_stages_are_reported():
    p = SpeedProfile("toy", 1, {"verify/r1": StageCost(2.0, "measured: x"), "verify/r2": StageCost(2.5, "derived: y"),
                                "head/full/r1": StageCost(0.1, "derived: z"), "mtp/catch_up/r2": StageCost(0.2, "measured")})
    got = project(round_recipe("mtp:1"), 1.5, p)
    assert got.derived == ("verify/r2", "head/full/r1") and got.speedup == pytest.approx(1.5 * 2.0 / 2.8)


def test_records_and_recipes_are_accepted(drafters, tmp_path):
    drafters["dmtp"].save(tmp_path / "d")
    by_dir = projected_speedup({"method": "drafter", "drafter": str(tmp_path / "d")}, 4.0)
    by_recipe = projected_speedup(round_recipe("drafter", drafters["dmtp"]).as_dict(), 4.0)
    assert by_dir.speedup == pytest.approx(by_recipe.speedup) and by_dir.ok
    assert recipe_of({"recipe": round_recipe("mtp415").as_dict()}) == round_recipe("mtp415")


# -- the shipped 8B profile ---------------------------------------------------------------------------------------

def test_every_8b_figure_says_where_it_came_from():
    for batch in (1, 8, 32):
        p = load_profile(EIGHT_B, batch)
        assert p.provenance["commit"] == "c3e183b" and p.provenance["date"] == "2026-12-04"
        for key, cost in {**p.stages, **p.rounds}.items():
            assert cost.source.startswith(("measured", "derived")), key
            assert cost.ms > 0 or key == "verify/r1", key
        assert p.missing or batch == 1   # what it lacks is listed (batch 1 lacks nothing a method runs)
    b1 = load_profile(EIGHT_B, 1)
    assert {k for k, c in b1.stages.items() if not c.derived} == {"verify/r1", "verify/r8", "verify/r16", "drafter/b8",
                                                                  "mtp/catch_up/r8"}
    # never measured at 8B: lower bounds from their bytes, labelled so
    for key in ("dspark/b8/markov", "dspark/b8/confidence", "dflash2/b8/selector"):
        assert b1.stages[key].source.startswith("derived (lower bound)") and 0 < b1.stages[key].ms < 0.1, key


def test_the_8b_composition_reproduces_its_measured_rounds():
    p = load_profile(EIGHT_B, 1)
    rounds = {
        "ar": round_recipe("ar"), "mtp415": round_recipe("mtp415"),
        "raw_dflash l1 t1 b8": RoundRecipe("r", 8, slots="raw", block=BlockForward("dflash", 8, 1, 1, 7)),
        "dual_anchor_zero_init l1 t1 b8": RoundRecipe("d", 8, 1, True, slots="fusion",
                                                      block=BlockForward("dflash", 8, 1, 1, 6)),
        "raw_dflash l5 t5 b16": RoundRecipe("r", 16, slots="raw", block=BlockForward("dflash", 16, 5, 5, 15)),
        "dual_anchor_zero_init l5 t5 b16": RoundRecipe("d", 16, 1, True, slots="fusion",
                                                       block=BlockForward("dflash", 16, 5, 5, 14)),
    }
    for key, recipe in rounds.items():
        assert price(recipe, p)[0] == pytest.approx(p.rounds[key].ms, rel=0.02), key


def test_8b_batch_32_refuses_with_the_stages_it_lacks():
    got = projected_speedup("mtp415", 3.0, EIGHT_B, batch=32)
    assert got.speedup is None and got.missing[0] == "verify/r5"
    assert projected_speedup("ar", 1.0, EIGHT_B, batch=32).speedup == pytest.approx(1.0)
    assert projected_speedup("mtp:7", 5.0, EIGHT_B, batch=1).ok


def test_the_shipped_8b_files_are_what_the_reference_writes(tmp_path):
    from dmtp.speed.reference import main

    main(["--out", str(tmp_path)])
    for batch in (1, 8, 32):
        name = f"{EIGHT_B}.b{batch}.json"
        assert json.loads((tmp_path / name).read_text()) == json.loads(load_profile_path(name).read_text())


def load_profile_path(name):
    from dmtp.speed.profile import PROFILES_DIR

    return PROFILES_DIR / name


def test_unknown_profile_is_one_line():
    with pytest.raises(FileNotFoundError, match="no speed profile 'nope' at batch 1"):
        load_profile("nope", 1)


# -- the tables ---------------------------------------------------------------------------------------------------

def _summary(tau_verify):
    return {"tau_per_request": tau_verify, "tau_per_verify": tau_verify, "per_request": [{"tau": tau_verify}] * 4,
            "t1_accept": 0.5, "p_len_ge": [0.5], "tokens_per_s": 100.0, "stage_ms_per_round": {"round": 1.0},
            "sampling": {"temperature": 0.0}}


def test_the_decode_report_prints_the_projection():
    from dmtp.reports.decode_report import report

    table = {"ar": _summary(1.0), "mtp:7": _summary(5.0)}
    recipes = {m: round_recipe(m).as_dict() for m in table}
    metrics = {"workloads": {"code": table}, "overall": table,
               "run": {"speed": {"profile": EIGHT_B, "batches": [1, 32], "recipes": recipes}}}
    text = report(metrics)
    assert "x b1" in text and "x b32" in text and "qwen3-8b.h200.bf16" in text
    mtp7 = next(line for line in text.splitlines() if line.startswith("code") and "mtp:7" in line)
    expected = projected_speedup("mtp:7", 5.0).cell()
    assert expected in mtp7
    assert "mtp:7: no projection at qwen3-8b.h200.bf16 b32: the profile lacks verify/r8" in text
    assert "round at qwen3-8b.h200.bf16 b1: ar 9.38 ms, mtp:7" in text
    del metrics["run"]["speed"]
    assert "x b1" not in report(metrics)


def test_the_run_end_table_keeps_its_rows_and_adds_the_projection():
    from dmtp.reports.evaluation import evaluation_table

    def stats(tau):
        return {"tau": tau, "tau_verify": tau, "tau_requests": [tau] * 4}

    per = {wl: {"drafter": stats(4.0), "mtp415": stats(3.0), "ar": stats(1.0)}
           for wl in ("code", "code_tasks", "all", "in-distribution", "held out")}
    record = {"protocol": {"workloads": {"code": 4, "code_tasks": 4}, "held_out": ["code_tasks"]},
              "modes": {"greedy": per},
              "speed": {"profile": EIGHT_B, "batches": [1, 32],
                        "recipes": {"greedy": {m: round_recipe(m).as_dict() for m in ("ar", "mtp415")}
                                    | {"drafter": round_recipe("mtp:7").as_dict()}}}}
    text = evaluation_table(record, "m")
    lines = text.splitlines()
    assert lines[2].split()[:2] == ["workload", "greedy"]   # the main table as before
    assert any(line.startswith("code_tasks (held out)") for line in lines)
    assert any(line.startswith("held out") for line in lines) and any(line.startswith("in-distribution") for line in lines)
    assert "greedy drafter" in text and projected_speedup("mtp:7", 4.0).cell() + " / -" in text
    assert "drafter: no projection at qwen3-8b.h200.bf16 b32" in text
    del record["speed"]
    assert "x b1" not in evaluation_table(record, "m")


def test_the_sweep_tables_project_every_method(drafters, tmp_path):
    from dmtp.reports.sweep import DRAFTER_KEY, EVAL_KEY, protocol_recipes, protocol_tables

    def stats(tau):
        return {"tau": tau, "tau_verify": tau, "tau_requests": [tau] * 4, "t1_accept": 0.5, "p_len_ge": [0.5]}

    drafters["dmtp"].save(tmp_path / "drafter")
    per = {"code": {"drafter": stats(4.0), "mtp415": stats(3.0), "ar": stats(1.0)}}
    rows = [{"method": "dual_anchor_zero_init", "seed": 0, DRAFTER_KEY: str(tmp_path / "drafter"),   # an older record
             EVAL_KEY: {"modes": {"greedy": per}}}]
    recipes = protocol_recipes(rows)["greedy"]
    assert recipes["dual_anchor_zero_init"] == round_recipe("drafter", drafters["dmtp"]).as_dict()
    text = protocol_tables(rows)
    assert "| x b1 | x b32 |" in text and projected_speedup(recipes["dual_anchor_zero_init"], 4.0).cell() in text
    assert "- dual_anchor_zero_init: no projection at qwen3-8b.h200.bf16 b32" in text
    del rows[0][DRAFTER_KEY]
    assert "no recipe" in protocol_tables(rows)
