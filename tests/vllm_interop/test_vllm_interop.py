"""dmtp's exports served unchanged by vLLM (method `dflash`): the target's greedy tokens, and vLLM's
per-position acceptance counters equal to dmtp's own loop on the same prompts and weights.

The raw DFlash drafter is trained here for a few dozen steps on the micro_vllm target's own responses,
so that acceptance is far from zero and the comparison means something. Counting: vLLM's
`num_drafts` is dmtp's number of verification rounds and `num_accepted_tokens_per_pos[k]` the rounds
that accepted more than k candidates, both before the EOS / budget cut (dmtp's `accepted_raw`), since
vLLM's scheduler counts a round's accepted drafts before it checks the stop conditions.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.vllm_interop.common import ENGINE_ARGS, NEW_TOKENS, SKIP_REASON, train_interop_drafter

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("vllm", reason=SKIP_REASON)

from dmtp.drafters.block_drafter import load_block_drafter  # noqa: E402
from dmtp.configs import compose_config  # noqa: E402
from dmtp.decode import build_proposer  # noqa: E402
from dmtp.families.decoding import spec_decoder  # noqa: E402
from dmtp.serving.vllm.engine import (generate, generate_tokens, make_llm, sampling_params, shutdown,  # noqa: E402
                                      spec_decode_counts)
from dmtp.serving.vllm.decoder import committed_accepted  # noqa: E402

K = 7   # candidates per round in dmtp; vLLM's num_speculative_tokens (its block is 1 + K)


def _spec(drafter_dir) -> dict:
    return {"method": "dflash", "model": str(drafter_dir), "num_speculative_tokens": K}


@pytest.fixture(scope="module")
def raw_drafter_dir(tmp_path_factory, vllm_target_dir):
    """A one-layer raw DFlash drafter trained 40 steps on the target's own greedy responses."""
    return train_interop_drafter(tmp_path_factory, "raw_dflash")


@pytest.fixture(scope="module")
def dmtp_run(vllm_target, vllm_tokenizer, interop_prompts, raw_drafter_dir):
    """dmtp's own loop on the prompts: the target alone (AR) and with the drafter."""
    drafter, _ = load_block_drafter(raw_drafter_dir)
    eos = vllm_tokenizer.eos_token_id
    ar = spec_decoder(vllm_target, build_proposer("ar", vllm_target), eos_token_id=eos)
    spec = spec_decoder(vllm_target, build_proposer("drafter", vllm_target, drafter=drafter), eos_token_id=eos)
    return (ar.generate(interop_prompts, max_new_tokens=NEW_TOKENS, batch_size=8),
            spec.generate(interop_prompts, max_new_tokens=NEW_TOKENS, batch_size=8))


@pytest.fixture(scope="module")
def served_raw(vllm_target_dir, vllm_tokenizer, interop_prompts, raw_drafter_dir):
    """vLLM serving the target with the raw DFlash export: (tokens, accepted per request and round,
    drafts, accepted per position)."""
    llm = make_llm(vllm_target_dir, ENGINE_ARGS, speculative_config=_spec(raw_drafter_dir))
    try:
        tokens, rounds = generate(llm, interop_prompts, sampling_params(NEW_TOKENS, [vllm_tokenizer.eos_token_id]))
        yield (tokens, rounds, *spec_decode_counts(llm))
    finally:
        shutdown(llm)


def _per_position(accepted: list[list[int]]) -> list[int]:
    return [sum(a > k for rounds in accepted for a in rounds) for k in range(K)]


def test_raw_dflash_export_served_by_vllm_gives_the_targets_greedy_tokens(dmtp_run, served_raw):
    ar, spec = dmtp_run
    tokens, *_ = served_raw
    assert spec.tokens == ar.tokens
    assert tokens == ar.tokens


def test_vllm_acceptance_per_position_equals_dmtps_loop(dmtp_run, served_raw):
    _, spec = dmtp_run
    _, rounds, drafts, per_pos = served_raw
    ours = _per_position(spec.accepted_raw)
    assert rounds == spec.accepted_raw            # every request, every round
    assert drafts == sum(len(r) for r in spec.accepted_raw)
    assert per_pos == ours, (per_pos, ours)
    assert ours[0] >= 0.05 * drafts and ours[K - 1] > 0     # a drafter that is accepted, deep into the block
    # dmtp's counts after the budget cut follow from the raw ones and the output length
    assert [committed_accepted(len(t), r) for t, r in zip(spec.tokens, spec.accepted_raw)] == spec.accepted
    assert spec.accepted != spec.accepted_raw                # the budget did cut some last rounds


# vLLM's engine options, given to the vLLM engine only (dmtp's refuses options it would ignore)
VLLM_ARGS = {"dmtp": [], "vllm": ["vllm_engine_args={enforce_eager: true, max_model_len: 512}"]}


def test_infer_engine_vllm_prints_dmtps_acceptance(vllm_target_dir, raw_drafter_dir, tmp_path, capsys):
    """`python -m dmtp.infer engine=vllm`: the same prompts and table, decoded inside vLLM; greedy, every
    acceptance figure equals dmtp's own loop (speed columns are vLLM's and are not compared)."""
    from dmtp.inference.compare import compare_methods

    def run(engine):
        cfg = compose_config("infer", [f"engine={engine}", f"target.path={vllm_target_dir}", f"drafter.path={raw_drafter_dir}",
                                       "methods=[ar,drafter]", "num_prompts=2", "max_new_tokens=32", "batch_size=2",
                                       "progress=false", "eval.domains=[code,math]",
                                       *VLLM_ARGS[engine], f"output_dir={tmp_path / engine}"])
        return compare_methods(cfg)

    ours, theirs = run("dmtp"), run("vllm")
    assert theirs["run"]["engine"] == "vllm" and "acceptance length (tau" in capsys.readouterr().out
    keys = ("tau_per_request", "tau_per_verify", "t1_accept", "p_len_ge", "matches_ar")
    for wl in ("code", "math"):
        for method in ("ar", "raw_dflash"):
            mine, vllms = ours["workloads"][wl][method], theirs["workloads"][wl][method]
            assert {k: mine.get(k) for k in keys} == {k: vllms.get(k) for k in keys}, (wl, method)
            assert vllms["matches_ar"] == 1.0


def test_infer_engine_vllm_decodes_a_dmtp_drafter_through_the_plugin(vllm_target_dir, dmtp_drafter_dir, tmp_path,
                                                                     capsys):
    """`python -m dmtp.infer engine=vllm` with a DMTP drafter: decoded inside vLLM through dmtp's plug-in (the
    native MTP's T1, then the block drafter), every acceptance figure equal to dmtp's own loop (greedy).
    After the plug-in module's tests: vLLM's counters, which those read, are process-wide."""
    from dmtp.inference.compare import compare_methods

    def run(engine):
        cfg = compose_config("infer", [f"engine={engine}", f"target.path={vllm_target_dir}",
                                       f"drafter.path={dmtp_drafter_dir}", "methods=[ar,drafter]",
                                       "num_prompts=2", "max_new_tokens=32", "batch_size=2", "progress=false",
                                       "eval.domains=[code,math]", *VLLM_ARGS[engine],
                                       f"output_dir={tmp_path / engine}"])
        return compare_methods(cfg)

    dmtp_name = load_block_drafter(dmtp_drafter_dir)[0].method_name   # this drafter trains the MTP correction too
    ours, theirs = run("dmtp"), run("vllm")
    assert theirs["run"]["engine"] == "vllm" and theirs["run"]["injection"] == dmtp_name
    assert "acceptance length (tau" in capsys.readouterr().out
    keys = ("tau_per_request", "tau_per_verify", "t1_accept", "p_len_ge", "matches_ar")
    for wl in ("code", "math"):
        for method in ("ar", dmtp_name):
            mine, vllms = ours["workloads"][wl][method], theirs["workloads"][wl][method]
            assert {k: mine.get(k) for k in keys} == {k: vllms.get(k) for k in keys}, (wl, method)
            assert vllms["matches_ar"] == 1.0
        assert ours["workloads"][wl][dmtp_name]["t1_accept"] > 0   # the MTP's T1 was accepted


@pytest.fixture(scope="module")
def dflash2_drafter_dir(tmp_path_factory, vllm_target_dir):
    """A one-layer raw DFlash2 drafter (convolutions and candidate selector) trained 40 steps, the
    selector's loss on from step 0, so that its walk departs from the unary argmax."""
    return train_interop_drafter(tmp_path_factory, "raw_dflash", overrides=("drafter=dflash2",))


def test_dflash2_export_in_vllm(vllm_target, vllm_tokenizer, vllm_target_dir, interop_prompts, dflash2_drafter_dir,
                                dmtp_run):
    """vLLM knows the export as DFlash2 (its candidate-head drafter). vLLM's V1 runner (its CPU build) would
    drop the candidate selector, so vLLM refuses it there; dmtp's plug-in walks the selector on V1
    (`vllm_dflash2_proposer`). Greedy tokens are the target's, and acceptance per position is dmtp's own
    loop's with the same drafter: the selector's picks, not the unary argmax."""
    drafter, _ = load_block_drafter(dflash2_drafter_dir)
    assert drafter.config.architecture == "DFlash2DraftModel"
    assert drafter.backbone.candidate_selector.successor_codebook.abs().max() > 0   # the walk matters
    eos = vllm_tokenizer.eos_token_id
    ours = spec_decoder(vllm_target, build_proposer("drafter", vllm_target, drafter=drafter),
                       eos_token_id=eos).generate(interop_prompts, max_new_tokens=NEW_TOKENS, batch_size=8)
    llm = make_llm(vllm_target_dir, ENGINE_ARGS, speculative_config=_spec(dflash2_drafter_dir))
    try:
        tokens = generate_tokens(llm, interop_prompts, sampling_params(NEW_TOKENS, [eos]))
        drafts, per_pos = spec_decode_counts(llm)
        proposer = type(llm.llm_engine.model_executor.driver_worker.worker.model_runner.drafter).__name__
    finally:
        shutdown(llm)
    assert proposer == "DFlash2Proposer"
    assert tokens == dmtp_run[0].tokens == ours.tokens
    assert (drafts, per_pos) == (sum(len(r) for r in ours.accepted_raw), _per_position(ours.accepted_raw))
    assert per_pos[0] > 0


def test_bench_vllm_compares_both_engines_losslessly(vllm_target_dir, raw_drafter_dir, dmtp_drafter_dir, tmp_path):
    """tools/bench/bench_vllm.py (BENCHMARKS.md's vLLM table): every method in both engines at each batch size and
    temperature, every greedy output equal to dmtp's AR, ratios over each engine's own AR and over the first
    drafter; at T = 1 drafts are accepted in both engines (rejection sampling)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_vllm", ROOT / "tools" / "bench" / "bench_vllm.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "bench.json"
    bench.main(["--target", str(vllm_target_dir), "--drafter", str(raw_drafter_dir), "--drafter", str(dmtp_drafter_dir),
                "--batch-sizes", "1", "4", "--temperatures", "0", "1", "--num-prompts", "4", "--max-new-tokens", "16",
                "--out", str(out)])
    report = json.loads(out.read_text())
    dmtp_name = load_block_drafter(dmtp_drafter_dir)[0].method_name
    assert sorted(report["by_batch"]) == ["1", "4"]
    for by_temperature in report["by_batch"].values():
        assert sorted(by_temperature) == ["0.0", "1.0"]
        for temperature, figures in by_temperature.items():
            for engine in ("dmtp", "vllm"):
                methods = {k: v for k, v in figures[engine].items() if k != "seconds"}
                assert sorted(methods) == sorted(["ar", dmtp_name, "raw_dflash"])
                assert all(f["tokens_per_s"] > 0 for f in methods.values()), engine
                assert all(f["matches_dmtp_ar"] is (True if temperature == "0.0" else None) for f in methods.values())
                assert methods["raw_dflash"]["vs_first_drafter"] == 1.0 and methods["ar"]["vs_first_drafter"] is None
                assert methods[dmtp_name]["tau"] > 1.0, (temperature, engine)
        assert by_temperature["0.0"]["dmtp"][dmtp_name]["tau"] == by_temperature["0.0"]["vllm"][dmtp_name]["tau"]


def test_bench_vllm_prefix_measures_hits_with_the_same_tokens_and_tau(vllm_target_dir, raw_drafter_dir,
                                                                      dmtp_drafter_dir, tmp_path):
    """tools/bench/bench_vllm_prefix.py (BENCHMARKS.md's prefix-cache table): both passes, caching on and off, give
    the same tokens and tau; the DMTP drafter's second pass with caching on is rebuilt from the store (no miss)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_vllm_prefix", ROOT / "tools" / "bench" / "bench_vllm_prefix.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "prefix.json"
    bench.main(["--target", str(vllm_target_dir), "--drafter", str(raw_drafter_dir), "--drafter", str(dmtp_drafter_dir),
                "--num-prompts", "3", "--prompt-tokens", "128", "--max-new-tokens", "16", "--out", str(out)])
    report = json.loads(out.read_text())["drafters"]
    for figures in report.values():
        taus = {figures[c][p]["tau"] for c in ("on", "off") for p in ("first", "second")}
        assert len(taus) == 1 and all(figures[c]["same_tokens"] for c in ("on", "off"))
    dmtp = report[str(dmtp_drafter_dir)]["on"]
    assert dmtp["hits"] == 3 and dmtp["misses"] == 0 and dmtp["rebuilt_rows"] == 3 * 64   # 2 blocks of 32 each
    assert "hits" not in report[str(raw_drafter_dir)]["on"]
