"""The exact generic runner (the tests' oracle): any transformers causal LM, re-run over the whole
history at every call.

Slow (O(context) per round), no graphs; conventions are `TargetRunner`'s."""
from __future__ import annotations

import torch

from dmtp.decode.runners.base import TargetRunner, gather_rows
from dmtp.models.target import TargetModel, TargetOutput


class RecomputeTargetRunner(TargetRunner):
    """Any transformers causal LM. Keeps token history [B, Lmax] on the device; every call re-runs the
    model over the history up to the furthest written position (right padding is harmless: a causal
    model never lets a position see later ones).

    Not graph-safe (one host sync per call)."""

    kind = "recompute"

    @staticmethod
    def why_unsupported(target: TargetModel) -> str | None:
        return None   # whatever `TargetModel` loads, it runs

    def allocate(self, batch_size: int, max_len: int) -> None:
        self.batch_size, self.max_len = batch_size, max_len
        self.history = torch.zeros(batch_size, max_len, dtype=torch.long, device=self.device)
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=self.device)

    def scratch_state(self) -> list:
        return [self.history]   # verify writes the tokens at positions lengths..lengths+S-1

    def _run(self, upto: int) -> TargetOutput:
        return self.target(self.history[:, :upto], layer_ids=self.layer_ids)

    def prefill(self, ids, lengths, last_logits_only: bool = False) -> TargetOutput:
        b, t = ids.shape
        self.history.zero_()
        self.history[:, :t] = ids
        self.lengths.copy_(lengths.to(self.device))
        out = self._run(t)
        if last_logits_only:
            out = TargetOutput(gather_rows(out.logits, self.lengths - 1), out.layer_hidden, out.last_hidden)
        return out

    def verify(self, tokens, positions=None) -> TargetOutput:
        if positions is None:
            positions = self.verify_positions(tokens)
        self.history.scatter_(1, positions, tokens)
        out = self._run(int(positions.max()) + 1)

        def pick(x):
            return x.gather(1, positions[..., None].expand(-1, -1, x.shape[-1]))

        return TargetOutput(pick(out.logits), pick(out.layer_hidden), pick(out.last_hidden))


__all__ = ["RecomputeTargetRunner"]
