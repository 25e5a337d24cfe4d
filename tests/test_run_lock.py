"""One writer per run directory (issue 65), with two real processes: while a run trains, every other `dmtp.train`
pointed at its directory (resume=, ckpt_path= one of its checkpoints, a fresh run into it) is refused in one line
naming the process that holds it, writes nothing there, and the run finishes as if alone; a run killed with SIGKILL
leaves a lock that does not block its resume."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cli_runner import run_command

ROOT = Path(__file__).resolve().parents[1]
RUN = ["debug=tiny_budget", "logger=none", "callbacks=default", "~callbacks.lr_monitor",
       "callbacks.model_checkpoint.every_n_train_steps=2", "data.max_examples=40", "model.val_walk=false",
       "trainer.enable_progress_bar=false"]


def _start(run_dir: Path, steps: int, log: Path) -> subprocess.Popen:
    """`python -m dmtp.train` in a process of its own (its output to `log`: a pipe nobody reads would stall it),
    caught at step 2 (tests/pause_at_step.py) once its step-2 checkpoint is written, until `_resume` lets it go."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]), "OMP_NUM_THREADS": "1"}
    pause = ["+callbacks.pause._target_=pause_at_step.PauseAtStep", "+callbacks.pause.step=2",
             f"+callbacks.pause.marker={run_dir.parent / 'paused'}", f"+callbacks.pause.go={run_dir.parent / 'go'}"]
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "dmtp.train", *RUN, *pause, f"trainer.max_steps={steps}",
                                 f"hydra.run.dir={run_dir}"], cwd=run_dir.parent, env=env, stdout=out,
                                stderr=subprocess.STDOUT)


def _paused(run_dir: Path, proc: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    """Wait until the run is caught at step 2: it holds its directory, writing nothing."""
    deadline = time.monotonic() + timeout
    while not (run_dir.parent / "paused").exists():
        assert proc.poll() is None, f"the run ended (status {proc.returncode}) before step 2: {log.read_text()[-2000:]}"
        assert time.monotonic() < deadline, f"the run reached no step 2 in {timeout} s"
        time.sleep(0.1)
    assert (run_dir / "checkpoints" / "step000002.ckpt").is_file()


def _resume(run_dir: Path) -> None:
    (run_dir.parent / "go").write_text("")


def _files_of(folder: Path) -> dict:
    return {p.relative_to(folder): (p.read_bytes(), p.stat().st_mtime_ns) if p.is_file() else None
            for p in sorted(folder.rglob("*"))}


def _step_of(ckpt: Path) -> int:
    return torch.load(ckpt, weights_only=True)["global_step"]


def test_a_run_directory_in_use_is_refused_to_every_other_writer_and_the_run_finishes(tmp_path, monkeypatch,
                                                                                      capsys):
    run_dir, log = tmp_path / "run", tmp_path / "first.log"
    run_dir.mkdir()
    first = _start(run_dir, steps=6, log=log)
    try:
        checkpoint = run_dir / "checkpoints" / "step000002.ckpt"
        _paused(run_dir, first, log)
        before = _files_of(run_dir)
        held = (f"dmtp.train: error: {run_dir} is in use by another dmtp.train run (pid {first.pid}, which holds "
                f"{run_dir / '.dmtp-lock'}): let it finish, or stop it (kill {first.pid}) and continue it with "
                f"resume={run_dir}")
        for entry in ([f"resume={run_dir}"], [f"ckpt_path={checkpoint}"], [*RUN, "trainer.max_steps=6"]):
            code, line, _ = run_command("dmtp.train", entry, run_dir, monkeypatch, capsys)
            assert (code, line) == (2, held), entry
            assert _files_of(run_dir) == before, entry
    finally:
        _resume(run_dir)
    assert first.wait(timeout=300) == 0, log.read_text()[-3000:]
    assert _step_of(run_dir / "checkpoints" / "last.ckpt") == 6
    assert (run_dir / "drafter" / "model.safetensors").is_file() and (run_dir / "metrics.json").is_file()
    assert not (run_dir / ".dmtp-lock").exists()   # let go at its end


def test_a_lock_left_by_a_killed_run_does_not_block_its_resume(tmp_path, monkeypatch, capsys):
    run_dir, log = tmp_path / "run", tmp_path / "killed.log"
    run_dir.mkdir()
    killed = _start(run_dir, steps=1000, log=log)
    _paused(run_dir, killed, log)
    killed.kill()
    killed.wait(timeout=60)
    _resume(run_dir)   # the resumed run carries the pause of the run it continues: let it pass
    host = (run_dir / ".dmtp-lock").read_text().split()[1]
    assert (run_dir / ".dmtp-lock").read_text().split()[0] == str(killed.pid)   # left behind, its lock gone with it
    code, line, out = run_command("dmtp.train", [f"resume={run_dir}", "trainer.max_steps=4"], run_dir, monkeypatch,
                                  capsys)
    assert code == 0, line
    assert (f"[dmtp] {run_dir}: the run that held it (pid {killed.pid} on {host}) ended without letting go "
            "(killed?); taking it over") in out
    assert _step_of(run_dir / "checkpoints" / "last.ckpt") == 4 and not (run_dir / ".dmtp-lock").exists()


def test_the_lock_refuses_a_second_holder_lets_go_whole_and_names_a_killed_one(tmp_path, capsys):
    from dmtp.runs.lock import LOCK_NAME, RunDirLock

    first, second = RunDirLock(), RunDirLock()
    first.take(tmp_path)
    assert first.created and (tmp_path / LOCK_NAME).read_text().split()[0] == str(os.getpid())
    with pytest.raises(ValueError, match=rf"^{tmp_path} is in use by another dmtp.train run \(pid {os.getpid()}, "):
        second.take(tmp_path)
    first.release()
    first.release()   # twice: nothing more
    assert not (tmp_path / LOCK_NAME).exists()
    (tmp_path / LOCK_NAME).write_text("4242 elsewhere")   # what a killed holder leaves
    second.take(tmp_path)
    assert not second.created and "the run that held it (pid 4242 on elsewhere) ended without letting go" in \
        capsys.readouterr().out
    second.release()
    assert not (tmp_path / LOCK_NAME).exists()
