"""The MTP correction (drafter.mtp_correction_rank; dmtp.models.mtp_correction): zero-init (the native MTP's
proposals exactly at step 0), trained on the target's outputs with the drafter while the MTP stays frozen, saved and
loaded strictly with the drafter, used for T1 (and the chain) in the walk, the reference round and the loop, and
lossless."""
import json

import lightning as L
import pytest
import torch
from safetensors.torch import load_file, save_file

from dmtp.configs import compose_train
from dmtp.decode import build_proposer
from dmtp.families.decoding import spec_decoder
from dmtp.decode.reference import reference_generate, reference_proposal
from dmtp.drafters.block_drafter import CORRECTION_PREFIX, BlockDrafter, fresh_drafter_for, load_block_drafter
from dmtp.models.mtp_correction import MTPCorrection, ProposingMTP
from dmtp.training.job import train
from dmtp.training.validation import candidate_matches

PROMPTS = [[5 + i, 40 + 3 * i, 77, 12 + i, 9, 31] for i in range(3)]


class _Keep(L.Callback):
    def on_train_end(self, trainer, pl_module):
        self.module = pl_module


def _perturbed(drafter, scale=0.3):
    torch.manual_seed(1)
    with torch.no_grad():
        for p in drafter.mtp_correction.parameters():
            p.add_(scale * torch.randn_like(p))
    return drafter


def test_zero_init_is_the_native_mtp(micro_target, micro_mtp):
    drafter = fresh_drafter_for(micro_target, "dual_anchor_zero_init", 1, mtp_correction_rank=4)
    g = torch.randn(2, 3, micro_mtp.spec.hidden_size)
    proposing = drafter.proposing_mtp(micro_mtp)
    assert isinstance(proposing, ProposingMTP) and proposing.spec is micro_mtp.spec
    assert torch.equal(proposing.logits(g), micro_mtp.logits(g))
    _perturbed(drafter)
    assert not torch.allclose(proposing.logits(g), micro_mtp.logits(g))
    assert drafter.proposing_mtp(proposing) is proposing          # never wrapped twice
    plain = fresh_drafter_for(micro_target, "dual_anchor_zero_init", 1)
    assert plain.mtp_correction_rank == 0 and plain.proposing_mtp(micro_mtp) is micro_mtp
    assert not any(k.startswith("mtp_correction") for k in plain.state_dict())


def test_rank_refused_without_an_mtp_token_and_out_of_range(micro_target):
    # The configured rank applies to the variants whose MTP proposes (conf/drafter's default is 128 for all):
    # raw DFlash builds without one; a BlockDrafter asked for one by hand is refused.
    raw = fresh_drafter_for(micro_target, "raw_dflash", 1, mtp_correction_rank=4)
    assert raw.mtp_correction_rank == 0
    with pytest.raises(ValueError, match="injection raw_dflash proposes no MTP token"):
        BlockDrafter(raw.backbone, raw.injection, mtp_correction_rank=4)
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="mtp_correction_rank must be an integer >= 0"):
            fresh_drafter_for(micro_target, "dual_anchor_zero_init", 1, mtp_correction_rank=bad)
    with pytest.raises(ValueError, match="rank >= 1"):
        MTPCorrection(8, 0)


def test_saved_and_loaded_strictly(micro_target, tmp_path):
    drafter = _perturbed(fresh_drafter_for(micro_target, "dual_anchor_zero_init", 1, mtp_correction_rank=4))
    drafter.save(tmp_path / "d")
    meta = json.loads((tmp_path / "d" / "config.json").read_text())["dmtp"]
    assert meta["mtp_correction_rank"] == 4
    tensors = load_file(str(tmp_path / "d" / "model.safetensors"))
    assert {k for k in tensors if k.startswith(CORRECTION_PREFIX)} == {
        CORRECTION_PREFIX + k for k in drafter.mtp_correction.state_dict()}
    loaded, _ = load_block_drafter(tmp_path / "d")
    for k, v in drafter.mtp_correction.state_dict().items():
        assert torch.equal(loaded.mtp_correction.state_dict()[k], v)

    weights = tmp_path / "d" / "model.safetensors"
    save_file({k: v for k, v in tensors.items() if k != CORRECTION_PREFIX + "up.weight"}, str(weights))
    with pytest.raises(ValueError, match=f"missing tensor {CORRECTION_PREFIX}up.weight of an MTP correction of rank 4"):
        load_block_drafter(tmp_path / "d")
    save_file({**tensors, CORRECTION_PREFIX + "up.weight": torch.zeros(3, 3)}, str(weights))
    with pytest.raises(ValueError, match="has shape \\(3, 3\\), an MTP correction of rank 4 expects"):
        load_block_drafter(tmp_path / "d")
    save_file(tensors, str(weights))
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    cfg["dmtp"].pop("mtp_correction_rank")
    (tmp_path / "d" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="names no mtp_correction_rank"):
        load_block_drafter(tmp_path / "d")


@pytest.mark.parametrize("variant", ["dual_anchor_zero_init", "multi_mtp_zero_init"])
def test_decoding_with_a_correction_is_lossless_and_the_reference_round(variant, micro_target, micro_mtp):
    drafter = _perturbed(fresh_drafter_for(micro_target, variant, 1, perturb=0.05, mtp_correction_rank=4), 1.0)
    ar = spec_decoder(micro_target, build_proposer("ar", micro_target), eos_token_id=[]).generate(PROMPTS, 20)
    proposer = build_proposer("drafter", micro_target, mtp=micro_mtp, drafter=drafter)
    assert isinstance(proposer.mtp_state.mtp, ProposingMTP)
    res = spec_decoder(micro_target, proposer, eos_token_id=[]).generate(PROMPTS, max_new_tokens=20, batch_size=2)
    assert res.tokens == ar.tokens
    # The fast loop's rounds are the reference round's, which proposes T1 through the same correction.
    tokens, accepted = reference_generate(micro_target, reference_proposal(proposer), PROMPTS[0], 20)
    assert tokens == res.tokens[0] and accepted == res.accepted[0]


def test_the_walk_and_t1_read_the_corrected_mtp(micro_target, micro_mtp):
    drafter = _perturbed(fresh_drafter_for(micro_target, "dual_anchor_zero_init", 1, mtp_correction_rank=4), 3.0)
    ids = torch.tensor([PROMPTS[0] * 4])
    corrected = candidate_matches(micro_target, micro_mtp, drafter, ids)
    torch.nn.init.zeros_(drafter.mtp_correction.up.weight)         # back to the native MTP
    native = candidate_matches(micro_target, micro_mtp, drafter, ids)
    assert not torch.equal(corrected, native)


def test_training_moves_the_correction_and_nothing_frozen(tmp_path, micro_target_dir, micro_target):
    keep = _Keep()
    train(compose_train(["trainer.max_steps=3", "drafter.mtp_correction_rank=4", "model.label_source=target_kl",
                         "model.label_temperature=0.7"], output_dir=tmp_path / "run"), callbacks=[keep])
    module = keep.module
    assert module.drafter.mtp_correction.up.weight.abs().sum() > 0            # it trained (it starts at 0)
    assert not any(p.requires_grad for p in module.mtp.parameters())         # the MTP stays frozen
    loaded, meta = load_block_drafter(tmp_path / "run" / "drafter")
    assert meta["mtp_correction_rank"] == 4
    assert torch.equal(loaded.mtp_correction.up.weight, module.drafter.mtp_correction.up.weight.detach().cpu())


def test_label_temperature_is_checked():
    from dmtp.training.module_options import Objective

    assert Objective(label_temperature=0.6).label_temperature == 0.6
    for bad in (0, -1, "hot", True):
        with pytest.raises(ValueError, match="label_temperature must be a number > 0"):
            Objective(label_temperature=bad)


def test_a_multi_step_drafter_trains_its_correction_on_the_chains_later_steps_too(tmp_path, micro_target_dir):
    keep = _Keep()
    train(compose_train(["trainer.max_steps=2", "injection=multi_mtp_zero_init", "drafter.mtp_correction_rank=4"],
                        output_dir=tmp_path / "run"), callbacks=[keep])
    module = keep.module
    ids = torch.randint(5, 400, (2, 40))
    mask = torch.ones_like(ids)
    module.block_loss(ids, mask, generator=torch.Generator().manual_seed(0))
    chain_part = module.last_correction_loss
    # The chain's steps 2..M count: the same batch without them (M = 1 in the loss) gives another loss.
    module.chain_correction_loss = lambda *a, **k: torch.zeros(())
    module.block_loss(ids, mask, generator=torch.Generator().manual_seed(0))
    assert not torch.isclose(chain_part, 2 * module.last_correction_loss)
    assert not torch.isclose(chain_part, module.last_correction_loss)


def test_a_drafter_whose_mtp_fills_the_block_decodes_as_its_corrected_chain(micro_target, micro_mtp):
    """m = K (the sampled production method's default): every candidate is the MTP's, so decoding runs the corrected
    MTP chain alone, with the tokens and per-round acceptance of the drafter's own round (greedy), and stays lossless
    sampled; an adaptive m keeps the drafter."""
    from dmtp.decode.proposers import DrafterProposer, MTPChainProposer

    drafter = _perturbed(fresh_drafter_for(micro_target, "multi_mtp_zero_init", 1, perturb=0.05,
                                           mtp_correction_rank=4, max_mtp_tokens=7), 1.0)
    assert drafter.injection.mtp_fills_block
    fast = build_proposer("drafter", micro_target, mtp=micro_mtp, drafter=drafter)
    assert isinstance(fast, MTPChainProposer) and isinstance(fast.mtp_state.mtp, ProposingMTP)
    full = DrafterProposer(drafter, micro_target.embed_tokens.weight, micro_target.lm_head.weight, mtp=micro_mtp)
    a = spec_decoder(micro_target, fast, eos_token_id=[]).generate(PROMPTS, max_new_tokens=20, batch_size=2)
    b = spec_decoder(micro_target, full, eos_token_id=[]).generate(PROMPTS, max_new_tokens=20, batch_size=2)
    ar = spec_decoder(micro_target, build_proposer("ar", micro_target), eos_token_id=[]).generate(PROMPTS, 20)
    assert a.tokens == b.tokens == ar.tokens and a.accepted == b.accepted
    adaptive = fresh_drafter_for(micro_target, "multi_mtp_zero_init", 1, max_mtp_tokens=7, mtp_threshold=0.5)
    assert not adaptive.injection.mtp_fills_block
    assert isinstance(build_proposer("drafter", micro_target, mtp=micro_mtp, drafter=adaptive), DrafterProposer)
    one = fresh_drafter_for(micro_target, "dual_anchor_zero_init", 1)
    assert not one.injection.mtp_fills_block


def test_a_correction_trained_on_greedy_tokens_stays_out_of_sampled_decoding(tmp_path, micro_target, micro_mtp):
    """Hard labels and CE make the correction sharpen the MTP toward the target's argmax: greedy decoding proposes
    through it, sampled decoding with the native MTP (its overlap with the target's distribution is the native's),
    and the flag travels with the export; a KL-trained correction serves both modes."""
    from dmtp.decode import SamplingConfig
    from dmtp.inference.drafter_choice import greedy_correction_note

    drafter = _perturbed(fresh_drafter_for(micro_target, "dual_anchor_zero_init", 1, mtp_correction_rank=4), 1.0)
    drafter.mtp_correction.greedy_only = True
    assert isinstance(drafter.proposing_mtp(micro_mtp), ProposingMTP)
    assert drafter.proposing_mtp(micro_mtp, greedy=False) is micro_mtp
    proposer = build_proposer("drafter", micro_target, mtp=micro_mtp, drafter=drafter)
    decoder = spec_decoder(micro_target, proposer, eos_token_id=[])
    decoder.generate(PROMPTS, max_new_tokens=8, sampling=SamplingConfig(temperature=1.0, verification="rejection"))
    assert proposer.mtp_state.mtp is micro_mtp
    decoder.generate(PROMPTS, max_new_tokens=8)
    assert isinstance(proposer.mtp_state.mtp, ProposingMTP)
    assert "native MTP" in greedy_correction_note(drafter, "d")
    drafter.save(tmp_path / "d")
    loaded, meta = load_block_drafter(tmp_path / "d")
    assert meta["mtp_correction_greedy_only"] is True and loaded.mtp_correction.greedy_only
    drafter.mtp_correction.greedy_only = False
    assert isinstance(drafter.proposing_mtp(micro_mtp, greedy=False), ProposingMTP)
    assert greedy_correction_note(drafter, "d") is None


@pytest.mark.parametrize("overrides,greedy_only", [([], True), (["model.label_source=target_kl"], False),
                                                   (["model.loss=dspark"], False)])
def test_training_marks_a_greedy_only_correction(overrides, greedy_only, micro_target, micro_mtp):
    from hydra.utils import instantiate

    cfg = compose_train(["drafter.mtp_correction_rank=4", "recipe=greedy", *overrides])
    drafter = fresh_drafter_for(micro_target, "dual_anchor_zero_init", 1, mtp_correction_rank=4)
    instantiate(cfg.model)(target=micro_target, mtp=micro_mtp, drafter=drafter)
    assert drafter.mtp_correction.greedy_only is greedy_only
