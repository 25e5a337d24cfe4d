"""`python -m dmtp.infer`: config composition, drafter discovery, metrics.json and the no-drafter message."""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from dmtp.drafters.block_drafter import fresh_drafter_for
from dmtp.inference.compare import compare_methods as run
from dmtp.inference.drafter_choice import NO_DRAFTER_MESSAGE, find_latest_drafter
from dmtp.models.provenance import weights_digest

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def _save_drafter(target, path, name="dual_anchor_zero_init"):
    fresh_drafter_for(target, name, 3).save(path)
    return path


def _compose(overrides):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose("infer", overrides=overrides)


def test_default_config_composes():
    cfg = _compose(["output_dir=/tmp/x"])
    assert cfg.target.path is None and cfg.target.preset == "assistant"
    assert list(cfg.methods) == ["ar", "mtp415", "drafter"]
    assert cfg.drafter.path is None and cfg.temperature == 0.0 and cfg.cuda_graphs is True
    assert cfg.eval.name == "embedded" and list(cfg.eval.domains) == ["code", "prose", "math", "code_tasks", "prose_tasks"]
    # The evaluation protocol's defaults: enough to rank methods 5-15% apart.
    assert cfg.num_prompts >= 32 and cfg.max_new_tokens >= 128


def test_find_latest_drafter(tmp_path, micro_target):
    assert find_latest_drafter(base=tmp_path) is None
    old = _save_drafter(micro_target, tmp_path / "outputs" / "train" / "runs" / "a" / "drafter")
    time.sleep(0.05)
    new = _save_drafter(micro_target, tmp_path / "logs" / "b" / "drafter")
    os.utime(old / "config.json", (time.time() - 100, time.time() - 100))
    assert find_latest_drafter(base=tmp_path) == new


def test_infer_run_writes_metrics(tmp_path, micro_target_dir, micro_target, capsys):
    drafter = _save_drafter(micro_target, tmp_path / "drafter")
    out = tmp_path / "run"
    cfg = _compose([f"target.path={micro_target_dir}", f"drafter.path={drafter}", f"output_dir={out}", "num_prompts=2",
                    "max_new_tokens=12", "batch_size=2", "eval.prompt_tokens=16", "progress=false"])
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run(cfg)
    finally:
        torch.set_num_threads(before)
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["overall"]) == {"ar", "mtp415", "dual_anchor_zero_init"}
    assert set(metrics["workloads"]) == {"code", "prose", "math", "code_tasks", "prose_tasks"}
    for name, s in metrics["overall"].items():
        assert s["matches_ar"] == 1.0  # greedy: every method reproduces the target's own output
        for key in ("tau_per_request", "tau_per_verify", "accept_hist", "t1_accept", "p_len_ge", "p_cond",
                    "tokens_per_s", "ttft_ms", "stage_ms_per_round", "per_request"):
            assert key in s
        assert len(s["per_request"]) == 10   # 2 prompts x 5 workloads
    assert metrics["overall"]["dual_anchor_zero_init"]["stage_ms_per_round"].keys() >= {"t1_fusion", "drafter",
                                                                                        "verify", "mtp", "round"}
    assert len(metrics["overall"]["mtp415"]["p_len_ge"]) == 4
    printed = capsys.readouterr().out
    assert "95% CI" in printed and "per-stage ms per round" in printed
    assert f"weights {weights_digest(micro_target_dir)}" in printed and metrics["run"]["target_digest"]
    # each drafter against the strongest baseline, with the paired change and the verdict its intervals allow
    assert re.search(r"code: dual_anchor_zero_init (beats|loses to|within noise of) mtp415: [+-][0-9.]+% tau", printed)


def test_no_drafter_message(tmp_path):
    """Bad input (exit status 2, one line) naming the default training command (issue 65)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-m", "dmtp.infer"], cwd=tmp_path, capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == f"dmtp.infer: error: {NO_DRAFTER_MESSAGE}"
    assert "train one first: python -m dmtp.train (or pass drafter=<dir>)" in NO_DRAFTER_MESSAGE
    assert not (tmp_path / "outputs").exists()   # a refused run leaves nothing


def test_drafter_shorthand():
    from dmtp.cli import drafter_path_shorthand as cli_shorthands

    assert cli_shorthands(["drafter=/a/b", "batch_size=2", "drafter.injection=x"]) == [
        "drafter.path=/a/b", "batch_size=2", "drafter.injection=x"]
    cfg = _compose(cli_shorthands(["drafter=/a/b", "output_dir=/tmp/x"]))
    assert cfg.drafter.path == "/a/b"


def test_infer_mtbench_second_turn_uses_own_answer(tmp_path, micro_target_dir):
    qs = tmp_path / "question.jsonl"
    qs.write_text("\n".join(json.dumps({"question_id": i, "category": "writing",
                                        "turns": [f"Write about topic {i}.", "Now make it shorter."]})
                            for i in range(2)) + "\n")
    out = tmp_path / "run"
    cfg = _compose([f"target.path={micro_target_dir}", "methods=[ar,mtp415]", "eval.name=mtbench",
                    f"eval.path={qs}", f"output_dir={out}", "max_new_tokens=8", "batch_size=2", "progress=false",
                    "warmup=false"])
    run(cfg)
    metrics = json.loads((out / "metrics.json").read_text())
    assert list(metrics["workloads"]) == ["mtbench", "mtbench_turn2"]
    assert metrics["run"]["num_prompts"] == {"mtbench": 2, "mtbench_turn2": 2}
    assert metrics["overall"]["mtp415"]["matches_ar"] == 1.0
    assert len(metrics["overall"]["ar"]["per_request"]) == 4
