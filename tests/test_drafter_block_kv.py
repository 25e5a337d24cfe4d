"""Decoding's drafter attends its context caches in place (`CachedContext`): each layer writes the block's K/V
into its own cache at the block's positions and attends the cache under `cached_block_mask`, instead of
copying the cache in front of the block's K/V (`torch.cat`, training's layout, the code this replaced).

For DFlash, DFlash2 and DSpark, full / sliding / causal / bidirectional layers, blocks at the anchor and one
after it, and requests of different context lengths in one batch whose cache rows past their anchors hold
stale values: the block's hidden states (and, through `DrafterState.draft`, the candidates, q and
confidence) equal the concatenating path's to float rounding, the context rows below each anchor are
unchanged, and the draft writes nothing but the block's own rows."""
import pytest
import torch

from dmtp.decode.proposers import DrafterState
from dmtp.drafters.block_drafter import BlockDrafter, MTPBlockInputs
from dmtp.drafters.dflash import CachedContext, DFlashConfig, DFlashDrafter, cached_block_mask, dflash_attention_mask
from dmtp.drafters.dflash2 import DFlash2Config, DFlash2Drafter
from dmtp.drafters.dspark import DSparkConfig, DSparkDrafter
from dmtp.drafters.window_cache import WindowCache
from dmtp.models.qwen3 import KVCache

H, V, BS, MAX_LEN = 32, 48, 5, 40
ANCHORS = [6, 21, 13]   # three requests, three context lengths
ARCHS = {
    "dflash": (DFlashConfig, DFlashDrafter, {}),
    "dflash2": (DFlash2Config, DFlash2Drafter, dict(conv_kernel_size=3, conv_group_size=8, selector_rank=6,
                                                   selector_top_k=4)),
    "dspark": (DSparkConfig, DSparkDrafter, dict(markov_rank=6)),
}
LAYERS = {   # layer kinds: the mask's causal and window rules
    "full": dict(layer_types=["full_attention"] * 2),
    "full_causal": dict(layer_types=["full_attention"] * 2, is_causal=True),
    "sliding_mixed": dict(layer_types=["sliding_attention", "full_attention"], sliding_window=4),   # causal sliding
    "sliding_bidirectional": dict(layer_types=["sliding_attention"] * 2, sliding_window=7, is_causal=False),
}


def make_backbone(arch: str, layers: str, seed: int = 0):
    config_cls, drafter_cls, own = ARCHS[arch]
    config = config_cls(hidden_size=H, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=8, vocab_size=V, num_target_layers=6, target_layer_ids=[1, 4],
                        mask_token_id=V - 1, block_size=BS, **own, **LAYERS[layers])
    torch.manual_seed(seed)
    d = drafter_cls(config).eval()
    with torch.no_grad():   # every architecture's own parameters away from their identity / zero init
        for name, p in d.named_parameters():
            if name.endswith("norm.weight") or "_conv." in name or name.startswith(("candidate_selector.", "markov_")):
                p.add_(0.3 * torch.randn_like(p))
    return d


def filled_caches(d, batch: int, seed: int = 1) -> list[KVCache]:
    """Every slot of every layer's cache holds a context row: those at or after a request's anchor play the
    stale scratch rows of earlier rounds, which no block may see."""
    c = d.config
    g = torch.Generator().manual_seed(seed)
    positions = torch.arange(MAX_LEN).expand(batch, -1)
    hidden = d.project_context(torch.randn(batch, MAX_LEN, c.context_dim, generator=g))
    caches = [KVCache(batch, c.num_key_value_heads, MAX_LEN, c.head_dim, torch.float32, "cpu")
              for _ in range(c.num_hidden_layers)]
    for cache, (k, v) in zip(caches, d.context_kv(hidden, positions)):
        cache.write(positions, k, v)
    return caches


def concat_path(d, caches, noise, positions, limit, width):
    """The replaced decoding path: the cache's first `width` slots copied in front of the block's K/V."""
    ctx_kv = [(c.k[:, :, :width].clone(), c.v[:, :, :width].clone()) for c in caches]
    ctx_positions = torch.arange(width).expand(noise.shape[0], -1)
    return d(noise, positions, ctx_kv, ctx_positions, limit, torch.zeros_like(positions))


@pytest.mark.parametrize("layers", list(LAYERS))
@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("offset", [0, 1])   # slot 0 at A (raw DFlash) or one after it (T1 first)
def test_cached_block_equals_concatenated_context(arch, layers, offset):
    d = make_backbone(arch, layers)
    anchor = torch.tensor(ANCHORS)
    b = len(ANCHORS)
    positions = anchor[:, None] + offset + torch.arange(BS)
    limit = anchor[:, None].expand(-1, BS)
    width = max(ANCHORS) + BS + 1   # the loop's span rule: longest length + block width + 1
    noise = torch.randn(b, BS, H, generator=torch.Generator().manual_seed(2))
    caches = filled_caches(d, b)
    before = [(c.k.clone(), c.v.clone()) for c in caches]
    with torch.no_grad():
        want = concat_path(d, caches, noise, positions, limit, width)
        got = d(noise, positions, CachedContext(caches, width), None, limit, torch.zeros_like(positions))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    block_rows = torch.zeros(b, MAX_LEN, dtype=torch.bool)
    block_rows[torch.arange(b)[:, None], positions] = True
    for cache, (k0, v0) in zip(caches, before):
        for new, old in ((cache.k, k0), (cache.v, v0)):
            changed = (new != old).any(-1).any(1)                          # [B, slots]
            assert not (changed & ~block_rows).any()                      # only the block's own rows are written
            for r, a in enumerate(ANCHORS):
                assert torch.equal(new[r, :, :a], old[r, :, :a])          # the context below the anchor stays


@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (True, 3), (False, 6)])
def test_cached_mask_is_the_concatenated_mask_on_the_slot_axis(causal, window):
    """Folding the [context | block] key axis onto the cache's slots moves each block key to its position."""
    anchor = torch.tensor(ANCHORS)
    positions = anchor[:, None] + 1 + torch.arange(BS)
    limit = anchor[:, None].expand(-1, BS)
    width = max(ANCHORS) + BS + 1
    ctx_positions = torch.arange(width).expand(len(ANCHORS), -1)
    concat = dflash_attention_mask(positions, ctx_positions, limit, torch.zeros_like(positions), causal, window)
    folded = concat[..., :width].clone()
    for r in range(len(ANCHORS)):
        folded[r, :, :, positions[r]] |= concat[r, :, :, width:]
    assert torch.equal(cached_block_mask(positions, limit, width, causal, window), folded)


def _block_drafter(arch: str, layers: str, variant: str) -> BlockDrafter:
    return BlockDrafter.around(make_backbone(arch, layers), variant).eval()


@pytest.mark.parametrize("variant", ["raw_dflash", "dual_anchor_zero_init"])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_drafter_state_draft_equals_concatenated_context(arch, variant):
    """`DrafterState.draft` (the decoding stage, over the span) proposes what the concatenating path proposes:
    the same candidates, the same q and confidence to float rounding. Its sliding layer keeps a ring bounded by
    the window (`WindowCache`), filled as decoding fills it: rows up to the block's last one (anchor + B - 1, the
    most a round's context append reaches), the position-indexed layer every row."""
    drafter = _block_drafter(arch, "sliding_mixed", variant)
    g = torch.Generator().manual_seed(3)
    embed, lm_head = torch.randn(V, H, generator=g), torch.randn(V, H, generator=g)
    b = len(ANCHORS)
    state = DrafterState(drafter, embed, lm_head)
    state.allocate(b, MAX_LEN, "cpu", torch.float32)
    assert [type(c) for c in state.caches] == [WindowCache, KVCache]
    positions = torch.arange(MAX_LEN).expand(b, -1)
    features = torch.randn(b, MAX_LEN, drafter.injection.context_dim, generator=g)
    with torch.no_grad():
        state.append(features, None, positions, lengths=torch.tensor(ANCHORS) + drafter.block_size - 1)
    anchor_pos = torch.tensor(ANCHORS)
    anchor = torch.randint(0, V, (b,), generator=g)
    mtp = None
    if drafter.needs_mtp:
        mtp = MTPBlockInputs(torch.randint(0, V, (b, 1, 1), generator=g), torch.randn(b, 1, 1, H, generator=g),
                             torch.ones(b, 1, dtype=torch.long))
    span = max(ANCHORS) + drafter.block_size + 1

    def sampler(scores):   # greedy picks, and the scores' softmax as q: a continuous output to compare
        return scores.argmax(-1), torch.softmax(scores.float(), -1)

    with torch.no_grad():
        state.build(anchor, mtp)
        hidden = drafter.project_context(drafter.injection.context_features(features, None))
        ctx_kv = [(k[:, :, :span], v[:, :, :span]) for k, v in drafter.context_kv(hidden, positions)]
        want = drafter.draft_block(embed, anchor[:, None], anchor_pos[:, None], ctx_kv,
                                   torch.arange(span).expand(b, -1), mtp, lm_head_weight=lm_head, sampler=sampler,
                                   slots=state.slots)
        before = [c.k.clone() for c in state.caches]
        tokens, q, confidence = state.draft(anchor, anchor_pos, mtp, sampler, span)
    assert torch.equal(tokens, want.candidates[:, 0])
    torch.testing.assert_close(q, want.q[:, 0], atol=1e-5, rtol=1e-5)
    assert (confidence is None) == (want.confidence is None) == (arch != "dspark")
    if confidence is not None:
        torch.testing.assert_close(confidence, want.confidence[:, 0], atol=1e-5, rtol=1e-5)
    window = drafter.config.sliding_window
    for cache, k0 in zip(state.caches, before):
        for r, a in enumerate(ANCHORS):
            if isinstance(cache, WindowCache):   # the slots of the window's context rows
                slots = [p % cache.ring for p in range(max(0, a - window + 1), a)]
                assert torch.equal(cache.k[r, :, slots], k0[r, :, slots])
            else:
                assert torch.equal(cache.k[r, :, :a], k0[r, :, :a])


def test_cached_context_takes_one_block_per_request():
    drafter = _block_drafter("dflash", "full", "raw_dflash")
    caches = filled_caches(drafter.backbone, 1)
    with pytest.raises(ValueError, match="one block per request"):
        drafter.draft_block(torch.randn(V, H), torch.zeros(1, 2, dtype=torch.long), torch.tensor([[3, 9]]),
                            CachedContext(caches, MAX_LEN), None)
