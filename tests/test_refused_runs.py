"""A command that refuses touches no user file (issue 43). A run refused because its directory holds another run
leaves that run's records (Hydra's `.hydra/` copy, which `dmtp.report` and older resumes read) byte for byte as
they were; a run refused before its first step leaves nothing, not even the directories its command made; a
resume says where it continues; a bad data file or an option of another config choice is one line (exit status
2) before anything heavy."""
from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from cli_runner import run_command

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
