"""Grouped-query attention without copying the cache (`dmtp.models.qwen3.GQA_MODES`): every mode gives
the attention of K/V repeated per query head, under every mask form the runners and drafters pass, and
greedy decoding stays exactly the target's own with the query regrouped (the CUDA default), on CPU."""
import pytest
import torch

from dmtp.decode import build_proposer
from dmtp.families.decoding import spec_decoder
from dmtp.injection import VARIANTS
from dmtp.models.qwen3 import additive_mask, attend, gqa_mode, set_gqa_mode
from test_decode_loop import MAX_NEW, eos_and_refs, continuations, greedy_reference, make_drafter, prompts, tokenizer  # noqa: F401


@pytest.fixture
def gqa():
    """Set a mode for one test, then put the previous one back."""
    saved = []

    def use(mode):
        saved.append(set_gqa_mode(mode))

    yield use
    if saved:
        set_gqa_mode(saved[0])


def _qkv(b, h, hkv, t, slots, d=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, t, d, generator=gen)
    k = torch.randn(b, hkv, slots, d, generator=gen)
    v = torch.randn(b, hkv, slots, d, generator=gen)
    return q, k, v


def _cache_mask(b, t, width, lengths):
    """Rows at lengths[b] + i see slots 0..lengths[b] + i (the verify mask), [B, 1, T, width]."""
    pos = torch.tensor(lengths)[:, None] + torch.arange(t)
    return (torch.arange(width)[None, None, :] <= pos[:, :, None])[:, None]


def _each_mode(gqa, q, k, v, mask):
    out = {}
    for mode in ("repeat", "native", "grouped"):
        gqa(mode)
        out[mode] = attend(q, k, v, mask)
    return out


@pytest.mark.parametrize("t", [1, 3, 16])
@pytest.mark.parametrize("form", ["bool", "additive", "per_head", "none"])
def test_every_mode_is_the_repeated_attention(gqa, t, form):
    b, h, hkv, slots = 3, 8, 2, 40
    q, k, v = _qkv(b, h, hkv, t, slots)
    width = 32   # narrower than the cache: slots past it are never attended
    mask = _cache_mask(b, t, width, [4, 11, 20])
    if form == "additive":
        mask = additive_mask(mask, q.dtype)
    elif form == "per_head":   # a different visibility per query head
        mask = mask.expand(b, h, t, width).clone()
        mask[:, 1::2, :, 2:5] = False
    elif form == "none":
        mask = None
    out = _each_mode(gqa, q, k, v, mask)
    assert out["repeat"].shape == (b, h, t, 16)
    for mode in ("native", "grouped"):
        torch.testing.assert_close(out[mode], out["repeat"], rtol=1e-5, atol=1e-6, msg=mode)
    if mask is not None:   # the slots past the mask's width were not read: changing them changes nothing
        k2 = k.clone()
        k2[:, :, width:] = 1e4
        gqa("grouped")
        torch.testing.assert_close(attend(q, k2, v, mask), out["grouped"])


def test_fully_masked_rows_stay_finite(gqa):
    """Padding rows that see nothing (scratch) average their keys in every mode instead of giving NaN."""
    b, h, hkv, t, slots = 2, 4, 2, 4, 12
    q, k, v = _qkv(b, h, hkv, t, slots, seed=1)
    mask = _cache_mask(b, t, slots, [3, 5])
    mask[1, :, 2:] = False
    out = _each_mode(gqa, q, k, v, mask)
    for mode, o in out.items():
        assert torch.isfinite(o).all(), mode
        torch.testing.assert_close(o, out["repeat"], rtol=1e-5, atol=1e-6)


def test_grouped_reads_each_kv_head_once(gqa, monkeypatch):
    """The grouped path hands SDPA equal head counts (K/V as stored, not repeated), the mask broadcast
    over the group (a view) for one query row, and never asks for enable_gqa."""
    import torch.nn.functional as F

    seen = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        seen.append((q.shape, k.shape, None if attn_mask is None else attn_mask.shape, kw.get("enable_gqa", False),
                     None if attn_mask is None else attn_mask.stride()))
        return real(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    gqa("grouped")
    q, k, v = _qkv(2, 8, 2, 1, 24)
    attend(q, k, v, additive_mask(_cache_mask(2, 1, 24, [5, 9]), q.dtype))
    qs, ks, ms, enable, mstride = seen[-1]
    assert qs == (2, 2, 4, 16) and ks == (2, 2, 24, 16) and ms == (2, 1, 4, 24) and not enable
    assert mstride[2] == 0   # the group's rows share one mask row: no copy


def test_mode_names_are_checked():
    with pytest.raises(ValueError, match="gqa mode must be one of"):
        set_gqa_mode("flash")
    assert gqa_mode("cpu") in ("native", "grouped", "repeat")


@pytest.mark.parametrize("method", ["ar", "mtp415", *VARIANTS])
def test_grouped_query_decoding_is_lossless(gqa, micro_target, micro_mtp, prompts, eos_and_refs, method):  # noqa: F811
    """The micro target and its drafters have grouped heads: with the query regrouped (the CUDA default,
    forced here on CPU) greedy decoding is still token for token the target's own."""
    assert micro_target.config.num_key_value_heads < micro_target.config.num_attention_heads
    eos, refs = eos_and_refs
    gqa("grouped")
    if method in ("ar", "mtp415"):
        proposer = build_proposer(method, micro_target, mtp=micro_mtp)
    else:
        proposer = build_proposer("drafter", micro_target, mtp=micro_mtp, drafter=make_drafter(micro_target, method),
                                  name=method)
    res = spec_decoder(micro_target, proposer, eos_token_id=eos).generate(prompts, max_new_tokens=MAX_NEW, batch_size=4)
    assert res.tokens == refs


def test_long_prefill_repeats_kv_instead_of_the_mask(gqa, monkeypatch):
    """Grouped attention repeats the mask over the group, which for Tq >= 2*hkv*d rows (a long prefill)
    would cost more than repeating K/V once: that call repeats K/V instead, with the same result."""
    import torch.nn.functional as F

    seen = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        seen.append((q.shape[1], k.shape[1]))
        return real(q, k, v, attn_mask=attn_mask, **kw)

    b, h, hkv, d = 2, 4, 2, 4   # 2 * hkv * d = 16 rows
    for t, heads in ((15, (2, 2)), (16, (4, 4))):
        gen = torch.Generator().manual_seed(t)
        q, k, v = torch.randn(b, h, t, d, generator=gen), torch.randn(b, hkv, 30, d, generator=gen), \
            torch.randn(b, hkv, 30, d, generator=gen)
        mask = _cache_mask(b, t, 30, [0, 7])
        gqa("repeat")
        ref = attend(q, k, v, mask)
        gqa("grouped")
        monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
        torch.testing.assert_close(attend(q, k, v, mask), ref, rtol=1e-5, atol=1e-6)
        monkeypatch.setattr(F, "scaled_dot_product_attention", real)
        assert seen[-1] == heads


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 16])
def test_cuda_grouped_attention_reads_the_cache_in_place(gqa, t):
    """On CUDA bf16: grouped equals repeated attention (to bf16 rounding), runs on a fused kernel (the math
    kernel excluded), and allocates far less than one copy of the cache, where repeat allocates the
    group's worth of copies."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, h, hkv, slots, d = 4, 32, 8, 2048, 128
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(b, hkv, slots, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn_like(k)
    mask = additive_mask(_cache_mask(b, t, slots, [100, 700, 1500, 2000 - t]).cuda(), torch.bfloat16)
    cache_bytes = 2 * k.numel() * k.element_size()
    peak = {}
    out = {}
    for mode in ("repeat", "grouped"):
        gqa(mode)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out[mode] = attend(q, k, v, mask)
        torch.cuda.synchronize()
        peak[mode] = torch.cuda.max_memory_allocated() - base
    torch.testing.assert_close(out["grouped"].float(), out["repeat"].float(), rtol=2e-2, atol=2e-2)
    assert peak["repeat"] >= 0.9 * (h // hkv) * cache_bytes
    assert peak["grouped"] < 0.25 * cache_bytes
    gqa("grouped")
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
        torch.testing.assert_close(attend(q, k, v, mask), out["grouped"])
