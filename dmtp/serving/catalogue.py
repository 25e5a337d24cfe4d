"""The one list of engines: `engine=<name>` (dmtp.infer), `data.regen_engine=<name>` (training) and the
benches look an engine up here by name.

A new engine is a file in this package and one entry below."""
from __future__ import annotations

from dmtp.serving import dmtp_loop
from dmtp.serving.vllm import adapter as vllm
from dmtp.serving.base import Engine

ENGINES: tuple[Engine, ...] = (dmtp_loop.ENGINE, vllm.ENGINE)


def engine_names(regenerates: bool = False) -> tuple[str, ...]:
    """Every engine's name (`regenerates`: those with a regeneration writer)."""
    return tuple(e.name for e in ENGINES if e.writer is not None or not regenerates)


def engine_named(name: str, what: str = "engine", regenerates: bool = False) -> Engine:
    """The engine called `name`, else one line naming the choices (`what`: how the option is called)."""
    for e in ENGINES:
        if e.name == name and (e.writer is not None or not regenerates):
            return e
    raise ValueError(f"{what} must be one of {', '.join(engine_names(regenerates))}, got {name!r}")


__all__ = ["ENGINES", "engine_names", "engine_named"]
