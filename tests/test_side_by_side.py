"""The quick start's closing table: the default drafter beside raw DFlash and the MTP chains, on the same prompts."""
import json

import numpy as np

from hydra import compose, initialize_config_dir

from dmtp.configs import CONF_DIR, compose_config, compose_train
from dmtp.reports.side_by_side import side_by_side_of, side_by_side_table


def _stats(taus):
    return {"tau": float(np.mean(taus)), "tau_requests": list(taus), "t1_accept": 0.8, "p_len_ge": [0.8]}


def _record(method, drafter, baselines=True):
    per = {"drafter": _stats(drafter)}
    if baselines:
        per.update({"mtp415": _stats([3.0] * 16), "mtp:7": _stats([3.4] * 16)})
    modes = {"greedy": {"code": per, "code_tasks": per}}
    return {"method": method, "eval": {"modes": modes, "protocol": {"held_out": ["code_tasks"], "target": "t",
                                                                    "max_new_tokens": 8, "batch_size": 2}}}


def test_the_first_drafter_is_compared_with_every_other_and_the_chains():
    rng = np.random.default_rng(0)
    dmtp = _record("dual_anchor_zero_init", rng.normal(4.0, 0.1, 16))
    raw = _record("raw_dflash", rng.normal(3.0, 0.1, 16), baselines=False)
    table = side_by_side_table({"DMTP": dmtp, "raw DFlash": raw})
    header = next(line for line in table.splitlines() if line.startswith("workload"))
    assert header.split()[:5] == ["workload", "DMTP", "raw", "DFlash", "mtp415"]   # the baselines come from DMTP's job
    assert "DMTP vs raw DFlash" in header and "DMTP vs mtp:7" in header
    code = next(line for line in table.splitlines() if line.startswith("code "))
    assert "+3" in code and "wins" in code                          # +33% over raw DFlash, intervals apart
    assert any(line.startswith("code_tasks (held out)") for line in table.splitlines())
    assert side_by_side_table({"x": {"method": "x"}}) is None


def test_jobs_are_read_from_their_metrics_files(tmp_path):
    for i, (method, taus) in enumerate([("dual_anchor_zero_init", [4.0] * 16), ("raw_dflash", [3.0] * 16)]):
        (tmp_path / f"{i}_injection={method}").mkdir()
        (tmp_path / f"{i}_injection={method}" / "metrics.json").write_text(json.dumps(_record(method, taus)))
    table = side_by_side_of(sorted(tmp_path.iterdir()), {"dual_anchor_zero_init": "DMTP", "raw_dflash": "raw DFlash"})
    assert "DMTP vs raw DFlash" in table and "+33.3%" in table


def test_the_quickstart_sweep_trains_the_default_and_raw_dflash_alike():
    raw = compose_config("train", ["+sweep=quickstart"])
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        full = compose(config_name="train", overrides=["+sweep=quickstart"], return_hydra_config=True)
    assert full.hydra.sweeper.params.injection.split(",") == ["dual_anchor_zero_init", "raw_dflash"]
    default = compose_train(tiny=False)
    for group in ("model", "data", "drafter", "trainer", "decode_eval", "target", "injection"):
        assert raw[group] == default[group], group   # job 0 is the default run; job 1 swaps the variant only


def test_the_quick_start_run_names_the_command_that_adds_raw_dflash(tmp_path, monkeypatch, capsys):
    """`python -m dmtp.train` with no argument (the quick start) ends with the sweep that puts raw DFlash beside it;
    a run with any override does not (the job itself stands in: its table is the protocol's, tested elsewhere)."""
    from cli_runner import run_command

    import dmtp.training.job as job

    monkeypatch.setattr(job, "train", lambda cfg, **kwargs: {})
    tip = "[dmtp] the same beside raw DFlash trained alike, one table: python -m dmtp.train -m +sweep=quickstart"
    code, _, out = run_command("dmtp.train", [], tmp_path / "run", monkeypatch, capsys)
    assert code == 0 and out.strip().splitlines()[-1] == tip
    code, _, out = run_command("dmtp.train", ["seed=1"], tmp_path / "other", monkeypatch, capsys)
    assert code == 0 and tip not in out
