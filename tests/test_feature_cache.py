"""The offline feature cache (dmtp.datagen.feature_cache, `data.features=true`): training from it, the target's
decoder never loaded, gives the online run's losses and export (exactly in fp32; to bf16's rounding in bf16), for
DMTP and raw DFlash; the codecs' round trips; the labels' reconstruction; damaged, missing or insufficient caches
are one line; W capture workers write the bytes of one; the storage bill refuses a disk too small."""
from __future__ import annotations

import lightning as L
import pytest
import torch
from safetensors.torch import load_file

from dmtp.configs import compose_config, compose_train
from dmtp.models.target_head import TargetHead
from dmtp.datagen import feature_cache as fc
from dmtp.training import prepare as prep
from dmtp.training.cached_features import teacher_logits
from dmtp.datagen.feature_codecs import decode, encode, fit_basis, vector_bytes
from dmtp.datagen.feature_spec import FeatureSpec, deepspec_token_bytes
from dmtp.training.components import build_components
from dmtp.training.job import train
from dmtp.datagen.shards import Share

# The greedy recipe's rows (CE on greedy labels: what a cache holds with its default feature options)
ROWS = ["data=regenerated", "data.regen_sequences=16", "trainer.precision=32-true", "data.feature_shard_rows=8",
        "recipe=greedy"]
DMTP = ["injection=dual_anchor_zero_init"]


class Losses(L.Callback):
    def __init__(self):
        self.losses = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))


def _train(options, out):
    losses = Losses()
    train(compose_train(options, output_dir=out), callbacks=[losses])
    return losses.losses, load_file(out / "drafter" / "model.safetensors")


def _capture(options, out):
    return prep.prepare(compose_config("prepare", ["step=capture", "debug=tiny_budget", "logger=none",
                                                   "callbacks=none", "data.max_examples=40", *options], output_dir=out))


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DMTP_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.mark.parametrize("injection", ["dual_anchor_zero_init", "raw_dflash"])
def test_training_from_the_cache_is_the_online_run(injection, home, tmp_path, micro_target_dir):
    options = ROWS + [f"injection={injection}", f"target.path={micro_target_dir}"]
    online, online_export = _train(options, tmp_path / "online")
    for codec in ("fp32", "bf16"):
        cached = options + ["data.features=true", f"data.feature_codec={codec}"]
        _capture(cached, tmp_path / f"capture-{codec}")
        losses, export = _train(cached, tmp_path / codec)
        if codec == "fp32":   # the same features, labels and draws: the same run to the bit
            assert losses == online and all(torch.equal(export[k], online_export[k]) for k in online_export)
        else:                 # bf16 features (8 significant bits): measured 8e-4 and 6e-3 at 4 steps
            assert max(abs(a - b) / abs(b) for a, b in zip(losses, online)) < 3e-3
            assert max((export[k] - online_export[k]).abs().max().item() for k in online_export) < 2e-2
            assert losses != online


def test_the_trainer_from_the_cache_loads_only_the_embedding_and_head(home, tmp_path, micro_target_dir):
    options = ROWS + DMTP + [f"target.path={micro_target_dir}", "data.features=true"]
    for missing, step in ((r"the regeneration cache .* has no verified shard-00000.safetensors and the target's "
                           r"decoder is not loaded here: write it first with python -m dmtp.prepare step=regen",
                           "regen"),
                          (r"has no shard yet: capture it first: python -m dmtp.prepare step=capture", "capture")):
        with pytest.raises(FileNotFoundError, match=missing):
            target, _, data, _ = build_components(compose_train(options))
            data.setup()
        prep.prepare(compose_config("prepare", [f"step={step}", "debug=tiny_budget", "logger=none", "callbacks=none",
                                                "data.max_examples=40", *options], output_dir=tmp_path / step))
    target, _, data, module = build_components(compose_train(options))
    data.setup()
    assert isinstance(target, TargetHead) and target.decoder_layers() == []
    with pytest.raises(ValueError, match="the target's decoder is not loaded"):
        target(torch.zeros(1, 4, dtype=torch.long))
    batch = next(iter(data.train_dataloader()))
    assert set(batch["features"]) == {"taps", "mtp_hidden", "greedy"}
    assert batch["features"]["taps"].shape[:2] == batch["input_ids"].shape


@pytest.mark.parametrize("options,match", [
    (["injection=multi_mtp_zero_init"], "data.feature_last_hidden=true"),
    (["model.label_source=target_kl"], "data.feature_labels=topk"),
    (["model.loss=tv"], "data.feature_labels=topk"),
    (["data.feature_mtp_hidden=false"], "data.feature_mtp_hidden=true"),
    (["data.feature_labels=none"], "data.feature_labels=greedy"),
    (["decode_eval.enabled=true"], "never loads"),
    (["data.feature_codec=lowrank"], "needs a rank >= 1"),
    (["data.feature_codec=int3"], "data.feature_codec must be one of"),
])
def test_a_cache_that_would_not_hold_what_the_run_reads_is_one_line(options, match, micro_target_dir):
    from dmtp.training.job import check_decode_eval_fits

    dmtp = [] if any(o.startswith("injection=") for o in options) else DMTP
    cfg = compose_train(ROWS + dmtp + [f"target.path={micro_target_dir}", "data.features=true", *options])
    with pytest.raises(ValueError, match=match) as err:
        check_decode_eval_fits(cfg)
        build_components(cfg)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("options,match", [
    (["injection=multi_mtp_zero_init"], "data.feature_last_hidden=true"),
    (["model.label_source=target_kl"], "data.feature_labels=topk"),
    (["data.feature_labels=none"], "data.feature_labels=greedy"),
    (["experiment=sampled"], "data.feature_last_hidden=true .*; data.feature_labels=topk"),
])
def test_the_capture_refuses_what_its_run_would_refuse_before_writing_anything(options, match, home, tmp_path,
                                                                               micro_target_dir):
    """A capture costs GPU-hours at scale: the options its training run would refuse (the one rule,
    dmtp.training.components.require_serves) are refused before any row is regenerated or captured (issue 65)."""
    rows = ["data.regen_sequences=16"] if options == ["experiment=sampled"] else \
        ROWS + ([] if options[0].startswith("injection=") else DMTP)
    with pytest.raises(ValueError, match=match) as err:
        _capture(rows + [f"target.path={micro_target_dir}", "data.features=true", *options], tmp_path / "capture")
    assert "\n" not in str(err.value) and str(err.value).startswith("the feature cache of this run would not hold")
    assert not [p for p in (home / "cache").rglob("*") if p.is_file()]   # no regeneration, no feature shard


def test_a_recapture_bills_a_damaged_shard_before_capturing_it_again(home, tmp_path, micro_target_dir, capsys):
    """The bill said "0 B to write" and the capture then rewrote the damaged shard (issue 65): the shards already
    there are read whole for the bill (and not again by the capture), a damaged one named and counted."""
    options = ROWS + DMTP + [f"target.path={micro_target_dir}"]
    first = _capture(options, tmp_path / "first")["capture"][0]
    shard = first.cache / "shard-00001.safetensors"
    good = shard.read_bytes()
    shard.write_bytes(good[:-7] + bytes(b ^ 0xFF for b in good[-7:]))   # the last row's bytes
    capsys.readouterr()
    again = _capture(options, tmp_path / "again")["capture"][0]
    out = capsys.readouterr().out
    damaged = out.index(f"[dmtp] feature cache: {shard} is damaged (")
    bill = out.index("[dmtp] feature cache of the training rows: 16 rows, 1024 tokens x 265 B/token")
    assert damaged < bill and "all shards: 135.7 KB to write" in out[bill:].splitlines()[0]
    assert again.captured == [1] and shard.read_bytes() == good and out.count("is damaged") == 1


def test_two_capture_workers_write_the_bytes_of_one_and_a_damaged_row_is_named(micro_target, micro_mtp, tmp_path,
                                                                               capsys):
    gen = torch.Generator().manual_seed(1)
    rows = [{"input_ids": torch.randint(1, 500, (12,), generator=gen).tolist(), "loss_mask": [0] * 4 + [1] * 8}
            for _ in range(10)]
    spec = FeatureSpec((1, 2), codec="fp8", labels="topk", top_k=5, last_hidden=True)
    one = fc.capture(micro_target, micro_mtp, rows, spec, shard_rows=3, cache_root=tmp_path / "one", progress=False)
    parts = [fc.capture(micro_target, micro_mtp, rows, spec, Share(2, i), shard_rows=3, cache_root=tmp_path / "two",
                        progress=False) for i in range(2)]
    assert one.captured == [0, 1, 2, 3] and [p.captured for p in parts] == [[0, 2], [1, 3]]
    for index in range(4):
        name = f"shard-{index:05d}.safetensors"
        assert (one.cache / name).read_bytes() == (parts[0].cache / name).read_bytes()

    cache = fc.FeatureCache(micro_target, rows, spec, 3, cache_root=tmp_path / "one")
    row = cache[4]
    out = micro_target(torch.tensor([rows[4]["input_ids"]]), layer_ids=[1, 2])
    assert torch.allclose(row["taps"], out.layer_hidden[0], rtol=0.07, atol=1e-3)     # e4m3: 3 mantissa bits
    assert torch.equal(row["greedy"], out.logits[0].argmax(-1))
    assert fc.verify_cache(micro_target, rows, spec, 3, cache_root=tmp_path / "one")["rows"] == 10

    shard = one.cache / "shard-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-7] ^= 0xFF                                                   # a byte of the last row's tensors
    shard.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"shard-00001.safetensors is damaged \(.* row 2 does not match its "
                                         r"recorded sha256\): capture it again"):
        fc.FeatureCache(micro_target, rows, spec, 3, cache_root=tmp_path / "one")[5]
    with pytest.raises(ValueError, match=r"lacks shard 1 \(worker 1 of 2\)"):
        fc.verify_cache(micro_target, rows, spec, 3, cache_root=tmp_path / "one", workers=2)
    capsys.readouterr()
    again = fc.capture(micro_target, micro_mtp, rows, spec, shard_rows=3, cache_root=tmp_path / "one", progress=False)
    assert again.captured == [1] and "shard-00001.safetensors is damaged" in capsys.readouterr().out
    assert shard.read_bytes() == (parts[0].cache / shard.name).read_bytes()


def test_the_storage_bill_refuses_a_disk_too_small_before_capturing(home, tmp_path, micro_target_dir, monkeypatch,
                                                                    capsys):
    class Usage:
        free = 10_000

    monkeypatch.setattr(prep.shutil, "disk_usage", lambda path: Usage)
    with pytest.raises(ValueError, match=r"needs .* more at .*, but only 10.0 KB is free"):
        _capture(ROWS + DMTP + [f"target.path={micro_target_dir}"], tmp_path / "capture")
    assert "feature cache of the training rows: 16 rows, 1024 tokens x 265 B/token" in capsys.readouterr().out
    assert not list((home / "cache").glob("features-*/shard-*"))


def test_codecs_round_trip_within_their_precision():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(50, 3, 16, generator=gen) * torch.tensor([0.1, 1.0, 30.0])[:, None]   # taps of unequal scale
    for codec, tol in (("fp32", 0.0), ("bf16", 2 ** -8), ("fp16", 2 ** -11), ("fp8", 2 ** -3)):
        back = decode(encode(x, codec), codec).view_as(x)
        # relative rounding of the format, plus e4m3's subnormals (below 2^-6 of the scaled range)
        assert ((back - x).abs() <= tol * x.abs() + 1e-5 * x.abs().amax(-1, keepdim=True)).all(), codec
    low = torch.randn(200, 4, generator=gen) @ torch.randn(4, 48, generator=gen)           # rank 4 in 48 dims
    basis = fit_basis(low.view(200, 3, 16), 4)
    eye = basis["components"].T @ basis["components"]
    assert torch.allclose(eye, torch.eye(4), atol=1e-5)
    back = decode(encode(low.view(200, 3, 16), "lowrank", basis), "lowrank", basis)
    # exact up to the fp8 coefficients: |error| <= 2^-4 |coefficients| <= 2^-4 |x - mean| (orthonormal basis)
    centred = (low - basis["mean"]).norm(dim=-1)
    assert ((back - low).norm(dim=-1) <= 2 ** -4 * centred + 1e-4).all()
    assert (decode(encode(low.view(200, 3, 16), "lowrank", fit_basis(low.view(200, 3, 16), 2)), "lowrank",
                   fit_basis(low.view(200, 3, 16), 2)) - low).norm() > 0.1 * low.norm()   # rank 2 loses a part
    assert vector_bytes("lowrank", 5, 4096, 2560) == 2564 and vector_bytes("fp8", 5, 4096) == 5 * 4100


def test_top_k_labels_keep_the_distribution_and_the_argmax():
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 5, 40, generator=gen) * 3
    probs = logits.softmax(-1)
    top, ids = probs.topk(8, -1)
    cached = {"greedy": logits.argmax(-1), "topk_ids": ids, "topk_probs": top.half().float(),
              "tail": 1 - top.sum(-1)}
    rebuilt = teacher_logits(cached, 40)
    assert torch.equal(rebuilt.argmax(-1), logits.argmax(-1))
    q = rebuilt.softmax(-1)
    assert torch.allclose(q.gather(-1, ids), top, atol=2e-3)
    assert torch.allclose(q.sum(-1), torch.ones(2, 5))
    tie = {"greedy": torch.tensor([[3]]), "topk_ids": torch.tensor([[[1, 3]]]), "topk_probs": torch.tensor([[[.5, .5]]]),
           "tail": torch.tensor([[0.0]])}
    assert teacher_logits(tie, 6).argmax(-1).item() == 3        # an fp16 tie keeps the stored argmax


def test_bytes_per_token_at_real_shapes():
    """The arithmetic BENCHMARKS.md states (Qwen3-8B: hidden 4096, 5 taps; DeepSpec: 5 layers + last hidden, bf16)."""
    bf16 = FeatureSpec(tuple(range(5)), codec="bf16").token_bytes(4096)
    assert deepspec_token_bytes(4096) == 49152 and bf16["taps"] == 40960 and bf16["total"] == 40960 + 8192 + 9
    low = FeatureSpec(tuple(range(5)), codec="lowrank", rank=2560, mtp_rank=512).token_bytes(4096)
    assert low["total"] == 2564 + 516 + 9 and low["total"] * 10 <= deepspec_token_bytes(4096)
    # README's row measured without loss on the tiny target (taps 36 of 320 = 11.25%, MTP 40 of 64 = 62.5%):
    # Qwen3-8B 4,881 and Qwen3.6-27B 6,097 bytes per token, each under a tenth of DeepSpec's
    for hidden, total in [(4096, 4881), (5120, 6097)]:
        spec = FeatureSpec(tuple(range(5)), codec="lowrank", rank=round(0.1125 * 5 * hidden),
                           mtp_rank=round(0.625 * hidden))
        assert spec.token_bytes(hidden)["total"] == total and total * 10 <= deepspec_token_bytes(hidden)


def test_the_lowrank_basis_is_fitted_on_rows_spread_over_the_cache():
    """Rows come domain by domain: a basis fitted on the first rows saw one domain only (it cost the math rows' tau)."""
    assert fc.fit_rows(10, 4) == [0, 3, 6, 9] and fc.fit_rows(5, 9) == [0, 1, 2, 3, 4]
    assert fc.fit_rows(4800, 102)[-1] == 4799 and len(fc.fit_rows(4800, 102)) == 102
