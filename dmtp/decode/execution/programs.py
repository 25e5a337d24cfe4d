"""The replayed programs of a decoder's rounds: CUDA graphs on a GPU, one torch.compile program on a CPU,
one per (batch bucket, cache length, sampling mode, attended span, verify length), made on first use from
the round's stages and replayed after.

The eager round is what each program must equal."""
from __future__ import annotations

from collections.abc import Callable

from dmtp.decode.stage import Stage, restore, snapshot


def state_reset(stages: list[Stage], generator) -> Callable[[], None]:
    """Puts back what `stages` declare they write and the run's generator: rounds run for a capture, a
    compile warm-up or a cost measurement are not decoding (their scratch rows lie past the committed lengths)."""
    saved = snapshot(stages)
    gen_state = generator.get_state() if generator is not None else None

    def reset():
        restore(saved)
        if generator is not None:
            generator.set_state(gen_state)

    return reset


class RoundPrograms:
    """The program cache. `use_graphs`: capture CUDA graphs (`graph_granularity`: one graph per stage or per
    round); else compile with `compile_backend`. `compile_s` sums the seconds spent compiling (reported apart)."""

    def __init__(self, use_graphs: bool, graph_granularity: str = "stage", compile_backend: str = "inductor"):
        self.use_graphs = use_graphs
        self.graph_granularity = graph_granularity
        self.compile_backend = compile_backend
        self.programs: dict = {}
        self.compile_s = 0.0

    def get(self, key, stages: Callable[[], list[Stage]], generator):
        """The program of `key`, made from `stages()` on first use."""
        program = self.programs.get(key)
        if program is None:
            program = self.programs[key] = self.make(stages(), generator)
        return program

    def make(self, stages: list[Stage], generator):
        """CUDA graphs or compiled stages of the round.

        The stages run during the capture / compile warm-up mutate the state and draw from the run's seeded
        generator: both are put back."""
        reset = state_reset(stages, generator)
        if self.use_graphs:
            from dmtp.decode.execution.graphs import RoundGraphs

            return RoundGraphs(stages, granularity=self.graph_granularity).capture(reset=reset)
        from dmtp.decode.execution.compiled import CompiledRound

        # One program for the whole round, never one per stage: with stages compiled one by one, inductor
        # lost acceptance across the stage boundaries (the drafts degraded, the tokens stayed exact), a
        # miscompilation we measured and did not isolate (tests/test_decode_compiled.py checks both).
        program = CompiledRound(stages, granularity="round", backend=self.compile_backend)
        program.warm_up(reset=reset)
        self.compile_s += program.compile_s
        return program
