"""The benchmark command runs end to end on the micro target, and --reps reports medians of interleaved
repetitions (acceptance unchanged: every repetition is seeded alike)."""
import importlib.util
import json
from pathlib import Path

import pytest

from dmtp.bench import random_drafters

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def tool(name: str):
    """A script of tools/ as a module, loaded from its file (the scripts are not a package)."""
    [path] = TOOLS.rglob(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"tools_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench_decode = tool("bench_decode")


def test_bench_decode_reps_are_medians(tmp_path, micro_target_dir):
    out = tmp_path / "bench.json"
    report = bench_decode.main(["--target", str(micro_target_dir), "--random-drafters", "dual_anchor_zero_init",
                                "--domains", "code,math", "--num-prompts", "1", "--prompt-tokens", "16", "--max-new-tokens", "6",
                                "--batch-size", "2", "--reps", "3", "--no-hf", "--threads", "1",
                                "--throughput-batch-sizes", "1", "--out", str(out)])
    saved = json.loads(out.read_text())
    methods = saved["methods"]
    assert set(methods) >= {"ar", "mtp415"} and any(m.startswith("dual_anchor_zero_init") for m in methods)
    for summary in methods.values():
        reps = summary["tok_s_reps"]
        assert len(reps) == 3
        assert sorted(reps)[1] == round(summary["tokens_per_s"], 1)
    for per_method in saved["workloads"].values():
        assert all(len(s["tok_s_reps"]) == 3 for s in per_method.values())
    assert report["methods"]["ar"]["tau_per_request"] == 1.0
    # fp32 greedy: every method's outputs are ar's, counted per request in the report
    assert saved["requests"] == 2
    assert saved["identical_to_ar"] == {m: 2 for m in methods if m != "ar"}


def test_bench_decode_rejects_zero_reps(capsys):
    import pytest

    with pytest.raises(SystemExit) as e:
        bench_decode.main(["--reps", "0"])
    assert e.value.code == 2
    assert "--reps must be at least 1" in capsys.readouterr().err


def test_bench_threads_times_a_training_step_of_a_preset():
    bench_threads = tool("bench_threads")

    result = bench_threads.child("micro", seconds=0.2)
    assert result["steps"] >= 1 and result["steps_per_s"] > 0 and result["threads"] >= 1


def test_bench_peer_runs_with_an_untrained_drafter(tmp_path, micro_target_dir):
    """--random-drafter: the reference loop and ours decode with one untrained raw DFlash drafter written
    for the target (a bare GPU machine has no trained one), greedy tokens identical."""
    import pytest

    pytest.importorskip("dflash.model")
    bench_peer = tool("bench_peer")

    report = bench_peer.main(["--target", str(micro_target_dir), "--random-drafter", "--domains", "code",
                              "--num-prompts", "2", "--prompt-tokens", "16", "--max-new-tokens", "6", "--reps", "1",
                              "--temperature", "0", "--hf-batch-sizes", "--threads", "1"])
    assert Path(report["drafter"]).name.startswith("bench_peer_drafter_")
    greedy = report["peer"]["0.0"]
    assert greedy["dmtp"]["identical"] == greedy["dmtp"]["requests"] == 2
    assert report["ar"] == {}


def test_repeated_drafters_merge_eager_with_eager_and_compiled_with_compiled():
    """A repeat's label `name#n` (compiled: `name#n compiled`) merges into `name` / `name compiled`, never
    mixing the eager and compiled timings of one method."""
    assert [bench_decode.method_of(label) for label in
            ("raw_dflash", "raw_dflash#4", "raw_dflash compiled", "raw_dflash#10 compiled")] == [
        "raw_dflash", "raw_dflash", "raw_dflash compiled", "raw_dflash compiled"]


def test_random_drafters_take_a_published_size(tmp_path, micro_target_dir):
    """--random-drafter-preset dflash-qwen3-8b sizes random drafters like the published one (5 layers, 5 taps,
    block 16); the three explicit options override it (here 2 layers, 3 taps, block 16 kept)."""
    out = tmp_path / "bench.json"
    report = bench_decode.main(["--target", str(micro_target_dir), "--random-drafters", "raw_dflash",
                                "--random-drafter-preset", "dflash-qwen3-8b", "--random-drafter-layers", "2",
                                "--random-drafter-taps", "3", "--domains", "code", "--num-prompts", "1",
                                "--prompt-tokens", "16", "--max-new-tokens", "6", "--batch-size", "1", "--no-hf",
                                "--threads", "1", "--out", str(out)])
    assert report["random_drafter_size"] == {"num_layers": 2, "num_target_features": 3, "block_size": 16}
    assert len(report["methods"]["raw_dflash"]["p_len_ge"]) == 15   # block 16: 15 candidates per round
    assert report["identical_to_ar"]["raw_dflash"] == 1
    from dmtp.models.target import TargetModel

    target = TargetModel.from_pretrained(micro_target_dir)
    drafter, _ = random_drafters.random_drafter(target, "raw_dflash", 3, "cpu", None,
                                             size=random_drafters.RANDOM_DRAFTER_PRESETS["dflash-qwen3-8b"])
    cfg = drafter.config
    assert (cfg.num_hidden_layers, len(cfg.target_layer_ids), cfg.block_size) == (5, 5, 16)


def test_random_drafter_sizes_are_checked(capsys, micro_target_dir):
    import pytest

    for argv, message in ((["--random-block-size", "1"], "--random-block-size must be in 2..64"),
                          (["--random-drafter-layers", "0"], "at least 1 layer and 1 tap"),
                          (["--random-drafter-taps", "99"], "exceeds the target's")):
        with pytest.raises(SystemExit) as e:
            bench_decode.main(["--target", str(micro_target_dir), "--random-drafters", "raw_dflash", *argv])
        assert e.value.code == 2
        assert message in capsys.readouterr().err


def test_bench_peer_in_bfloat16_with_a_sized_drafter(micro_target_dir):
    """--dtype bfloat16 and a random drafter of a given size (block 16): both loops run in bf16 on the same
    drafter; the report says so."""
    import pytest

    pytest.importorskip("dflash.model")
    bench_peer = tool("bench_peer")

    report = bench_peer.main(["--target", str(micro_target_dir), "--random-drafter", "--random-drafter-layers", "2",
                              "--random-drafter-taps", "2", "--random-block-size", "16", "--dtype", "bfloat16",
                              "--domains", "code", "--num-prompts", "2", "--prompt-tokens", "16", "--max-new-tokens", "6",
                              "--reps", "1", "--temperature", "0", "--hf-batch-sizes", "--threads", "1"])
    assert report["dtype"] == "bfloat16" and report["block_size"] == 16 and report["drafter_layers"] == 2
    greedy = report["peer"]["0.0"]
    assert greedy["dmtp"]["requests"] == 2 and greedy["reference"]["tok_s"] > 0


def test_profile_decode_floor_timings_and_kernels(tmp_path, micro_target_dir):
    """tools/bench/profile_decode.py on CPU: the floor arithmetic from the weights' bytes, one row per
    (gqa mode, batch, context, method) with AR's own ratio 1, and a kernel table per profiled method."""
    profile_decode = tool("profile_decode")

    from dmtp.models.qwen3 import gqa_mode
    from dmtp.models.target import TargetModel

    before = gqa_mode("cpu")
    out = tmp_path / "profile.json"
    report = profile_decode.main(["--target", str(micro_target_dir), "--methods", "ar,raw_dflash",
                                  "--random-block-size", "16", "--batch-sizes", "1", "2", "--contexts", "24",
                                  "--gqa-modes", "repeat", "grouped", "--new-tokens", "6", "--kernels", "5",
                                  "--kernel-rounds", "2", "--threads", "1", "--out", str(out)])
    assert gqa_mode("cpu") == before   # the A/B leaves the process's mode as it was
    target = TargetModel.from_pretrained(micro_target_dir)
    params = sum(p.numel() for p in target.parameters())
    assert report["weight_bytes"]["target"] == 4 * params
    assert abs(report["floor_ms"]["target"] - 4 * params / 4.8e12 * 1e3) < 1e-9
    assert report["weight_bytes"]["drafter"] > report["weight_bytes"]["lm_head"]
    rows = report["rows"]
    assert len(rows) == 2 * 2 * 2 and {r["gqa"] for r in rows} == {"repeat", "grouped"}
    for r in rows:
        assert r["round_ms"] > 0 and r["x_floor"] > 0
        if r["method"] == "ar":
            assert r["x_ar_step"] == 1.0
        else:
            assert r["verify_ms"] > 0 and r["drafter_ms"] > 0
            assert abs(r["drafter_x_floor"] - r["drafter_ms"] / report["floor_ms"]["drafter"]) < 1e-6
    assert set(report["kernels"]) == {"ar", "raw_dflash"}
    assert report["kernels"]["ar"][-1]["name"] == "total" and len(report["kernels"]["ar"]) == 6
    assert json.loads(out.read_text())["rows"] == rows


def test_profile_decode_refuses_unknown_methods(capsys, micro_target_dir):
    profile_decode = tool("profile_decode")
    import pytest

    with pytest.raises(SystemExit) as e:
        profile_decode.main(["--target", str(micro_target_dir), "--methods", "ar,dflash3"])
    assert e.value.code == 2 and "unknown method 'dflash3'" in capsys.readouterr().err


def test_bench_attention_modes_agree(capsys):
    """tools/micro/bench_attention.py: every GQA mode timed on the same call, the same attention as the K/V copy."""
    bench_attention = tool("bench_attention")
    import pytest

    from dmtp.models.qwen3 import gqa_mode

    before = gqa_mode("cpu")
    rows = bench_attention.main(["--batch-sizes", "2", "--rows", "1", "4", "--slots", "40", "--heads", "8",
                                 "--kv-heads", "2", "--head-dim", "16", "--reps", "2"])
    assert [(r["rows"], r["slots"]) for r in rows] == [(1, 40), (4, 40)]
    assert all(r["max_abs_diff"] < 1e-5 and min(r["repeat_ms"], r["grouped_ms"], r["native_ms"]) > 0 for r in rows)
    assert gqa_mode("cpu") == before
    with pytest.raises(SystemExit) as e:
        bench_attention.main(["--heads", "6", "--kv-heads", "4"])
    assert e.value.code == 2 and "must be a multiple of --kv-heads" in capsys.readouterr().err


def test_bench_block_attention_groups_agree_with_the_dense_mask_and_compute_fewer_pairs(capsys):
    """tools/micro/bench_block_attention.py: training's attention in groups of blocks gives the dense mask's output and
    gradients, over fewer (query, key) pairs, and leaves the shipped group size as it was."""
    bench_block_attention = tool("bench_block_attention")
    import pytest

    import dmtp.drafters.dflash as dflash

    shipped = dflash.BLOCK_GROUP_ROWS
    rows = bench_block_attention.main(["--group-rows", "0", "16", "--batch", "2", "--context", "48", "--blocks", "8",
                                       "--block", "4", "--heads", "4", "--kv-heads", "2", "--head-dim", "8",
                                       "--reps", "1"])
    assert dflash.BLOCK_GROUP_ROWS == shipped
    dense, grouped = rows
    assert (dense["groups"], grouped["groups"]) == (1, 2)
    assert dense["pairs"] == 2 * 32 * (48 + 32) and grouped["pairs"] == 2 * 32 * (48 + 16)
    assert grouped["max_abs_diff"] < 1e-5 and min(dense["ms"], grouped["ms"]) > 0
    with pytest.raises(SystemExit) as e:
        bench_block_attention.main(["--blocks", "60", "--context", "64"])
    assert e.value.code == 2 and "need a --context longer" in capsys.readouterr().err


def test_bench_drafter_kv_paths_agree_and_cached_allocates_no_kv_copy():
    """tools/micro/bench_drafter_kv.py: the in-place path gives the concatenating path's hidden states and allocates
    at least one K/V copy (every layer, K and V) less per forward."""
    bench_drafter_kv = tool("bench_drafter_kv")

    rows = bench_drafter_kv.main(["--batch-sizes", "2", "--contexts", "24", "64", "--layers", "2", "--hidden", "32",
                                  "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--block", "4", "--reps", "1"])
    assert [(r["batch"], r["context"], r["slots"]) for r in rows] == [(2, 24, 29), (2, 64, 69)]
    for r in rows:
        assert r["max_abs_diff"] < 1e-5
        assert r["concat_alloc_bytes"] - r["cached_alloc_bytes"] >= r["kv_copy_bytes"] > 0
    assert rows[0]["cached_alloc_bytes"] < rows[0]["concat_alloc_bytes"] < rows[1]["concat_alloc_bytes"]


def test_train_scale_counts_model_flops_part_by_part(micro_target_dir):
    """The MFU's numerator: every part as the module docstring of tools/bench/bench_train_scale.py writes it."""
    bench_train_scale = tool("bench_train_scale")

    from dmtp.configs import compose_train
    from dmtp.training.components import build_components

    module = build_components(compose_train(["debug=tiny_budget"]))[3]
    seq, batch, anchors = 64, 4, 8
    flops = bench_train_scale.model_flops(module, seq, batch, anchors)
    tc = module.target.config
    layer_params = sum(p.numel() for layer in module.target.decoder_layers() for p in layer.parameters())
    assert flops["target_layers"] == 2 * layer_params * seq * batch
    assert flops["target_lm_head"] == 2 * tc.hidden_size * tc.vocab_size * seq * batch
    assert flops["target_attention"] == 4 * tc.num_attention_heads * tc.head_dim * seq * seq / 2 * tc.num_hidden_layers * batch
    assert flops["total"] == sum(v for k, v in flops.items() if k != "total")
    more = bench_train_scale.model_flops(module, seq, batch, 2 * anchors)   # the drafter's rows grow with anchors
    assert more["drafter_forward_backward"] > flops["drafter_forward_backward"]
    assert more["target_layers"] == flops["target_layers"]


@pytest.mark.slow
def test_train_scale_runs_the_production_trainer_and_reports(tmp_path, micro_target_dir):
    # Its own process: the FSDP strategy sets up a process group (and a rendezvous port) that must not outlive it.
    import subprocess
    import sys

    bench_train_scale = tool("bench_train_scale")

    out = tmp_path / "train.json"
    run = subprocess.run([sys.executable, str(TOOLS / "bench" / "bench_train_scale.py"), "--target", str(micro_target_dir), "--injections", "raw_dflash",
                          "--steps", "5", "--checkpoint-every", "3", "--warmup", "0", "--seq-len", "64", "--anchors",
                          "8", "--layers", "1", "--taps", "2", "--max-examples", "60", "--val-prompts", "2",
                          "--accelerator", "cpu", "--threads", "1", "--workdir", str(tmp_path), "--out", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    [result] = json.loads(out.read_text())["results"]
    assert result["injection"] == "raw_dflash" and result["steps"] == 5
    assert result["s_per_step"] > 0 and result["tok_s"] > 0 and result["checkpoint_gb"] > 0
    assert len(result["checkpoint_stall_s"]) == 1 and result["final_walk_s"] > 0
    assert "| raw_dflash |" in run.stdout
    # Where a step's time goes: every phase of raw DFlash (it has no MTP chain), each a part of the step.
    phases = result["phase_s"]
    assert set(phases) == set(bench_train_scale.PHASES) - {"mtp_chain"}
    assert all(v > 0 for v in phases.values()) and sum(phases.values()) < 3 * result["s_per_step"]
    assert "where a step's time goes" in run.stdout
