"""Every decoding run loads through the one setup loader (dmtp.inference.setup): dmtp.infer's
application, tools/bench/bench_decode.py, tools/bench/bench_peer.py and the training job's decode-after take the
target, MTP, drafter and decoders from it, and none loads or builds them by hand (a second dtype rule,
a second way to find a drafter's MTP, a decoder built with other defaults)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOADS = {"placement", "load_target", "load_mtp", "load_drafter", "build_decoder"}
CALLERS = {"dmtp/inference/compare.py": LOADS - {"build_decoder"},   # its decoders come from the engine (below)
           "tools/bench/bench_decode.py": LOADS, "tools/bench/bench_peer.py": LOADS,
           # decode-after holds its trained modules already; the target's own MTP, for the chain baseline beside them
           "dmtp/training/evaluate.py": {"build_decoder", "load_mtp"},
           "dmtp/serving/dmtp_loop.py": {"build_decoder"}}   # engine=dmtp (dmtp.infer, regeneration, benches)
# build_decoder is defined where the loop meets the families' runners (dmtp.families.decoding) and re-exported by
# the loader; the engines sit below the loader and take it from there.
LOADERS = ("dmtp.inference.setup", "dmtp.families.decoding")
# What the loader does, done by hand: the target and its tokenizer, the MTP, the drafter and its MTP, a decoder.
BY_HAND = {"TargetModel", "load_tokenizer", "ensure_tiny_target", "load_native_mtp", "load_drafter_for",
           "mtp_for_drafter", "build_proposer", "SpecDecoder", "resolve_device", "resolve_dtype"}


def from_setup(tree: ast.AST) -> set[str]:
    return {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and node.module in LOADERS for alias in node.names}


def called(tree: ast.AST) -> set[str]:
    """The names a file calls: f(...), obj.f(...) (both obj and f)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            while isinstance(func, ast.Attribute):
                names.add(func.attr)
                func = func.value
            if isinstance(func, ast.Name):
                names.add(func.id)
    return names


@pytest.mark.parametrize("caller", sorted(CALLERS))
def test_decoding_runs_load_through_the_one_loader(caller):
    tree = ast.parse((ROOT / caller).read_text())
    assert CALLERS[caller] <= from_setup(tree)
    assert called(tree) & BY_HAND == set()


INSTANTIATED = []


def recording_load_target(**kwargs):
    """A conf/target `_target_` that records how it was called (and loads the target as usual)."""
    from dmtp.tiny.targets import load_target

    INSTANTIATED.append(kwargs)
    return load_target(**kwargs)


def test_infer_instantiates_the_target_node_as_training_does(tmp_path, micro_target_dir):
    """dmtp.infer builds its target from conf/target's `_target_` (not a loader of its own), placed by
    the top-level device / dtype (auto on CPU: float32)."""
    from dmtp.configs import compose_config
    from dmtp.inference.compare import compare_methods

    cfg = compose_config("infer", [f"target.path={micro_target_dir}", "methods=[ar]", "num_prompts=1",
                                   f"target._target_={__name__}.recording_load_target",
                                   "eval.domains=[code]", "max_new_tokens=2", "batch_size=1", "progress=false",
                                   "warmup=false", "device=cpu", f"output_dir={tmp_path / 'run'}"])
    INSTANTIATED.clear()
    metrics = compare_methods(cfg)
    assert [(c["path"], c["device"], c["dtype"]) for c in INSTANTIATED] == [(str(micro_target_dir), "cpu", "float32")]
    assert metrics["run"]["dtype"] == "float32"
