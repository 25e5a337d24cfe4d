"""A command that refuses touches no user file (issue 43). A run refused because its directory holds another run
leaves that run's records (Hydra's `.hydra/` copy, which `dmtp.report` and older resumes read) byte for byte as
they were; a run refused before its first step leaves nothing, not even the directories its command made; a
resume says where it continues; a bad data file or an option of another config choice is one line (exit status
2) before anything heavy."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from cli_runner import main_exit_code, run_command

RUN = ["debug=tiny_budget", "recipe=greedy", "logger=none", "callbacks=default", "~callbacks.lr_monitor",
       "callbacks.model_checkpoint.every_n_train_steps=1", "data.max_examples=40", "model.val_walk=false",
       "trainer.enable_progress_bar=false", "trainer.max_steps=1"]


def train_cli(args, run_dir, monkeypatch, capsys):
    """dmtp.train as a user runs it: Hydra's record of the run left to the command (no quiet option turns it off)."""
    return run_command("dmtp.train", args, run_dir, monkeypatch, capsys, records=True)


def files_of(folder: Path) -> dict:
    """Every path under `folder`: a file's bytes and modification time, a folder's None."""
    return {p.relative_to(folder): (p.read_bytes(), p.stat().st_mtime_ns) if p.is_file() else None
            for p in sorted(folder.rglob("*"))}


def test_a_refused_run_leaves_the_runs_records_as_they_were_and_a_resume_says_where_it_continues(
        tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "x"
    code, line, _ = train_cli(RUN, run_dir, monkeypatch, capsys)
    assert code == 0, line
    record = run_dir / ".hydra"
    assert OmegaConf.load(record / "config.yaml").model.loss == "ce"
    assert OmegaConf.to_container(OmegaConf.load(record / "overrides.yaml")) == RUN
    assert OmegaConf.load(record / "hydra.yaml").hydra.run.dir == str(run_dir)
    before = files_of(run_dir)
    # Pointed at the run's directory with another recipe: refused, and the run's files are untouched.
    code, line, _ = train_cli([*RUN, "model.loss=tv"], run_dir, monkeypatch, capsys)
    assert code == 2 and line.startswith(f"dmtp.train: error: {run_dir} already holds another training run"), line
    assert files_of(run_dir) == before
    # A resume that would change the run: refused, nothing written either (no .hydra/resumed-* record).
    code, line, _ = train_cli([f"resume={run_dir}", "seed=1"], run_dir, monkeypatch, capsys)
    assert code == 2 and "would change the run's seed (0 -> 1)" in line, line
    assert files_of(run_dir) == before
    # A resume that may run: one line naming the checkpoint, its step and what it changes; its own record beside
    # the run's first one, which stays.
    code, line, out = train_cli([f"resume={run_dir}", "trainer.max_steps=2"], run_dir, monkeypatch, capsys)
    assert code == 0, line
    said = [s for s in out.splitlines() if s.startswith("[dmtp] resume:")]
    assert said == [f"[dmtp] resume: continuing from {run_dir / 'checkpoints' / 'last.ckpt'} (step 1) with the run's "
                    "recorded config; changed now: trainer.max_steps 1 -> 2"]
    assert files_of(record)[Path("config.yaml")] == before[Path(".hydra/config.yaml")]
    resumed = [p for p in record.iterdir() if p.name.startswith("resumed-")]
    assert len(resumed) == 1 and OmegaConf.to_container(OmegaConf.load(resumed[0] / "overrides.yaml")) == [
        f"resume={run_dir}", "trainer.max_steps=2"]


def test_a_run_refused_before_its_first_step_leaves_nothing(tmp_path, monkeypatch, capsys):
    runs = tmp_path / "outputs" / "train" / "runs"   # as the default directory: nothing of it exists yet
    short = tmp_path / "short.jsonl"
    short.write_text('{"text": "def f(): pass"}\n')   # shorter than one training row
    refused = [
        # after the run claimed its directory and wrote its record: the drafter to continue is missing
        ([f"init_from={tmp_path / 'no_drafter'}"], "drafter directory not found"),
        # inside the fit, before the first step: the data gives no training row
        (["data=files", f"data.files=[{short}]"], "no training rows"),
        # before the job starts
        (["threads=0"], "threads must be auto or an integer >= 1"),
    ]
    for args, why in refused:
        code, line, _ = train_cli([*RUN, *args], runs / "r", monkeypatch, capsys)
        assert code == 2 and why in line, line
        assert not (tmp_path / "outputs").exists(), (args, sorted(map(str, (tmp_path / "outputs").rglob("*"))))
    # A directory of the user's given explicitly: kept, with only what was in it.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    code, line, _ = train_cli([*RUN, *refused[0][0]], mine, monkeypatch, capsys)
    assert code == 2 and files_of(mine) == {Path("notes.txt"): ((mine / "notes.txt").read_bytes(),
                                                                (mine / "notes.txt").stat().st_mtime_ns)}


def test_data_val_sets_files_are_read_before_the_target_loads(tmp_path, monkeypatch, capsys):
    import dmtp.training.job as job

    def heavy(cfg):
        raise AssertionError("the target was loaded before data.val_sets was checked")

    monkeypatch.setattr(job, "build_components", heavy)
    missing, bad = tmp_path / "missing.jsonl", tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1+1?", "answer": "2"}\n{"question": \n')
    for path, said in [(missing, f"{missing}: no such file or directory"),
                       (bad, f"{bad}: line 2 is not valid JSON")]:
        code, line, _ = train_cli([*RUN, f"data.val_sets={{gsm8k: {path}}}"], tmp_path / "run", monkeypatch, capsys)
        assert code == 2 and line.startswith(f"dmtp.train: error: data.val_sets.gsm8k: {said}"), line
        assert not (tmp_path / "run").exists()


def test_an_option_of_another_config_choice_is_one_line(tmp_path, monkeypatch, capsys):
    for option, line in [
        ("drafter.markov_head_type=foo", "drafter.markov_head_type is not an option of the drafter config in use; "
                                         "drafter=dspark has it: add drafter=dspark to the command"),
        ("trainer.strategy.shard_target=true", "trainer.strategy.shard_target is not an option of the trainer config "
                                               "in use; trainer=fsdp has it: add trainer=fsdp to the command"),
        ("model.anchors=3", "model.anchors is not an option (python -m dmtp.train --cfg job lists them)"),
    ]:
        code, said, _ = train_cli([*RUN, option], tmp_path / "run", monkeypatch, capsys)
        assert (code, said) == (2, f"dmtp.train: error: {line}")
        assert not (tmp_path / "run").exists()


def test_a_continued_run_names_its_checkpoint_its_step_and_what_differs_from_its_record():
    from dmtp.runs.recorded_config import resume_line

    ckpt = Path("r/checkpoints/step000006.ckpt")
    record = OmegaConf.create({"seed": 0, "model": {"loss": "ce"}, "trainer": {"max_steps": 6},
                               "paths": {"output_dir": "r"}, "ckpt_path": None})
    given = OmegaConf.create({"seed": 0, "model": {"loss": "tv"}, "trainer": {"max_steps": 6}, "threads": "auto",
                              "paths": {"output_dir": "elsewhere"}, "ckpt_path": str(ckpt)})   # paths: never a change
    head = f"[dmtp] resume: continuing from {ckpt} (step 6) with the config given (ckpt_path=)"
    assert resume_line(ckpt, 6, record, given, by_resume=False) == (
        f"{head}, which differs from the run's recorded config: model.loss 'ce' -> 'tv', threads (unset) -> 'auto'")
    assert resume_line(ckpt, 6, record, record, by_resume=False) == f"{head}, the same as the run's recorded config"
    assert resume_line(ckpt, 6, None, given, by_resume=False) == (
        f"{head}; the checkpoint records no config to compare it with")
    many = OmegaConf.create({**OmegaConf.to_container(record), "extra": {f"k{i}": i for i in range(10)}})
    assert resume_line(ckpt, 6, record, many, by_resume=True).endswith("extra.k7 (unset) -> 7 and 2 more")


def test_a_run_that_would_take_no_step_exports_nothing_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    """trainer.max_steps=0 exported an untrained drafter (and printed "checkpoints in" a folder that never existed);
    -1 failed with an OverflowError in the LR schedule, -5 with Lightning's traceback (issue 65)."""
    runs = tmp_path / "outputs" / "train" / "runs"
    for steps in (0, -1, -5):
        code, line, _ = train_cli([*RUN, f"trainer.max_steps={steps}"], runs / "r", monkeypatch, capsys)
        assert (code, line) == (2, "dmtp.train: error: trainer.max_steps must be an integer >= 1 (the run's length in "
                                   f"optimizer steps, over which its learning-rate schedule is laid out), got {steps}")
    # A run whose fit takes no step for another reason: refused after the fit, nothing exported, nothing left.
    code, line, _ = train_cli([*RUN, "+trainer.limit_train_batches=0"], runs / "r", monkeypatch, capsys)
    assert (code, line) == (2, "dmtp.train: error: the run took no training step (global step 0; check "
                               "trainer.limit_train_batches and trainer.max_epochs), so no drafter was exported")
    assert not (tmp_path / "outputs").exists()


def test_an_untrained_drafter_from_before_is_never_decoded(tmp_path, micro_target, micro_target_dir, monkeypatch,
                                                           capsys):
    """A step-0 drafter exported before the refusal above (its run's train_metrics.json says global_step 0): passed
    over as the newest drafter, refused in one line when named, before the target loads."""
    from cli_runner import infer_cli
    from dmtp.drafters.block_drafter import fresh_drafter_for

    drafter = tmp_path / "outputs" / "train" / "runs" / "r" / "drafter"
    fresh_drafter_for(micro_target, "dual_anchor_zero_init", 3).save(drafter, target=str(micro_target_dir))
    (drafter.parent / "train_metrics.json").write_text('{"global_step": 0}')
    monkeypatch.chdir(tmp_path)
    code, line, _ = infer_cli([f"target.path={micro_target_dir}"], tmp_path / "a", monkeypatch, capsys)
    assert (code, line) == (2, "dmtp.infer: error: no trained drafter found under ./outputs or ./logs; train one "
                               f"first: python -m dmtp.train target.path={micro_target_dir} (or pass drafter=<dir>)")
    code, line, _ = infer_cli([f"drafter={drafter}", "target.path=/no/such/target"], tmp_path / "b", monkeypatch,
                              capsys)
    assert (code, line) == (2, f"dmtp.infer: error: drafter {drafter} is untrained: the run that exported it took no "
                               f"training step ({drafter.parent / 'train_metrics.json'}: global_step 0); train it "
                               "(python -m dmtp.train) or pass another drafter=<dir>")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_run_that_stopped_before_its_first_checkpoint_says_how_to_start_again(tmp_path, monkeypatch, capsys):
    """resume= said "nothing to resume" and a rerun said "continue it with resume=": a dead end (issue 65)."""
    import lightning as L

    from dmtp.configs import compose_train
    from dmtp.training.job import train

    class Dies(L.Callback):   # after the first step, before any checkpoint (every 100 steps)
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step == 1:
                raise ValueError("stopped")

    run_dir = tmp_path / "run"
    args = [*RUN, "callbacks.model_checkpoint.every_n_train_steps=100", "trainer.max_steps=3"]
    with pytest.raises(ValueError, match="stopped"):
        train(compose_train(args, output_dir=run_dir), callbacks=[Dies()])
    assert (run_dir / ".dmtp-run").exists() and not (run_dir / "checkpoints").exists()
    again = (f"the run there stopped before its first checkpoint; to start it again remove {run_dir} and rerun its "
             "command, or rerun it with hydra.run.dir=<another dir>")
    code, line, _ = train_cli([f"resume={run_dir}"], tmp_path / "unused", monkeypatch, capsys)
    assert (code, line) == (2, f"dmtp.train: error: resume={run_dir}: no checkpoint under {run_dir / 'checkpoints'} "
                               f"(nothing to resume); {again}")
    code, line, _ = train_cli(args, run_dir, monkeypatch, capsys)
    assert (code, line) == (2, f"dmtp.train: error: {run_dir} already holds another training run (its .dmtp-run), "
                               f"which saved no checkpoint to resume: {again}")
    assert not (tmp_path / "unused").exists()


def test_refused_decoding_runs_and_every_prepare_run_leave_no_directory(tmp_path, micro_target_dir, monkeypatch,
                                                                        capsys):
    """dmtp.infer / dmtp.regime refused, and dmtp.prepare whatever its outcome, left outputs/<task>/<ts>/ behind (Hydra's
    record and an empty log file, or nothing at all): now the directory their command made is removed (issue 65)."""
    monkeypatch.chdir(tmp_path)

    def run(module, args):   # as a user runs it: the default run directory, Hydra's record and log file
        monkeypatch.setattr(sys, "argv", [module, *args])
        return main_exit_code(module, monkeypatch)

    micro = f"target.path={micro_target_dir}"
    assert run("dmtp.infer", [micro, "methods=[ar]", "batch_size=0"]) == 2
    assert run("dmtp.infer", [micro, "drafter=/no/such/drafter"]) == 2
    assert run("dmtp.regime", [micro, "num_prompts=0"]) == 2
    assert run("dmtp.prepare", ["step=nothing"]) == 2
    assert run("dmtp.prepare", [*RUN, "step=regen", "data.regen_sequences=4"]) == 0
    capsys.readouterr()
    assert not (tmp_path / "outputs").exists(), sorted(map(str, (tmp_path / "outputs").rglob("*")))


def test_a_resume_to_fewer_steps_than_its_checkpoint_is_one_line(tmp_path, monkeypatch, capsys):
    """It trained nothing and exported the checkpoint again, saying "continuing from ... (step 2)" (issue 65)."""
    run_dir = tmp_path / "run"
    code, line, _ = train_cli([*RUN, "trainer.max_steps=2"], run_dir, monkeypatch, capsys)
    assert code == 0, line
    code, line, _ = train_cli([f"resume={run_dir}", "trainer.max_steps=1"], tmp_path / "unused", monkeypatch, capsys)
    assert (code, line) == (2, "dmtp.train: error: trainer.max_steps=1 is below the step the checkpoint was saved at "
                               "(2): nothing would be trained; give trainer.max_steps > 2 to train on (= 2 exports it "
                               "again)")


def test_a_removed_run_directory_takes_its_unopened_log_file_with_it(tmp_path, monkeypatch):
    """A command run in-process (tests, a notebook) whose empty run directory was removed left Hydra's log file
    handler behind, opened on its first record: the next record anywhere in the process raised FileNotFoundError."""
    import logging

    from dmtp.runs import records

    run_dir = tmp_path / "outputs" / "prepare" / "runs" / "one"
    monkeypatch.setattr(records, "_MADE", {tmp_path / "outputs"})
    run_dir.mkdir(parents=True)
    handler = logging.FileHandler(run_dir / "prepare.log", delay=True)
    logging.getLogger().addHandler(handler)
    try:
        records.remove_if_made(run_dir)
        assert not (tmp_path / "outputs").exists() and handler not in logging.getLogger().handlers
        logging.getLogger("after").warning("a record after the run")   # raised FileNotFoundError before
    finally:
        logging.getLogger().removeHandler(handler)
