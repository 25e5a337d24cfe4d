"""A real 2-variant multirun on the micro target, aggregated into a table and plots."""
import csv
import json
import subprocess
import sys

import pytest

from dmtp.reports.sweep import aggregate, collect, detail_table, markdown_table


@pytest.mark.slow
def test_two_variant_multirun_aggregates(tmp_path):
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "dmtp.train", "-m", "+sweep=main", "hydra.sweeper.params.seed=0",
           "debug=tiny_budget", "logger=none", "callbacks=none", "data.max_examples=40", f"hydra.sweep.dir={sweep}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    jobs = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/metrics.json"))]
    assert {j["injection"] for j in jobs} == {"raw_dflash", "dual_anchor_zero_init"}
    report = sweep / "report"          # written by the on_multirun_end callback
    table = (report / "results.md").read_text()
    for job in jobs:
        assert job["math/tau"] >= 1.0 and 0.0 <= job["math/t1_accept"] <= 1.0   # decoded with the one loop
        assert f"{job['math/tau']:.3f}" in table
        # the walk ran on the validation split's prompts: its figures stay in the CSV, never beside the decoded ones
        assert "tau walk/math" not in table
        assert job["eval"]["protocol"]["workloads"]["math"] == 2 and "greedy" in job["eval"]["modes"]
    for job in jobs:   # the walk also walks the MTP chain alone, where the variant loads the MTP
        assert ("walk/math/mtp415_tau" in job) == (job["injection"] != "raw_dflash")
    rows = list(csv.DictReader((report / "results.csv").open()))
    assert len(rows) == 2 and {r["injection"] for r in rows} == {"raw_dflash", "dual_anchor_zero_init"}
    for job in jobs:   # sweeps/main.yaml decodes at batch 1, 4 and 8 too
        assert all(job[f"throughput/bs{b}/tok_s"] > 0 for b in (1, 4, 8))
    assert "## Evaluation protocol" in table and "| mtp415 | 1 |" in table
    for png in ("acceptance_length.png", "t1_acceptance.png", "p_len_ge_math.png", "throughput_vs_batch.png"):
        assert (report / png).stat().st_size > 1000
    assert "+" in table or "-" in table  # the change vs raw DFlash column is filled


def test_aggregate_by_hand(tmp_path):
    for i, (method, seed, tau) in enumerate([("raw_dflash", 0, 2.0), ("raw_dflash", 1, 2.2),
                                             ("dual_anchor_zero_init", 0, 2.6), ("token_only", 0, 2.4)]):
        job = tmp_path / str(i)
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(f"- injection={method}\n- seed={seed}\n")
        (job / "metrics.json").write_text(json.dumps({"method": method, "code": {"tau": tau, "t1_accept": 0.5,
                                                                                  "p_len_ge_1": 0.5}}))
    rows = collect(tmp_path)
    assert len(rows) == 4 and rows[0]["code/tau"] in (2.0, 2.2, 2.6, 2.4)
    table = markdown_table(rows)
    assert "2.100 ± 0.141" in table                 # raw DFlash mean ± stdev over two seeds
    assert "+23.81%" in table                       # 2.6 / 2.1 - 1
    assert "+8.33%" in table                        # 2.6 / 2.4 - 1, vs token-only
    detail = detail_table(rows)
    assert "| raw_dflash | 2.100 ± 0.141 | 0.500 ± 0.000 |  | 0.50 ± 0.00 |" in detail
    assert "| token_only | 2.400 | 0.500 |  | 0.50 |" in detail
    out = aggregate(tmp_path, tmp_path / "report")
    assert detail in (out / "results.md").read_text()
    assert (out / "acceptance_length.png").exists() and (out / "p_len_ge_code.png").exists()


def test_a_loss_or_markov_head_override_is_another_method_not_another_seed(tmp_path):
    """Jobs that differ in model.loss (or DSpark's drafter.markov_head_type) are rows of their own; the default
    value keeps the plain name, so the existing tables are unchanged."""
    jobs = [("raw_dflash", "ce", None, 2.0), ("raw_dflash", "tv", None, 1.5),
            ("raw_dflash+dspark", "ce", "rnn", 3.0), ("raw_dflash+dspark", "ce", "vanilla", 2.5)]
    for i, (method, loss, head, tau) in enumerate(jobs):
        job = tmp_path / str(i)
        (job / ".hydra").mkdir(parents=True)
        overrides = [f"injection={method.split('+')[0]}", "seed=0", f"model.loss={loss}"]
        if head:
            overrides.append(f"drafter.markov_head_type={head}")
        (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
        (job / "metrics.json").write_text(json.dumps({"method": method, "code": {"tau": tau}}))
    assert [r["method"] for r in collect(tmp_path)] == ["raw_dflash", "raw_dflash [loss=tv]",
                                                        "raw_dflash+dspark [markov_head_type=rnn]", "raw_dflash+dspark"]
    table = markdown_table(collect(tmp_path))
    assert "| raw_dflash [loss=tv] | [A, MASK x7] | 1.500 |" in table
    assert "| raw_dflash+dspark [markov_head_type=rnn] | DSpark [A, MASK x7] | 3.000 |" in table


def test_a_recipe_set_by_an_experiment_config_names_its_row(tmp_path):
    """A study row's recipe comes from its experiment config, not its overrides: the job's composed config
    (.hydra/config.yaml) names it, so the two DSpark recipes are two rows, not two seeds of one."""
    for i, (loss, source, temp) in enumerate([("ce", "target", 0.0), ("dspark", "target_kl", 1.0)]):
        job = tmp_path / str(i)
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text("- experiment=study_x\n- seed=0\n")
        (job / ".hydra" / "config.yaml").write_text(
            f"model:\n  loss: {loss}\n  label_source: {source}\n  label_temperature: 1.0\n"
            f"drafter:\n  markov_head_type: vanilla\ndata:\n  regen_temperature: {temp}\n")
        (job / "metrics.json").write_text(json.dumps({"method": "raw_dflash+dspark", "code": {"tau": 2.0}}))
    assert [r["method"] for r in collect(tmp_path)] == [
        "raw_dflash+dspark", "raw_dflash+dspark [loss=dspark, label_source=target_kl, regen_temperature=1.0]"]
