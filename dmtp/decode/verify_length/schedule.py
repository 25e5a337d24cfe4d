"""Which verify length each round of a batch uses: the run's fixed length, or verify_length=auto's choice,
read again from the rounds' record at the loop's `done` polls (each read is a host round trip, so at most
every `readout_rounds` rounds)."""
from __future__ import annotations

from collections.abc import Callable

from dmtp.decode.verify_length.policy import VerifyLengthPolicy


class LengthSchedule:
    """`length`: this round's L. `fixed`: the run's L (the policy None), else `policy` chooses it."""

    def __init__(self, fixed: int | None, policy: VerifyLengthPolicy | None, clock: Callable[[], float],
                 readout_rounds: int = 4):
        self.policy, self.clock, self.readout_rounds = policy, clock, readout_rounds
        self.length = fixed if policy is None else policy.choose()
        self.mark, self.rounds = clock(), 0
        self.history: list[int] = []   # the L of every round so far

    def ran_round(self) -> None:
        self.rounds += 1
        self.history.append(self.length)

    def at_poll(self, st, finished: bool) -> None:
        """After a `done` poll (which synced): tell the policy what the rounds since the last read did, choose again."""
        if self.policy is None or not (self.rounds >= self.readout_rounds or finished):
            return
        now = self.clock()
        remaining = (st.max_new - st.out_len).clamp(min=0) * ~st.done
        self.policy.observe(st.length_stats.read(remaining), self.rounds, now - self.mark, self.length)
        self.mark, self.rounds = now, 0
        self.length = self.policy.choose()
