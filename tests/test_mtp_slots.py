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


def test_a_chained_step_is_scratch_and_equals_a_private_caches_row(micro_mtp):
    """Chained rows after the anchor (the multi-step variants) equal one private cache's rows at those positions,
    leave the committed rows' count alone, and the next catch-up's rows overwrite them."""
    torch.manual_seed(1)
    vocab, width = micro_mtp.embed_tokens.weight.shape
    slots, oracle = MTPSlots(micro_mtp, MAX_POSITION, BLOCK_ROWS), PerRequest(micro_mtp)
    prompt = [MTPRows(r, torch.randint(vocab, (n,)), torch.randn(n, width), 1) for r, n in (("a", 9), ("b", 3))]
    h = slots.catch_up(prompt)
    oracle.catch_up(prompt)
    assert (slots.rows_before("a"), slots.rows_before("b"), slots.rows_before("new")) == (9, 3, 0)
    tokens, anchors = torch.randint(vocab, (2,)), torch.tensor([9, 3])
    got = slots.chain_step(slots.slots_of(["a", "b"]), tokens, h, anchors + 1, span=11)
    for i, req in enumerate(("a", "b")):
        cache = oracle.caches[req]
        want = micro_mtp.forward_rows(tokens[i].view(1, 1), h[i].view(1, 1, -1), (anchors[i] + 1).view(1, 1), cache,
                                      span=int(anchors[i]) + 2)[0, 0]
        torch.testing.assert_close(got[i], want, rtol=1e-5, atol=1e-5)
    assert slots.rows_before("a") == 9
    step = [MTPRows("a", torch.randint(vocab, (2,)), torch.randn(2, width), 10)]
    torch.testing.assert_close(slots.catch_up(step), oracle.catch_up(step), rtol=1e-5, atol=1e-5)


def test_the_prefix_store_gives_back_a_cached_prefixs_hidden_states_block_by_block():
    """Blocks are keyed by every token up to them: a repeated prompt and a prompt sharing whole blocks get the
    recorded hidden states back; a prefix that differs in an earlier block, is not whole blocks, or whose block
    was dropped (capacity) is a miss."""
    from dmtp.serving.vllm.mtp_prefix import PrefixHiddenStore

    torch.manual_seed(2)
    store = PrefixHiddenStore(block_size=4, capacity=3)
    tokens, hidden = list(range(100, 111)), torch.randn(11, 5)
    store.record("a", 0, tokens[:6], hidden[:6])       # a prompt chunk, then the rest
    store.record("a", 6, tokens[6:11], hidden[6:11])
    store.record("a", 6, tokens[6:8], hidden[6:8])     # positions already recorded are skipped
    assert len(store.blocks) == 2
    torch.testing.assert_close(store.lookup("b", tokens[:8]), hidden[:8])
    torch.testing.assert_close(store.lookup("c", tokens[:4]), hidden[:4])   # a shared first block
    assert store.lookup("d", [0] + tokens[1:8]) is None                     # block 1 differs: block 2's key too
    assert store.lookup("e", tokens[:6]) is None                            # not whole blocks
    store.record("b", 8, [7, 7, 7, 7], torch.randn(4, 5))                   # b goes on from its cached prefix
    store.record("f", 0, [1, 2, 3, 4, 5, 6, 7, 8], torch.randn(8, 5))       # capacity 3: the oldest blocks go
    assert len(store.blocks) == 3
    assert store.lookup("g", tokens[:4]) is None
    assert (store.hits, store.misses, store.rebuilt_rows) == (2, 3, 12)
    store.forget_all_but({"f"})
    assert set(store.requests) == {"f"}
