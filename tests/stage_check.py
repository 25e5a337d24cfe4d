"""Which tensors a stage changed without declaring them (`Stage.writes` / `Stage.scratch`).

A check for tests and for whoever adds a stage or a buffer: run the stage once on a live decoding state
and compare every tensor reachable from the given roots (the loop state, the target runner, the
proposer: their attributes, containers, caches and modules, recursively) before and after. A changed
tensor that shares no storage with a declared one would escape the capture snapshot
(`dmtp.decode.stage.snapshot`), and a warm-up would leave it changed.
"""
from __future__ import annotations

import torch
from torch import nn

from dmtp.decode.proposers import Proposer
from dmtp.decode.stage import Stage


def reachable_tensors(**roots) -> dict[str, torch.Tensor]:
    """path -> tensor, for every tensor reachable from the named roots through attributes of dmtp
    objects and torch modules, dict values and list/tuple items (each object visited once)."""
    found: dict[str, torch.Tensor] = {}
    visited: set[int] = set()
    stack = list(roots.items())
    while stack:
        path, obj = stack.pop()
        if id(obj) in visited:
            continue
        visited.add(id(obj))
        if isinstance(obj, torch.Tensor):
            found[path] = obj
        elif isinstance(obj, dict):
            stack += [(f"{path}[{k!r}]", v) for k, v in obj.items()]
        elif isinstance(obj, (list, tuple)):
            stack += [(f"{path}[{i}]", v) for i, v in enumerate(obj)]
        elif isinstance(obj, (nn.Module, Proposer)) or type(obj).__module__.startswith("dmtp."):   # test proposers too
            stack += [(f"{path}.{k}", v) for k, v in vars(obj).items()]
    return found


def undeclared_writes(stage: Stage, **roots) -> list[str]:
    """Run `stage` once; -> the paths of the reachable tensors it changed that it does not declare."""
    tensors = reachable_tensors(**roots)
    before = {path: t.clone() for path, t in tensors.items()}
    stage.run()
    declared = {t.untyped_storage().data_ptr() for t in (*stage.writes, *stage.scratch_tensors()) if t.numel()}
    return sorted(path for path, t in tensors.items()
                  if t.numel() and not torch.equal(t, before[path])
                  and t.untyped_storage().data_ptr() not in declared)


__all__ = ["reachable_tensors", "undeclared_writes"]
