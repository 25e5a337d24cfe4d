"""Joint training (model.train_mtp): the frozen default is unchanged, a trained MTP changes and gets
the block loss's gradient, its tensors are saved beside the drafter under the checkpoint's own names
(strict round trip, the target checkpoint untouched), and decoding with it is lossless."""
import hashlib
import json

import lightning as L
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from dmtp.configs import compose_train
from dmtp.decode import build_proposer
from dmtp.families.decoding import spec_decoder
from dmtp.families.mtp_loading import MTPLoadError, load_native_mtp
from dmtp.inference.drafter_choice import load_drafter_for, mtp_for_drafter
from dmtp.training.components import build_components
from dmtp.training.job import train


class _Keep(L.Callback):
    def on_train_end(self, trainer, pl_module):
        self.module = pl_module


def _train(tmp_path, name, overrides):
    keep = _Keep()
    train(compose_train(["trainer.max_steps=2", *overrides], output_dir=tmp_path / name),
          callbacks=[keep])
    return keep.module, tmp_path / name / "drafter"


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_frozen_default_and_joint_training(tmp_path, micro_target_dir, micro_target):
    native = load_native_mtp(micro_target_dir, micro_target.embed_tokens, micro_target.lm_head).state_dict()
    weights = micro_target_dir / "mtp.safetensors"             # the target's own MTP, beside its model weights
    before = _digest(weights)

    frozen, frozen_dir = _train(tmp_path, "frozen", [])
    assert not frozen.train_mtp and "mtp." in frozen.checkpoint_excludes
    assert not any(p.requires_grad for p in frozen.mtp.parameters())
    assert all(torch.equal(v, native[k]) for k, v in frozen.mtp.state_dict().items())
    assert not (frozen_dir / "mtp.safetensors").exists()

    joint, joint_dir = _train(tmp_path, "joint", ["model.train_mtp=true"])
    assert "mtp." not in joint.checkpoint_excludes          # Lightning checkpoints keep the trained MTP
    changed = [k for k, v in joint.mtp.state_dict().items() if not torch.equal(v, native[k])]
    assert "fc.weight" in changed and len(changed) > len(native) // 2
    assert _digest(weights) == before                       # the target checkpoint is never modified

    # mtp.safetensors: the checkpoint's own names, every MTP tensor, and it loads back exactly.
    tuned = joint_dir / "mtp.safetensors"
    with safe_open(str(weights), "pt") as f:
        checkpoint_keys = {k for k in f.keys() if k.startswith("mtp.")}
    saved = load_file(str(tuned))
    assert set(saved) == checkpoint_keys
    reloaded = load_native_mtp(micro_target_dir, micro_target.embed_tokens, micro_target.lm_head, tuned=tuned)
    assert all(torch.equal(v, joint.mtp.state_dict()[k]) for k, v in reloaded.state_dict().items())
    broken = tmp_path / "broken.safetensors"
    save_file({k: v for k, v in saved.items() if k != "mtp.fc.weight"}, str(broken))
    with pytest.raises(MTPLoadError, match="missing tensor mtp.fc.weight"):
        load_native_mtp(micro_target_dir, micro_target.embed_tokens, micro_target.lm_head, tuned=broken)
    save_file({**saved, "mtp.extra.weight": saved["mtp.norm.weight"].clone()}, str(broken))
    with pytest.raises(MTPLoadError, match="mtp.extra.weight, which is not one of"):
        load_native_mtp(micro_target_dir, micro_target.embed_tokens, micro_target.lm_head, tuned=broken)

    # Decoding picks the tuned MTP up from the drafter's directory and stays lossless.
    drafter, _ = load_drafter_for(micro_target, joint_dir, torch.float32, "cpu")
    mtp = mtp_for_drafter(micro_target, micro_target_dir, joint_dir, load_native_mtp(
        micro_target_dir, micro_target.embed_tokens, micro_target.lm_head))
    assert torch.equal(mtp.fc.weight, joint.mtp.fc.weight)
    prompts = [[5 + i, 40 + 3 * i, 77, 12 + i, 9, 31] for i in range(3)]
    ar = spec_decoder(micro_target, build_proposer("ar", micro_target), eos_token_id=[]).generate(prompts, 24)
    res = spec_decoder(micro_target, build_proposer("drafter", micro_target, mtp=mtp, drafter=drafter),
                      eos_token_id=[]).generate(prompts, max_new_tokens=24, batch_size=2)
    assert res.tokens == ar.tokens


@pytest.mark.parametrize("name", ["dual_anchor_zero_init", "multi_mtp_zero_init"])
def test_the_block_loss_reaches_a_trained_mtp(name):
    """With train_mtp the MTP hiddens carry the drafter's gradient (mtp_loss_weight=0 isolates it; the
    zero-init fusion is perturbed, else its W = 0 passes nothing back); frozen, the MTP gets none."""
    grads = {}
    for joint in (False, True):
        torch.manual_seed(0)
        _, _, _, module = build_components(compose_train([f"injection={name}", f"model.train_mtp={joint}",
                                                          "model.mtp_loss_weight=0"]))
        torch.nn.init.normal_(module.drafter.injection.fusion.proj.weight, std=0.1)
        ids = torch.randint(10, 400, (2, 48))
        loss, _, _ = module.block_loss(ids, torch.ones_like(ids), generator=torch.Generator().manual_seed(0))
        loss.backward()
        grads[joint] = module.mtp.fc.weight.grad
    assert grads[False] is None
    assert grads[True] is not None and grads[True].abs().sum() > 0


def test_bad_joint_training_values_are_one_line_errors():
    with pytest.raises(ValueError, match="mtp_loss_weight must be a number >= 0"):
        build_components(compose_train(["model.train_mtp=true", "model.mtp_loss_weight=-1"]))
    with pytest.raises(ValueError, match="does not use the MTP"):
        build_components(compose_train(["injection=raw_dflash", "model.train_mtp=true"]))


def test_deepseek_layout_multi_step_joint_training_round_trip(tmp_path, micro_target_dir):
    """A DeepSeek-V3 layout (MLA MTP block, `model.layers.{L}.*` names): the multi-step chain trains
    through the block's latent cache, the tuned MTP is saved under the checkpoint's own names, loads
    back exactly and decodes losslessly with adaptive m."""
    from tests.test_real_targets import _train_overrides, write_deepseek_family

    root = write_deepseek_family(tmp_path / "deepseek_v3", micro_target_dir, "deepseek_v3")
    keep = _Keep()
    train(compose_train(_train_overrides(root) + ["injection=multi_mtp_zero_init", "model.train_mtp=true"],
                        output_dir=tmp_path / "train"), callbacks=[keep])
    target = keep.module.target
    tuned = tmp_path / "train" / "drafter" / "mtp.safetensors"
    layer = json.loads((root / "config.json").read_text())["num_hidden_layers"]
    assert all(k.startswith(f"model.layers.{layer}.") for k in load_file(str(tuned)))
    reloaded = load_native_mtp(root, target.embed_tokens, target.lm_head, tuned=tuned)
    assert all(torch.equal(v, keep.module.mtp.state_dict()[k]) for k, v in reloaded.state_dict().items())
    drafter, _ = load_drafter_for(target, tmp_path / "train" / "drafter", torch.float32, "cpu",
                                  options={"mtp_threshold": 0.3})
    prompts = [[5 + i, 40 + 3 * i, 77, 12 + i, 9, 31] for i in range(2)]
    ar = spec_decoder(target, build_proposer("ar", target), eos_token_id=[]).generate(prompts, 12)
    res = spec_decoder(target, build_proposer("drafter", target, mtp=reloaded, drafter=drafter),
                      eos_token_id=[]).generate(prompts, max_new_tokens=12, batch_size=2)
    assert res.tokens == ar.tokens
