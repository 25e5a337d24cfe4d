"""A full disk is an environment fault: wherever the write fails (Hydra's copy of the config, a file the job
writes, the safetensors export), the command ends with one line saying so and exit status 1 (issue 24, 5)."""
from __future__ import annotations

import errno
import os
import sys

import pytest
from hydra.core.global_hydra import GlobalHydra
from safetensors import SafetensorError

from cli_runner import HYDRA_QUIET, run_command
from dmtp.errors import environment_fault

NO_SPACE = os.strerror(errno.ENOSPC)
RERUN = "free space or fix the filesystem and rerun"
# What safetensors' writer raises on a full disk (its Rust error, quoting the OS; no errno, no path).
SAFETENSORS_FULL = f'Error while serializing: IoError(Os {{ code: 28, kind: StorageFull, message: "{NO_SPACE}" }})'


def _disk_full(path=None):
    return OSError(errno.ENOSPC, NO_SPACE, *([str(path)] if path else []))


def test_hydras_own_config_write_is_one_line(tmp_path, micro_target_dir, monkeypatch, capsys):
    import hydra.core.utils

    def save_config(cfg, filename, output_dir):
        raise _disk_full(output_dir / filename)

    monkeypatch.setattr(hydra.core.utils, "_save_config", save_config)
    run_dir = tmp_path / "run"
    # As run_command, but Hydra writes its .hydra/ copy of the config (the quiet options turn it off).
    monkeypatch.setattr(sys, "argv", ["dmtp.infer", f"target.path={micro_target_dir}", "methods=[ar]",
                                      f"hydra.run.dir={run_dir}", *HYDRA_QUIET[:2]])
    monkeypatch.setenv("HYDRA_MAIN_MODULE", "__main__")
    from dmtp.infer import main

    with pytest.raises(SystemExit) as exit_:
        try:
            main()
        finally:
            GlobalHydra.instance().clear()
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 1 and err == [
        f"dmtp.infer: error: disk full writing {run_dir / '.hydra' / 'config.yaml'} ({NO_SPACE}); {RERUN}"]


def test_a_write_in_the_job_is_one_line(tmp_path, micro_target_dir, monkeypatch, capsys):
    import dmtp.atomic_io

    def dumps(*args, **kwargs):   # metrics.json is written after decoding: its write fails as on a full disk
        raise _disk_full()

    monkeypatch.setattr(dmtp.atomic_io.json, "dumps", dumps)
    code, line, _ = run_command("dmtp.infer", [f"target.path={micro_target_dir}", "methods=[ar]", "num_prompts=1",
                                               "eval.domains=[code]", "max_new_tokens=2", "eval.prompt_tokens=8",
                                               "progress=false", "warmup=false"], tmp_path / "run", monkeypatch,
                                capsys)
    assert (code, line) == (1, f"dmtp.infer: error: disk full ({NO_SPACE}); {RERUN}")


def test_the_safetensors_writers_fault_is_recognised():
    """safetensors raises its own error on a full disk, quoting the OS's text without an errno (the drafter
    export and the regeneration cache write with it); the command layer's handler above reads it."""
    assert environment_fault(SafetensorError(SAFETENSORS_FULL)) == (
        f"disk full while writing (SafetensorError: {SAFETENSORS_FULL}); {RERUN}")


@pytest.mark.parametrize("err,expected", [
    (_disk_full("/x/last.ckpt"), f"disk full writing /x/last.ckpt ({NO_SPACE}); {RERUN}"),
    (OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)), f"disk quota exceeded ({os.strerror(errno.EDQUOT)}); {RERUN}"),
    (OSError(errno.EROFS, os.strerror(errno.EROFS), "/ro/a"),
     f"read-only file system writing /ro/a ({os.strerror(errno.EROFS)}); {RERUN}"),
    (OSError(errno.ENOENT, "No such file or directory", "/x"), None),
    (ValueError("bad value"), None),
])
def test_which_errors_are_environment_faults(err, expected):
    assert environment_fault(err) == expected


def test_a_wrapped_fault_is_found_in_the_chain():
    try:
        try:
            raise _disk_full("/x/a")
        except OSError as inner:
            raise RuntimeError("saving the checkpoint failed") from inner
    except RuntimeError as outer:
        assert environment_fault(outer) == f"disk full writing /x/a ({NO_SPACE}); {RERUN}"


def test_dmtps_own_write_failure_is_worded_as_any_environment_fault(tmp_path, monkeypatch):
    """One wording for "environment fault, exit 1": a write of dmtp.atomic_io that the disk refuses says what
    a library's OSError says (dmtp.errors.fault_line), plus the file it kept, and is found through a chain."""
    import dmtp.atomic_io
    from dmtp.errors import WriteFailed

    target = tmp_path / "metrics.json"
    monkeypatch.setattr(dmtp.atomic_io.os, "fsync", lambda fd: (_ for _ in ()).throw(_disk_full()))
    with pytest.raises(WriteFailed) as failed:
        dmtp.atomic_io.write_json(target, {})
    line = f"disk full writing {target} ({NO_SPACE}); the previous metrics.json, if any, is left as it was; {RERUN}"
    assert str(failed.value) == line and environment_fault(failed.value) == line
    try:
        raise RuntimeError("saving failed") from failed.value
    except RuntimeError as outer:
        assert environment_fault(outer) == line
    assert not target.exists()


def test_a_hydra_without_the_reporter_hook_still_runs_the_command(monkeypatch):
    """The one-line wrap of Hydra's own writes rides on a private hook; a Hydra without it must still run the
    command (the job's faults stay one line through the command's own handler), not fail on an AttributeError."""
    import hydra._internal.utils as hydra_utils

    from dmtp.cli import hydra_faults_one_line

    monkeypatch.delattr(hydra_utils, "run_and_report")
    ran = []
    with hydra_faults_one_line("dmtp.train"):
        ran.append(True)
    assert ran == [True] and not hasattr(hydra_utils, "run_and_report")
