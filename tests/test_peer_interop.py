"""Checkpoint interop with the reference implementation (`dflash` on PyPI, z-lab): a DFlash and a DFlash2
drafter written by the package's classes load in dmtp and compute what the package computes (hidden
states, logits, DFlash2's selector path), and drafters written by dmtp load in the package's classes
with the same outputs. Skipped when the package is absent (CI installs it with `--no-deps`)."""
import pytest
import torch

ref = pytest.importorskip("dflash.model")

from dmtp.drafters.checkpoint import load_drafter, save_drafter
from dmtp.drafters.dflash import DFlashConfig
from dmtp.drafters.dflash2 import DFlash2Config  # noqa: E402
from dmtp.drafters.registry import build_drafter_from_config  # noqa: E402

H, V, CTX, BLOCK, MASK = 32, 97, 9, 8, 3
TAPS = [0, 2]
DFLASH2 = {"conv_kernel_size": 2, "conv_group_size": 8, "selector_rank": 16, "selector_top_k": 4}


def _ref_model(dflash2: bool):
    """A random reference drafter (GQA 4/2 heads, 2 layers) with non-trivial norms and convolutions."""
    from transformers import Qwen3Config

    cfg = Qwen3Config(hidden_size=H, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, vocab_size=V, rms_norm_eps=1e-6, rope_theta=10000.0,
                      max_position_embeddings=256, tie_word_embeddings=False)
    cfg.num_target_layers = 4
    cfg.dflash_config = {"mask_token_id": MASK, "target_layer_ids": TAPS, "block_size": BLOCK,
                         **(DFLASH2 if dflash2 else {})}
    cfg.architectures = ["DFlash2DraftModel" if dflash2 else "DFlashDraftModel"]
    torch.manual_seed(0)
    model = (ref.DFlash2DraftModel if dflash2 else ref.DFlashDraftModel)(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:   # includes the convolutions' base kernels and projections, and the codebooks
                p.copy_(0.3 * torch.randn_like(p))
    return model.eval()


def _our_model(dflash2: bool):
    config_class = DFlash2Config if dflash2 else DFlashConfig
    cfg = config_class(hidden_size=H, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=8, vocab_size=V, num_target_layers=4, target_layer_ids=TAPS,
                       mask_token_id=MASK, block_size=BLOCK, rope_theta=10000.0, max_position_embeddings=256,
                       **(DFLASH2 if dflash2 else {}))
    torch.manual_seed(1)
    drafter = build_drafter_from_config(cfg)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in name else 0.3 * torch.randn_like(p))
    return drafter.eval()


def _inputs():
    g = torch.Generator().manual_seed(2)
    ctx = torch.randn(1, CTX, len(TAPS) * H, generator=g)
    embed = torch.randn(V, H, generator=g)
    head = torch.nn.Linear(H, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=g))
    ids = torch.tensor([[17] + [MASK] * (BLOCK - 1)])   # [anchor, MASK x 7] at positions CTX..CTX+7
    return ctx, embed, head, ids


@torch.no_grad()
def _compare(theirs, ours, dflash2: bool) -> None:
    ctx, embed, head, ids = _inputs()
    noise = torch.nn.functional.embedding(ids, embed)
    # The package: context + block in one call (its loop's first round), positions [context | block].
    hidden_ref = theirs(target_hidden=ctx, noise_embedding=noise, position_ids=torch.arange(CTX + BLOCK)[None])
    # dmtp: context K/V at positions 0..CTX-1, then the block sees all of it (anchor at CTX).
    ctx_pos = torch.arange(CTX)[None]
    block_pos = torch.arange(CTX, CTX + BLOCK)[None]
    kv = ours.context_kv(ours.project_context(ctx), ctx_pos)
    hidden = ours(noise, block_pos, kv, ctx_pos, torch.full_like(block_pos, CTX), torch.zeros_like(block_pos))
    torch.testing.assert_close(hidden, hidden_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.logits(hidden, head.weight), theirs.compute_logits(hidden_ref, head),
                               atol=1e-4, rtol=1e-5)
    if dflash2:   # the selector's greedy path over the top-K candidates, from the anchor on
        tokens_ref = theirs.propose(hidden_ref[:, 1:], ids[:, 0], head, 0.0)[0]
        tokens, _ = ours.propose(hidden[:, 1:], head.weight, ids[:, 0])
        assert torch.equal(tokens, tokens_ref)
        assert len(set(tokens[0].tolist())) > 1   # a path, not one token repeated


@pytest.mark.parametrize("dflash2", [False, True], ids=["dflash", "dflash2"])
def test_reference_checkpoint_loads_in_dmtp(tmp_path, dflash2):
    theirs = _ref_model(dflash2)
    theirs.save_pretrained(tmp_path)
    ours, extras, _ = load_drafter(tmp_path)
    assert not extras
    assert ours.config.architecture == ("DFlash2DraftModel" if dflash2 else "DFlashDraftModel")
    _compare(theirs, ours.eval(), dflash2)


@pytest.mark.parametrize("dflash2", [False, True], ids=["dflash", "dflash2"])
def test_dmtp_checkpoint_loads_in_reference(tmp_path, dflash2):
    ours = _our_model(dflash2)
    save_drafter(tmp_path, ours)
    cls = ref.DFlash2DraftModel if dflash2 else ref.DFlashDraftModel
    theirs = cls.from_pretrained(tmp_path).eval()
    assert theirs.block_size == BLOCK and theirs.mask_token_id == MASK and list(theirs.target_layer_ids) == TAPS
    for name, p in theirs.state_dict().items():   # every tensor arrived (none left at its init)
        key = name.removesuffix(".weight") if "codebook" in name else name
        assert torch.equal(p, ours.state_dict()[key]), name
    _compare(theirs, ours, dflash2)


# -- the reference loop (`dflash_generate`) vs ours, on the micro target, at block 16 and 8 -------------
# Greedy, batch 1: identical tokens AND identical accepted length per round. The prompts include a
# repetitive one, on which even a random drafter gets runs accepted (longer than 7 at block 16).
LOOP_PROMPTS = [[17, 45, 300, 12, 9, 81, 77, 5, 40], [210, 11, 61, 400, 8]]
LOOP_NEW = 48


def _reference_drafter_for(target, block_size: int):
    """A random reference DFlash drafter sized to `target` (2 layers, taps 1 and 2), blocks of `block_size`."""
    from transformers import Qwen3Config

    c = target.config
    cfg = Qwen3Config(hidden_size=c.hidden_size, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
                      head_dim=c.head_dim, vocab_size=c.vocab_size, rms_norm_eps=1e-6, rope_theta=10000.0,
                      max_position_embeddings=512, tie_word_embeddings=False)
    cfg.num_target_layers = c.num_hidden_layers
    cfg.dflash_config = {"mask_token_id": MASK, "target_layer_ids": [1, 2], "block_size": block_size}
    cfg.architectures = ["DFlashDraftModel"]
    torch.manual_seed(0)
    model = ref.DFlashDraftModel(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.2 * torch.randn_like(p))
    return model.eval()


def _assert_same_rounds(target, ref_model, drafter, block_size, monkeypatch):
    """Our loop and `dflash_generate(..., block_size=block_size)`: the same tokens and, per round, the same
    accepted length (theirs counts the bonus token: `acceptance_lengths` = accepted + 1)."""
    import time

    from dmtp.decode import build_proposer
    from dmtp.families.decoding import spec_decoder

    monkeypatch.setattr(ref, "_cuda_time", time.perf_counter)   # its stats timer syncs CUDA; on CPU, wall time
    assert drafter.block_size == block_size and drafter.num_candidates == block_size - 1
    ours = spec_decoder(target, build_proposer("drafter", target, drafter=drafter), eos_token_id=[])
    res = ours.generate(LOOP_PROMPTS, max_new_tokens=LOOP_NEW, batch_size=1)
    for i, prompt in enumerate(LOOP_PROMPTS):
        theirs = ref.dflash_generate(ref_model, target.hf, torch.tensor([prompt]), LOOP_NEW, None,
                                     block_size=block_size, return_stats=True)
        assert res.tokens[i] == theirs.output_ids[0, len(prompt):].tolist(), f"request {i}"
        assert res.accepted[i] == [n - 1 for n in theirs.acceptance_lengths], f"request {i}"
    assert any(a > 0 for acc in res.accepted for a in acc)   # runs were accepted, not only corrections
    return res


@pytest.mark.parametrize("block_size", [16, 8])
def test_reference_checkpoint_decodes_as_the_reference_loop(tmp_path, micro_target, block_size, monkeypatch):
    from dmtp.drafters.block_drafter import load_block_drafter

    theirs = _reference_drafter_for(micro_target, block_size)
    theirs.save_pretrained(tmp_path)
    drafter, _ = load_block_drafter(tmp_path)   # the published layout: raw DFlash, its own block_size
    assert drafter.variant == "raw_dflash"
    res = _assert_same_rounds(micro_target, theirs, drafter.eval(), block_size, monkeypatch)
    if block_size == 16:   # the block is really 16 wide: a round accepted more than a block of 8 holds
        assert max(a for acc in res.accepted for a in acc) > 7


def test_our_block16_export_runs_in_the_reference_loop(tmp_path, micro_target, monkeypatch):
    from dmtp.drafters.block_drafter import load_block_drafter

    _reference_drafter_for(micro_target, 16).save_pretrained(tmp_path / "theirs")   # weights that get runs accepted
    ours, _ = load_block_drafter(tmp_path / "theirs")
    ours.save(tmp_path / "ours")                                                     # exported by dmtp
    assert (tmp_path / "ours" / "config.json").read_text().count('"block_size": 16') == 2   # top level + dflash_config
    theirs = ref.DFlashDraftModel.from_pretrained(tmp_path / "ours").eval()
    assert theirs.block_size == 16
    _assert_same_rounds(micro_target, theirs, ours.eval(), 16, monkeypatch)
