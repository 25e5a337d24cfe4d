"""The serving MTP cache (`dmtp.serving.vllm.mtp_slots`): many requests caught up together in one shared cache give
each request's rows exactly as a private cache per request does, through prompt chunks, decode steps of
different lengths, rejected rows rewritten, requests finishing and their slots reused, and the cache growing."""
from __future__ import annotations

import pytest
import torch

from dmtp.serving.vllm.mtp_slots import MTPRows, MTPSlots

BLOCK_ROWS = 4   # 1 + the speculative tokens
MAX_POSITION = 96


class PerRequest:
    """The oracle: one private cache and one forward per request (the plug-in's former catch-up)."""

    def __init__(self, mtp):
        self.mtp, self.caches = mtp, {}

    def catch_up(self, requests):
        outs = []
        for r in requests:
            cache = self.caches.setdefault(r.req_id, self.mtp.new_cache(1, MAX_POSITION + 1))
            positions = torch.arange(r.first_position, r.first_position + len(r.tokens))
            g = self.mtp.forward_rows(r.tokens[None], r.hidden[None], positions[None], cache,
                                      span=int(positions[-1]) + 1)
            outs.append(g[0, -1])
        return torch.stack(outs)


def test_one_shared_forward_equals_a_cache_per_request(micro_mtp):
    torch.manual_seed(0)
    vocab, width = micro_mtp.embed_tokens.weight.shape
    slots, oracle = MTPSlots(micro_mtp, MAX_POSITION, BLOCK_ROWS), PerRequest(micro_mtp)
    rows_at = {}   # req_id -> next row position

    def step(plan):
        """plan: {req_id: (rows, rejected_rows_to_redo)}: each request's rows this step."""
        requests = []
        for req_id, (count, redo) in plan.items():
            first = rows_at.get(req_id, 1) - redo   # rejected rows are rewritten at their positions
            requests.append(MTPRows(req_id, torch.randint(vocab, (count,)), torch.randn(count, width), first))
            rows_at[req_id] = first + count
        slots.forget_all_but(set(plan))
        got, want = slots.catch_up(requests), oracle.catch_up(requests)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        return got

    step({"a": (20, 0), "b": (3, 0)})                 # a prompt chunk longer than a block beside a short prompt
    step({"a": (4, 0), "b": (1, 0), "c": (31, 0)})    # decode rows of different lengths and a new prompt
    step({"a": (2, 2), "b": (4, 0), "c": (3, 0)})     # a's last two rows rejected: rewritten
    assert len(slots.slot_of) == 3
    step({"b": (2, 0), "d": (9, 0)})                  # a and c finished: d takes a freed slot
    assert sorted(slots.slot_of.values()) == [0, 1]
    step({"b": (3, 0), "d": (4, 0), "e": (5, 0), "f": (2, 0), "g": (6, 0)})   # more live requests: the cache grows
    assert slots.cache.k.shape[0] >= 5


def test_a_non_kv_cache_mtp_is_refused_in_one_line():
    class OtherCache:
        pass

    class OtherMTP:
        layers = [object()]

        def new_cache(self, batch, max_len):
            return OtherCache()

    slots = MTPSlots(OtherMTP(), MAX_POSITION, BLOCK_ROWS)
    with pytest.raises(TypeError, match="KVCache") as e:
        slots.catch_up([MTPRows("a", torch.zeros(1, dtype=torch.long), torch.zeros(1, 8), 1)])
    assert "\n" not in str(e.value)
