"""The thread policy of the toolkit's CPU work (target build, regeneration, training, decoding).

Why: the models here are small, so each operation is a short parallel region. With torch's default
(one thread per core) and OpenMP's default wait policy (idle threads spin), another process on a core
turns every region into a wait for a descheduled thread: on a 2-core machine with other short Python
processes beside it, the tiny target's build ran 0.13-0.25 steps/s at 2 threads against 2.2 steps/s at
1 thread under the same load (~5 steps/s at 2 threads idle; BENCHMARKS.md, "Thread policy"). The policy:

- OpenMP's wait policy is PASSIVE (idle threads sleep instead of spinning): the spinning is what
  collapses, not the second thread. OpenMP reads the policy once, when torch loads its runtime, so a
  command calls `claim_process()` in its `__main__` block, before anything imports torch (Hydra's
  composition does: a resolver imports the training code). An OMP_WAIT_POLICY the user set is kept.
- `threads=auto`: one thread per physical core this process may use (its CPU affinity), as torch's own
  default. Not fewer when the machine is loaded: a quick run of tools/bench/bench_threads.py on the busy
  2-core development machine (not published: nothing there is idle) had 2 PASSIVE threads at or
  above 1 thread both with and without a busy core, and 2 spinning threads 7-60x slower; and a count
  taken from the load would make a run's floating-point results (reductions split per thread) depend
  on what else ran when it started, so a resumed run could differ from the uninterrupted one. An
  OMP_NUM_THREADS the user set wins over auto; `threads=N` (or DMTP_THREADS=N) sets N.
- Called from Python (a test, a notebook) rather than as a command, `auto` leaves the caller's thread
  count alone: the process is the caller's.

tools/bench/bench_threads.py measures 1 vs 2 threads, with and without PASSIVE, idle and with one core busy;
the rule is to be confirmed against its figures on an idle machine (BENCHMARKS.md).
"""
from __future__ import annotations

import os
import sys

WAIT_POLICY = "PASSIVE"
_claim = {"owned": False, "torch_loaded_first": False}


def claim_process() -> None:
    """The command owns this process: `auto` may set its threads; OpenMP's wait policy is set (unless the
    user chose one) while torch is not loaded yet."""
    _claim["owned"] = True
    _claim["torch_loaded_first"] = "torch" in sys.modules
    os.environ.setdefault("OMP_WAIT_POLICY", WAIT_POLICY)


def parse_threads(setting) -> int | None:
    """`auto` (or None) -> None; a positive integer (or its string) -> itself; else one line."""
    if setting is None or setting == "auto":
        return None
    if isinstance(setting, str) and setting.strip().isdigit():
        setting = int(setting)
    if type(setting) is not int or setting < 1:
        raise ValueError(f"threads must be auto or an integer >= 1, got {setting!r}")
    return setting


def physical_cores() -> int:
    """Cores this process may run on, one per physical core (hyper-threads share one core's units)."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    cores = set()
    try:
        cpu = core = package = None
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "processor":
                    cpu = int(value)
                elif key == "physical id":
                    package = value.strip()
                elif key == "core id":
                    core = value.strip()
                    if cpu in allowed:
                        cores.add((package, core))
    except (OSError, ValueError):
        pass
    return max(1, min(len(allowed), len(cores) or len(allowed)))


def apply_threads(setting=None) -> str:
    """Set torch's intra-op thread count by the policy; -> the run header's line saying what was chosen."""
    import torch

    chosen = parse_threads(setting)
    if chosen is None and os.environ.get("DMTP_THREADS"):
        chosen = parse_threads(os.environ["DMTP_THREADS"])
    if chosen is not None:
        why = f"threads={chosen}"
    elif not _claim["owned"]:
        chosen, why = torch.get_num_threads(), "auto: the calling process's own setting, left as it is"
    elif os.environ.get("OMP_NUM_THREADS", "").strip().isdigit():
        chosen, why = int(os.environ["OMP_NUM_THREADS"]), "auto: OMP_NUM_THREADS"
    else:
        chosen = physical_cores()
        why = f"auto: {chosen} physical core(s)"
    torch.set_num_threads(chosen)
    return f"[dmtp] threads: {chosen} ({why}); OpenMP wait policy: {wait_policy()}"


def wait_policy() -> str:
    policy = os.environ.get("OMP_WAIT_POLICY", "the runtime's default (spinning)")
    if _claim["owned"] and _claim["torch_loaded_first"]:
        return f"{policy} (not applied: torch was loaded before the policy ran)"
    return policy
