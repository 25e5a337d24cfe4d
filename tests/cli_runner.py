"""Run a dmtp command's real `main` in the test process, as `python -m <module> <args>` would: the exit
status and the printed line are what a user meets, without a Python start-up per case."""
from __future__ import annotations

import importlib
import logging
import sys
from contextlib import contextmanager
from pathlib import Path

import torch
from hydra.core.global_hydra import GlobalHydra

from dmtp import threads

HYDRA_QUIET = ["hydra/job_logging=none", "hydra/hydra_logging=none", "hydra.output_subdir=null"]


def run_command(module: str, args: list[str], run_dir: Path, monkeypatch, capsys,
                records: bool = False) -> tuple[int, str, str]:
    """`python -m <module> <args>`, in this process: (exit status, last stderr line, stdout). `records`: Hydra's
    record of the run (`.hydra/`) is left to the command's configuration, as a user's run has it."""
    quiet = [o for o in HYDRA_QUIET if not (records and o.startswith("hydra.output_subdir"))]
    monkeypatch.setattr(sys, "argv", [module, *args, f"hydra.run.dir={run_dir}", *quiet])
    capsys.readouterr()
    code = main_exit_code(module, monkeypatch)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    return code, lines[-1] if lines else "", out


def main_exit_code(module: str, monkeypatch) -> int:
    """Run `module`'s main with the `sys.argv` already set: its exit status. The process goes back as it was."""
    with _process_restored(monkeypatch):
        try:
            importlib.import_module(module).main()
            return 0
        except SystemExit as e:
            return e.code


@contextmanager
def _process_restored(monkeypatch):
    """A command claims the process it runs in (dmtp.threads), sets torch's threads and has Hydra configure logging:
    all go back after it, so the tests after it see the process as they left it."""
    for key, value in threads._claim.items():
        monkeypatch.setitem(threads._claim, key, value)
    torch_threads = torch.get_num_threads()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    # As under `python -m`: Hydra finds conf/ relative to the command's file, not its package.
    monkeypatch.setenv("HYDRA_MAIN_MODULE", "__main__")
    try:
        yield
    finally:
        GlobalHydra.instance().clear()
        torch.set_num_threads(torch_threads)
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
                handler.close()
        root.setLevel(level)


def infer_cli(args, run_dir, monkeypatch, capsys) -> tuple[int, str, str]:
    """`python -m dmtp.infer <args>` without progress bars or warm-up."""
    return run_command("dmtp.infer", ["progress=false", "warmup=false", *args], run_dir, monkeypatch, capsys)
