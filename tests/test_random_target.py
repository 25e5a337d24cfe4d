"""Random-weight targets with real models' shapes (`python -m dmtp.tiny.random_target`), written at their
CPU-sized `--tiny` shapes, one per family layout, and read back through the real loaders: transformers'
own class (no tensor missing, the release naming save_pretrained writes), dmtp's strict MTP loader, and
the decoding loop (greedy MTP415 == AR in fp32, requests decode their whole budget)."""
import json
import math

import pytest
import torch
from safetensors import safe_open

from dmtp.decode import build_proposer
from dmtp.families.decoding import spec_decoder
from dmtp.families.mtp_loading import load_native_mtp
from dmtp.models.target import TargetModel
from dmtp.tiny.random_target import main as random_target_main, plan_shards, write_random_target
from dmtp.tiny.real_shapes import SHAPES, shape_config

LAYOUT_FILES = {"mtp_apart": "mtp.safetensors"}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def written(request, tmp_path_factory, micro_target_dir):
    out = tmp_path_factory.mktemp("random") / request.param
    # Tiny shards, so that even the CPU-sized checkpoint is sharded like the real one.
    write_random_target(request.param, out, tiny=True, device="cpu", dtype="float32", shard_gb=64 / 2**20,
                        tokenizer=micro_target_dir, progress=False)
    return request.param, out


def _keys(path):
    index = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    files = {}
    for key, f in index.items():
        files.setdefault(f, []).append(key)
    return index, files


def test_layout_of_each_family(written):
    shape, path = written
    spec = SHAPES[shape]
    index, files = _keys(path)
    assert len(files) > 1   # sharded, every shard named by the index and holding exactly its keys
    for f, keys in files.items():
        with safe_open(str(path / f), "pt") as h:
            assert sorted(h.keys()) == sorted(keys)
    cfg = json.loads((path / "config.json").read_text())
    layers = cfg["num_hidden_layers"]
    listed_mtp = [k for k in index if k.startswith("mtp.") or k.startswith(f"model.layers.{layers}.")]
    if spec.mtp_layout == "mtp_apart":   # the embedded dense targets' layout: MTP beside, unlisted
        assert not listed_mtp
        with safe_open(str(path / "mtp.safetensors"), "pt") as h:
            assert all(k.startswith("mtp.") for k in h.keys()) and len(list(h.keys())) > 5
        assert cfg["mtp_num_hidden_layers"] == 1
    elif spec.mtp_layout == "mtp_listed":
        assert listed_mtp and all(k.startswith("mtp.") for k in listed_mtp) and cfg["mtp_num_hidden_layers"] == 1
        assert min(index[k] for k in listed_mtp) >= max(index[k] for k in index if k not in listed_mtp)  # MTP last
    else:
        assert listed_mtp and f"model.layers.{layers}.eh_proj.weight" in index and cfg["num_nextn_predict_layers"] == 1
        assert any(".mlp.experts.0.gate_proj.weight" in k for k in index)   # per-expert, as the releases
    report = json.loads((path / "random_target.json").read_text())
    assert "random weights" in report["note"] and report["shape"] == shape and report["tiny"]
    assert cfg["model_type"] == spec.model_type and cfg["eos_token_id"] == report["eos_token_id"]


def test_transformers_loads_every_tensor_in_release_naming(written, tmp_path):
    """No tensor of transformers' class is missing (none left at random init), and saving the loaded model
    writes exactly the causal LM's names we wrote: the release layout."""
    from transformers import AutoModelForCausalLM

    shape, path = written
    model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True, dtype=torch.float32)
    assert not info["missing_keys"]
    model.save_pretrained(tmp_path / "resaved")
    index, _ = _keys(path)
    ours = {k for k in index if not k.startswith("mtp.")
            and not k.startswith(f"model.layers.{model.config.num_hidden_layers}.")}
    theirs = set()
    for f in (tmp_path / "resaved").glob("*.safetensors"):
        with safe_open(str(f), "pt") as h:
            theirs |= set(h.keys())
    assert ours == theirs
    eos = model.config.eos_token_id
    assert torch.count_nonzero(model.lm_head.weight[eos]) == 0 and torch.count_nonzero(model.lm_head.weight) > 0


def test_strict_mtp_loader_and_lossless_decoding(written):
    shape, path = written
    target = TargetModel.from_pretrained(path, dtype=torch.float32)
    mtp = load_native_mtp(path, target.embed_tokens, target.lm_head)
    eos = target.config.eos_token_id
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 2000, (n,), generator=gen).tolist() for n in (7, 12, 4)]
    out = {}
    for method in ("ar", "mtp415"):
        dec = spec_decoder(target, build_proposer(method, target, mtp=mtp), eos_token_id=eos)
        out[method] = dec.generate(prompts, max_new_tokens=12, batch_size=2).tokens
    assert out["mtp415"] == out["ar"]
    assert all(len(t) == 12 and eos not in t for t in out["ar"])   # the zero EOS row: whole budget


def test_shards_and_scale_down():
    cfg = shape_config("qwen3-8b")
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_key_value_heads"]) == (4096, 36, 8)
    assert shape_config("qwen3-8b", layers=3, overrides={"hidden_size": 1024})["hidden_size"] == 1024
    names = {f"model.layers.{i}.w": ((1024, 1024), torch.float32) for i in range(12)}
    shards = plan_shards(names, torch.bfloat16, 4 * 2**20)   # 2 MiB per tensor -> two per 4 MiB shard
    assert [len(s) for s in shards] == [2] * 6
    assert shards[0] == ["model.layers.0.w", "model.layers.1.w"] and shards[5][-1] == "model.layers.11.w"
    params = sum(math.prod(s) for s, _ in names.values())
    assert params == 12 * 2**20


@pytest.mark.parametrize("argv,message", [
    (["--shape", "qwen3-8b", "--tiny", "--set", "hidden_size"], "--set takes key=value"),
    (["--shape", "qwen3-8b", "--tiny", "--layers", "0"], "--layers must be at least 1"),
    (["--shape", "qwen3-8b", "--tiny", "--shard-gb", "0"], "--shard-gb must be positive"),
])
def test_bad_input_is_one_line_exit_2(argv, message, tmp_path, capsys, micro_target_dir):
    assert random_target_main([*argv, "--out", str(tmp_path / "t"), "--tokenizer", str(micro_target_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_refuses_a_non_empty_directory(tmp_path, capsys, micro_target_dir):
    (tmp_path / "x").write_text("keep me")
    assert random_target_main(["--shape", "qwen3-8b", "--tiny", "--out", str(tmp_path),
                               "--tokenizer", str(micro_target_dir)]) == 2
    assert "not empty" in capsys.readouterr().err and (tmp_path / "x").read_text() == "keep me"
