"""The LightningModule, data and recipe on the micro target: every variant learns, zero-init is a
no-op at step 0, bad input fails with one clear line (exact resume: tests/test_reliability.py)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from dmtp.configs import compose_train
from dmtp.drafters.block_drafter import BlockDrafter
from dmtp.drafters.checkpoint import save_drafter
from dmtp.drafters.dflash import DFlashConfig, DFlashDrafter
from dmtp.injection import VARIANTS
from dmtp.injection.catalogue import make_injection
from dmtp.training.blocks import draft_blocks, sample_anchors, teacher_features, valid_anchors
from dmtp.training.components import build_components
from dmtp.training.job import train


def _batch(tokenizer, seq_len=64, rows=4):
    from dmtp.data.corpora import texts

    ids = []
    for text in texts("math", "train")[:40] + texts("code", "train")[:2]:
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
    x = torch.tensor(ids[: seq_len * rows]).view(rows, seq_len)
    return x, torch.ones_like(x)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_overfits_a_fixed_batch(name):
    torch.manual_seed(0)
    cfg = compose_train([f"injection={name}", "recipe=greedy"])   # CE on greedy labels: what a fixed batch drives down
    _, tokenizer, _, module = build_components(cfg)
    ids, mask = _batch(tokenizer)
    opt = torch.optim.AdamW(module.drafter.parameters(), lr=3e-3)
    losses = []
    for _ in range(12):
        gen = torch.Generator().manual_seed(0)  # the same anchors every step: a fixed batch
        loss, acc, n = module.block_loss(ids, mask, generator=gen)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert n > 0 and torch.isfinite(torch.tensor(losses)).all()
    assert losses[-1] < 0.8 * losses[0], losses


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_variant_trains_with_block_16(name):
    """drafter.block_size=16: the slots, the supervised positions (15 or 14 per block, decayed), the
    optimizer step and the exact walk (P(L>=k) up to 15) all follow the drafter's block."""
    from dmtp.training.validation import exact_acceptance

    torch.manual_seed(0)
    target, tokenizer, _, module = build_components(compose_train([f"injection={name}", "drafter.block_size=16"]))
    drafter = module.drafter
    assert (drafter.config.block_size, drafter.block_size, drafter.num_candidates) == (16, 16, 15)
    assert drafter.injection.num_slots == 16 - drafter.injection.first_slot_offset
    ids, mask = _batch(tokenizer)
    opt = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    losses = []
    for _ in range(3):
        loss, acc, n = module.block_loss(ids, mask, generator=torch.Generator().manual_seed(0))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert n > 0 and len(acc) == drafter.injection.num_drafter_candidates == 15 - drafter.injection.uses_mtp
    assert torch.isfinite(torch.tensor(losses)).all() and losses[-1] < losses[0], losses
    walk = exact_acceptance(target, module.mtp, drafter.eval(), ids[:2], torch.tensor([16, 16]), torch.tensor([64, 64]))
    assert len(walk["hist"]) == 16 and walk["walk_rounds"] > 0


@pytest.mark.parametrize("value", [0, 1, 33, 8.5, "eight"])
def test_a_block_size_the_code_cannot_honour_is_one_line(value):
    with pytest.raises(ValueError, match=r"^drafter.block_size must be an integer in 2\.\.32 .*, got") as err:
        build_components(compose_train([f"drafter.block_size={value}"]))
    assert "\n" not in str(err.value)


def test_zero_init_continues_a_published_dflash_drafter(tmp_path, micro_target):
    cfg = micro_target.config
    dcfg = DFlashConfig(hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size, num_hidden_layers=1,
                        num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
                        head_dim=cfg.head_dim, vocab_size=cfg.vocab_size, num_target_layers=cfg.num_hidden_layers,
                        target_layer_ids=[1, 2], mask_token_id=3)
    torch.manual_seed(1)
    published = DFlashDrafter(dcfg)
    save_drafter(tmp_path / "dflash", published)   # the published layout, no dmtp section
    config = json.loads((tmp_path / "dflash" / "config.json").read_text())
    assert "dflash_config" in config and "dmtp" not in config

    run_cfg = compose_train(["injection=dual_anchor_zero_init", f"init_from={tmp_path / 'dflash'}"])
    _, _, _, module = build_components(run_cfg)
    inj, drafter = module.drafter.injection, module.drafter
    assert torch.count_nonzero(inj.fusion.proj.weight) == 0
    embed = lambda x: drafter.embed(x, micro_target.embed_tokens.weight)  # noqa: E731
    anchor, t1 = torch.tensor([11, 12]), torch.tensor([21, 22])
    h_mtp = torch.randn(2, cfg.hidden_size)
    slots = inj.build_slots(embed, anchor, t1, h_mtp)
    plain = embed(torch.stack([anchor, t1] + [torch.full((2,), 3)] * 6, dim=1))
    assert torch.equal(slots, plain)
    # ...and so the drafter's outputs on [A, T1, MASK x6] are exactly the published drafter's.
    ctx = torch.randn(2, 10, drafter.config.context_dim)
    pos = torch.arange(10).expand(2, -1)
    qpos = torch.arange(10, 18).expand(2, -1)
    def run(model, x):
        kv = model.context_kv(model.project_context(ctx), pos)
        return model(x, qpos, kv, pos, torch.full((2, 8), 10), torch.zeros(2, 8, dtype=torch.long))
    assert torch.equal(run(drafter, slots), run(published, plain))


def test_blocks_never_see_context_at_or_after_their_anchor_nor_other_blocks(micro_target, micro_mtp):
    torch.manual_seed(0)
    inj = make_injection("dual_anchor_zero_init", micro_target.hidden_size, 2, 3, 8)
    torch.nn.init.normal_(inj.fusion.proj.weight, std=0.02)
    cfg = micro_target.config
    backbone = DFlashDrafter(DFlashConfig(hidden_size=cfg.hidden_size, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=cfg.num_attention_heads,
                                          num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
                                          vocab_size=cfg.vocab_size, num_target_layers=cfg.num_hidden_layers,
                                          target_layer_ids=[1, 2], mask_token_id=3))
    drafter = BlockDrafter(backbone, inj)
    ids = torch.randint(10, 400, (1, 40))
    feats = teacher_features(micro_target, micro_mtp, drafter, ids)
    anchors, keep = torch.tensor([[8, 20]]), torch.ones(1, 2, dtype=torch.bool)
    t1 = ids[:, [9, 21]]
    w = micro_target.embed_tokens.weight
    base = draft_blocks(drafter, w, feats, anchors, keep, t1).hidden
    feats.context[:, 20:] += 5.0           # context at/after block 1's anchor (and far after block 0's)
    moved = draft_blocks(drafter, w, feats, anchors, keep, t1).hidden
    assert torch.equal(base[:, 0], moved[:, 0]) and torch.equal(base[:, 1], moved[:, 1])
    feats.context[:, 19] += 5.0            # context just before block 1's anchor
    moved = draft_blocks(drafter, w, feats, anchors, keep, t1).hidden
    assert torch.equal(base[:, 0], moved[:, 0]) and not torch.allclose(base[:, 1], moved[:, 1])
    other = draft_blocks(drafter, w, feats, anchors, keep, torch.tensor([[t1[0, 0], 99]])).hidden
    assert torch.equal(other[:, 0], moved[:, 0])  # block 1's T1 is invisible to block 0


def test_anchor_sampling_respects_the_loss_mask():
    inj = make_injection("token_only", 16, 1, 3, 8)
    mask = torch.zeros(2, 30, dtype=torch.long)
    mask[0, 10:20] = 1
    valid = valid_anchors(inj, mask)
    # token_only predicts from a+2 on: anchors 8..17 have a supervised first prediction.
    assert valid[0].nonzero().flatten().tolist() == list(range(8, 18))
    anchors, keep = sample_anchors(valid, 4, torch.Generator().manual_seed(0))
    assert keep[0].all() and not keep[1].any()
    assert all(8 <= a < 18 for a in anchors[0].tolist())


def test_missing_resume_checkpoint_is_an_error(tmp_path):
    cfg = compose_train([f"ckpt_path={tmp_path / 'nothing.ckpt'}"], output_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        train(cfg)


def test_bad_inputs_fail_with_one_clear_line(tmp_path):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="injection"):
        compose_train(["injection=no_such_variant"])
    with pytest.raises(ValueError, match="unknown injection variant"):
        make_injection("no_such_variant", 16, 1, 3, 8)
    with pytest.raises(FileNotFoundError, match="not found"):
        build_components(compose_train(["target.path=/no/such/target"]))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    cfg = compose_train(["data=files", f"data.files=[{empty}]", "debug=tiny_budget"])
    _, _, data, _ = build_components(cfg)
    with pytest.raises(ValueError, match=f"training data file {empty} holds no records"):
        data.setup("fit")
    wide = DFlashDrafter(DFlashConfig(hidden_size=48, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=16, vocab_size=512, num_target_layers=4,
                                      target_layer_ids=[1, 2], mask_token_id=3))
    save_drafter(tmp_path / "wide", wide)
    with pytest.raises(ValueError, match="hidden size"):
        build_components(compose_train([f"init_from={tmp_path / 'wide'}"]))


def test_conversation_data_masks_only_assistant_replies(tmp_path, micro_target_dir):
    from dmtp.data.records import encode_record
    from dmtp.models.target import load_tokenizer

    tok = load_tokenizer(micro_target_dir)
    record = {"messages": [{"role": "user", "content": "What is 2 + 3?"},
                           {"role": "assistant", "content": "2 + 3 = 5."},
                           {"role": "user", "content": "And 4 + 4?"},
                           {"role": "assistant", "content": "8."}]}
    ids, mask = encode_record(tok, record)
    supervised = tok.decode([i for i, m in zip(ids, mask) if m])
    assert "2 + 3 = 5." in supervised and "8." in supervised
    assert "What is" not in supervised and "And 4" not in supervised and "user" not in supervised


@pytest.mark.slow
def test_ddp_two_cpu_processes(tmp_path):
    cmd = [sys.executable, "-m", "dmtp.train", "debug=tiny_budget", "logger=none", "callbacks=none",
           "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.max_steps=2",
           "model.val_walk=false", "data.max_examples=40", f"hydra.run.dir={tmp_path}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads((tmp_path / "train_metrics.json").read_text())["global_step"] == 2
