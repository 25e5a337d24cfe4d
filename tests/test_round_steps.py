"""The loop's commit step on its own, against the reference round's rule (dmtp.decode.reference): a request
emits its accepted prefix and the target's token after it, cut after the first EOS and at its budget; one that
emitted EOS or filled its budget is done, and a finished request emits nothing more."""
from __future__ import annotations

import random
from types import SimpleNamespace

import torch

from dmtp.decode.loop import SpecDecoder


def reference_commit(target_tokens: list[int], accepted: int, eos: set[int], room: int) -> list[int]:
    new = target_tokens[:accepted + 1]            # the accepted candidates and the target's token after them
    for i, token in enumerate(new):               # stop at EOS and at the budget
        if token in eos:
            new = new[:i + 1]
            break
    return new[:room]


def test_commit_cuts_like_the_reference_round():
    rng = random.Random(0)
    batch, k, vocab, eos = 64, 6, 9, [7, 8]
    max_new = 10
    out_len = torch.tensor([rng.randint(1, max_new - 1) for _ in range(batch)])
    done = torch.tensor([rng.random() < 0.2 for _ in range(batch)])
    st = SimpleNamespace(offsets=torch.arange(k + 1), eos=torch.tensor(eos), max_new=torch.tensor(max_new),
                         out_len=out_len.clone(), out_tokens=torch.full((batch, max_new + k + 1), -1),
                         done=done.clone())
    target_tokens = torch.randint(0, vocab, (batch, k + 1), generator=torch.Generator().manual_seed(1))
    accepted = torch.tensor([rng.randint(0, k) for _ in range(batch)])
    kept, committed = SpecDecoder._commit(st, k, target_tokens, accepted, ~done)
    for i in range(batch):
        before = int(out_len[i])
        if done[i]:   # finished before the round: nothing emitted, nothing changed
            assert int(st.out_len[i]) == before and (st.out_tokens[i] == -1).all() and st.done[i]
            assert int(committed[i]) == 0
            continue
        want = reference_commit(target_tokens[i].tolist(), int(accepted[i]), set(eos), max_new - before)
        assert st.out_tokens[i, before:before + len(want)].tolist() == want
        assert int(st.out_len[i]) == before + len(want) and int(kept[i]) == len(want) - 1
        assert int(committed[i]) == len(want)
        assert bool(st.done[i]) == (want[-1] in eos or before + len(want) >= max_new)
