"""Training's many-block forward attends consecutive blocks in groups, each over [context ; its own rows]
(`dmtp.drafters.dflash.block_groups`): the same attention as one dense mask over every block's rows."""
from __future__ import annotations

import pytest
import torch

import dmtp.drafters.dflash as dflash
from dmtp.drafters.dflash import block_groups
from dmtp.drafters.registry import architecture_named

H, V, BS, S = 32, 64, 4, 40
ARCH_OPTIONS = {"dflash": {}, "dflash2": {"conv_group_size": 8, "selector_top_k": 4, "selector_rank": 4},
                "dspark": {"markov_rank": 4}}
LAYERS = {"full": {}, "sliding_causal": {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 5,
                                         "is_causal": True}}


def make_drafter(arch: str, layers: str):
    a = architecture_named(arch)
    config = a.config(hidden_size=H, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, vocab_size=V, num_target_layers=6, target_layer_ids=[1, 4],
                      mask_token_id=V - 1, block_size=BS, **ARCH_OPTIONS[arch], **LAYERS[layers])
    torch.manual_seed(0)
    drafter = a.module(config)
    with torch.no_grad():   # every parameter non-trivial (DFlash2's convolutions start as identities)
        for p in drafter.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return drafter


def many_blocks(batch=2, blocks=12, seed=1):
    """Sorted anchors per row (as training draws them), two of them dropped (limit 0: no context)."""
    g = torch.Generator().manual_seed(seed)
    anchors = torch.stack([torch.randperm(S - BS, generator=g)[:blocks].sort().values for _ in range(batch)])
    limit = anchors.clone()
    limit[0, 3] = limit[1, 7] = 0
    pos = (anchors[..., None] + torch.arange(BS)).flatten(1)
    bid = torch.arange(blocks).repeat_interleave(BS).expand(batch, -1)
    return pos, limit.repeat_interleave(BS, dim=1), bid, g


def test_block_groups_split_evenly_or_not_at_all(monkeypatch):
    assert block_groups(512, 16) == 16         # training at the experiment's shapes, as shipped: 32 blocks a group
    monkeypatch.setattr(dflash, "BLOCK_GROUP_ROWS", 0)
    assert block_groups(512, 16) == 1          # 0: one dense mask
    monkeypatch.setattr(dflash, "BLOCK_GROUP_ROWS", 1024)
    assert block_groups(512, 16) == 8          # 8 groups of 64 blocks at 1024 rows a group
    assert block_groups(500, 16) == 10         # 50 blocks (800 rows) each
    assert block_groups(509, 16) == 1          # a prime count: no even split nearby, attended whole
    assert block_groups(64, 16) == 1 and block_groups(1, 16) == 1   # fits one group (decoding's one block)


@pytest.mark.parametrize("layers", sorted(LAYERS))
@pytest.mark.parametrize("arch", sorted(ARCH_OPTIONS))
def test_grouped_blocks_attend_as_one_dense_mask(arch, layers, monkeypatch):
    monkeypatch.setattr(dflash, "BLOCK_GROUP_ROWS", 2 * BS)   # 2 blocks a group: 6 groups of 12 blocks
    assert block_groups(12, BS) == 6
    drafter = make_drafter(arch, layers)
    pos, limit, bid, g = many_blocks()
    feats = torch.randn(2, S, drafter.config.context_dim, generator=g)
    ctx_pos = torch.arange(S).expand(2, -1).clone()
    ctx_pos[1, S // 2:] = 10 ** 6   # row 1's later context slots are padding: invisible to every block
    noise = torch.randn(2, pos.shape[1], H, generator=g)
    out_grad = torch.randn(2, pos.shape[1], H, generator=g)

    def forward_and_grads(block_rows):
        drafter.zero_grad()
        ctx_kv = drafter.context_kv(drafter.project_context(feats), ctx_pos)
        out = drafter(noise, pos, ctx_kv, ctx_pos, limit, bid, block_rows=block_rows)
        (out * out_grad).sum().backward()
        return out.detach(), {n: p.grad.clone() for n, p in drafter.named_parameters() if p.grad is not None}

    dense, dense_grads = forward_and_grads(None)
    grouped, grouped_grads = forward_and_grads(BS)
    torch.testing.assert_close(grouped, dense, rtol=1e-5, atol=1e-5)
    assert grouped_grads.keys() == dense_grads.keys() and len(dense_grads) > 10
    for name in dense_grads:
        torch.testing.assert_close(grouped_grads[name], dense_grads[name], rtol=1e-4, atol=1e-5, msg=name)
