"""Engines behind one interface (dmtp/serving): looked up by name, each decoder a `Decoder`, and what
`dmtp.infer`, regeneration and the benches build is the registered engine's, nothing else."""
from __future__ import annotations

import dataclasses

import pytest

from dmtp.configs import compose_config
from dmtp.serving import catalogue
from dmtp.serving.base import Decoder, DecoderRequest, Engine
from dmtp.serving.catalogue import engine_named, engine_names
from dmtp.inference.setup import build_decoder
from dmtp.serving.vllm.decoder import VLLMDecoder
from dmtp.datagen.regenerate import REGEN_ENGINES, RegenSettings


def test_engines_are_looked_up_by_name_and_a_wrong_one_is_one_line():
    assert engine_names() == ("dmtp", "vllm") and REGEN_ENGINES == ("dmtp", "vllm")
    assert engine_named("vllm").title == "vLLM" and engine_named("dmtp").regen_methods == ("ar", "mtp415")
    with pytest.raises(ValueError, match=r"^engine must be one of dmtp, vllm, got 'sglang'$"):
        engine_named("sglang")
    with pytest.raises(ValueError, match=r"^regeneration through vLLM decodes with method ar, got 'mtp415'$"):
        RegenSettings(new_tokens=8, engine="vllm", method="mtp415")


def test_every_engines_decoder_is_a_decoder(micro_target):
    """dmtp's loop and vLLM's decoder both implement the interface (vLLM is not started: no stub of the loop's
    runner on it any more), and report how they decode under the same keys."""
    ours = build_decoder(micro_target, "ar", 0)
    theirs = VLLMDecoder("ar", "/nowhere", [0])
    assert isinstance(ours, Decoder) and isinstance(theirs, Decoder)
    assert not hasattr(theirs, "runner") and not hasattr(theirs, "use_graphs")
    assert set(ours.info()) == set(theirs.info()) == {"runner", "attention", "cuda_graphs", "compiled", "compile_s"}
    assert (ours.info()["runner"], theirs.info()["runner"]) == (ours.runner.kind, "vllm")
    assert (ours.predicts_confidence, theirs.predicts_confidence) == (False, False)
    assert not isinstance(object(), Decoder)


def test_infer_decodes_with_the_engine_registered_under_the_name_given(tmp_path, micro_target_dir, monkeypatch):
    """A third engine is one more entry in the catalogue: `dmtp.infer engine=<it>` builds its decoders from
    the request (methods, target, the engine's own options) and reports it; the comparison reads only the
    interface."""
    from dmtp.serving import dmtp_loop
    from dmtp.inference.compare import compare_methods

    seen = []

    def decoders(request: DecoderRequest):
        seen.append(request)
        return dmtp_loop.decoders(dataclasses.replace(request, options={}))

    extra = Engine(name="mine", title="my engine", options=lambda cfg: {"from": cfg.max_new_tokens},
                   decoders=decoders)
    monkeypatch.setattr(catalogue, "ENGINES", (*catalogue.ENGINES, extra))
    cfg = compose_config("infer", [f"target.path={micro_target_dir}", "methods=[ar]", "num_prompts=1",
                                   "eval.domains=[code]", "max_new_tokens=4", "eval.prompt_tokens=8", "progress=false",
                                   "warmup=false", "engine=mine", f"output_dir={tmp_path / 'run'}"])
    metrics = compare_methods(cfg)
    assert [(r.methods, r.options, r.drafter) for r in seen] == [(["ar"], {"from": 4}, None)]
    assert metrics["run"]["engine"] == "mine" and metrics["run"]["runner"] == "fast"
    assert metrics["overall"]["ar"]["num_requests"] == 1


def test_a_wrong_engine_answers_before_anything_loads(tmp_path):
    from dmtp.inference.compare import compare_methods

    cfg = compose_config("infer", ["target.path=/does/not/exist", "methods=[ar]", "engine=sglang",
                                   f"output_dir={tmp_path}"])
    with pytest.raises(ValueError, match=r"^engine must be one of dmtp, vllm, got 'sglang'$"):
        compare_methods(cfg)
