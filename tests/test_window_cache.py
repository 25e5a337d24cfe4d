"""Sliding-window drafter layers decode from a ring bounded by the window (dmtp/drafters/window_cache.py): the
loop equals the reference round (which recomputes the whole context and masks it by the window) for prompts
longer than the ring, padded batches and many wraps of it; the ring's slots are the window's, not the context's."""
from __future__ import annotations

import pytest
import torch

from dmtp.decode import SamplingConfig, build_proposer
from dmtp.families.decoding import spec_decoder
from dmtp.decode.reference import reference_generate, reference_proposal
from dmtp.drafters.block_drafter import fresh_drafter_for
from dmtp.drafters.window_cache import WindowCache, ring_block_mask, ring_positions, ring_size
from dmtp.models.qwen3 import KVCache
from test_dspark import dspark_drafter

SLIDING, FULL = "sliding_attention", "full_attention"


def prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(11)
    return [torch.randint(5, vocab, (n,), generator=g).tolist() for n in (31, 4, 17, 9)]


def windowed(target, name, layers, window):
    """One layer: a DSpark drafter whose Markov head knows the target's bigrams (drafts get accepted); more:
    a random DFlash drafter with those layers."""
    if len(layers) == 1:
        return dspark_drafter(target, name, layer_types=layers, sliding_window=window, is_causal=False)
    return fresh_drafter_for(target, name, 3, num_layers=len(layers), perturb=0.05,
                             backbone={"layer_types": layers, "sliding_window": window, "is_causal": False})


@pytest.mark.parametrize("layers,name", [([SLIDING], "raw_dflash"), ([SLIDING], "dual_anchor_zero_init"),
                                         ([SLIDING, FULL], "dual_anchor_zero_init")])
def test_window_cache_decoding_equals_the_reference_round(micro_target, micro_mtp, layers, name):
    drafter = windowed(micro_target, name, layers, 4)
    prop = build_proposer("drafter", micro_target, mtp=micro_mtp, drafter=drafter, name=name)
    ps = prompts(micro_target.config.vocab_size)
    dec = spec_decoder(micro_target, prop, eos_token_id=[])
    res = dec.generate(ps, max_new_tokens=40, batch_size=4)
    ring = ring_size(4, drafter.block_size)
    caches = prop.dstate.caches
    assert [isinstance(c, WindowCache) for c in caches] == [t == SLIDING for t in layers]
    assert all(c.max_len == ring for c in caches if isinstance(c, WindowCache)) and ring < 31 + 40
    propose = reference_proposal(prop)
    for i, p in enumerate(ps):
        assert (res.tokens[i], res.accepted[i]) == reference_generate(micro_target, propose, p, 40), i
    if len(layers) == 1:
        assert max(a for acc in res.accepted for a in acc) > 0
    ar = spec_decoder(micro_target, build_proposer("ar", micro_target), eos_token_id=[])
    assert res.tokens == ar.generate(ps, max_new_tokens=40).tokens


def test_ring_mask_is_the_position_mask_over_the_slots_positions():
    """Filling a ring and a position-indexed cache with the same rows, each slot's visibility under
    `ring_block_mask` is the visibility of the position it holds under the position-indexed rule."""
    from dmtp.drafters.dflash import cached_block_mask

    window, block, ring = 5, 4, ring_size(5, 4)
    anchor = torch.tensor([3, 17, 40])
    noise = anchor[:, None] + torch.arange(block)
    for causal in (False, True):
        by_ring = ring_block_mask(noise, anchor[:, None].expand(-1, block), ring, causal, window)
        by_pos = cached_block_mask(noise, anchor[:, None].expand(-1, block), 64, causal, window)
        pos = ring_positions(noise[:, -1], ring)
        for b in range(3):
            for j in range(ring):
                p = int(pos[b, j])
                expect = by_pos[b, 0, :, p] if p >= 0 else torch.zeros(block, dtype=torch.bool)
                assert torch.equal(by_ring[b, 0, :, j], expect), (b, j, p, causal)


def test_a_prompt_longer_than_the_ring_keeps_each_requests_last_rows():
    ring, t = 6, 15
    cache = WindowCache(2, 1, ring, 1, torch.float32, "cpu")
    full = KVCache(2, 1, t, 1, torch.float32, "cpu")
    positions = torch.arange(t).expand(2, -1)
    k = positions[:, None, :, None].float() + torch.tensor([0.0, 0.5])[:, None, None, None]   # value = position
    lengths = torch.tensor([15, 4])   # the second request's rows 4..14 are padding
    cache.write_prompt(positions, k, k, lengths)
    full.write(positions, k, k)
    assert sorted(cache.k[0, 0, :, 0].tolist()) == [9.0, 10.0, 11.0, 12.0, 13.0, 14.0]
    assert set(cache.k[1, 0, :, 0].tolist()) <= {0.5, 1.5, 2.5, 3.5, 0.0}      # never a padding row
    assert {v for v in cache.k[1, 0, :, 0].tolist() if v} == {0.5, 1.5, 2.5, 3.5}
    for p in range(4):
        assert cache.k[1, 0, p % ring, 0] == full.k[1, 0, p, 0]
    with pytest.raises(ValueError, match="at most 6 rows per write"):
        cache.write(positions, k, k)


def test_window_decoding_with_fixed_and_chosen_verify_lengths(micro_target, micro_mtp):
    """The ring and verify_length together (a round's rows and the ring are sized independently)."""
    drafter = windowed(micro_target, "raw_dflash", [SLIDING], 3)
    prop = build_proposer("drafter", micro_target, mtp=micro_mtp, drafter=drafter)
    ps = prompts(micro_target.config.vocab_size)
    ar = spec_decoder(micro_target, build_proposer("ar", micro_target), eos_token_id=[]).generate(ps, max_new_tokens=30)
    for length in (2, "auto"):
        res = spec_decoder(micro_target, prop, eos_token_id=[]).generate(
            ps, max_new_tokens=30, batch_size=2, sampling=SamplingConfig(verify_length=length))
        assert res.tokens == ar.tokens


def test_ring_drafts_equal_position_indexed_drafts_round_after_round(micro_target, micro_mtp, monkeypatch):
    """The block's confidence (a float of the drafter's hidden states, hence of every context row it read),
    per round, from the ring and from caches indexed by position (`cached_block_mask`'s window rule,
    tests/test_drafter_block_kv.py), to float rounding; greedy, a padded batch, the ring wrapped many times."""
    from dmtp.decode.proposers import DrafterState

    class PositionIndexed(DrafterState):
        def allocate(self, batch, max_len, device, dtype):
            super().allocate(batch, max_len, device, dtype)
            c = self.drafter.config
            self.caches = [KVCache(batch, c.num_key_value_heads, max_len, c.head_dim, dtype, device)
                           for _ in range(c.num_hidden_layers)]
            self.ring = None

    seen: dict[str, list] = {"ring": [], "positions": []}
    draft = DrafterState.draft

    def recording(self, *args, **kwargs):
        out = draft(self, *args, **kwargs)
        seen["positions" if isinstance(self, PositionIndexed) else "ring"].append(out[2].clone())
        return out

    monkeypatch.setattr(DrafterState, "draft", recording)
    drafter = fresh_drafter_for(micro_target, "dual_anchor_zero_init", 3, num_layers=2, perturb=0.05,
                                backbone={"architecture": "dspark", "layer_types": [SLIDING, FULL], "sliding_window": 5,
                                          "is_causal": False})
    with torch.no_grad():   # a fresh confidence head answers a constant: give it weights that read the hidden
        drafter.backbone.confidence_head.proj.weight.normal_(std=1.0, generator=torch.Generator().manual_seed(0))
    ps = prompts(micro_target.config.vocab_size)
    runs = []
    for indexed in (False, True):
        prop = build_proposer("drafter", micro_target, mtp=micro_mtp, drafter=drafter)
        if indexed:
            prop.dstate.__class__ = PositionIndexed
        runs.append(spec_decoder(micro_target, prop, eos_token_id=[]).generate(ps, max_new_tokens=40, batch_size=4))
    assert runs[0].tokens == runs[1].tokens and runs[0].accepted == runs[1].accepted
    assert len(seen["ring"]) == len(seen["positions"]) > 20
    for a, b in zip(seen["ring"], seen["positions"]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
