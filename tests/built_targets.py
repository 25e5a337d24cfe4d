"""The embedded test targets, each built at a thread count fixed per preset (not the machine's or the test's).

A build's weights depend on how its sums are split over threads, so a count taken from the machine or from
DMTP_TEST_THREADS would train another target there, and every figure a test reads from it would move.
micro_hybrid builds on one thread: the delta rule's many small ops made a second one 3-6x slower on a loaded
2-core machine."""
from __future__ import annotations

import torch

from dmtp.tiny.targets import ensure_tiny_target

BUILD_THREADS = {"micro": 2, "micro_vllm": 2, "micro_hybrid": 1, "micro_assistant": 2}


def built_target(preset: str):
    """The cached target of `preset`, built (once, under $DMTP_HOME) at its own thread count."""
    before = torch.get_num_threads()
    torch.set_num_threads(BUILD_THREADS[preset])
    try:
        return ensure_tiny_target(preset, progress=False)
    finally:
        torch.set_num_threads(before)
