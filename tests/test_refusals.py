"""Options and inputs that used to give a silently wrong result or a traceback (issue 24, items 4-5): each is
now exact, or one line naming what is wrong, with exit status 2, before anything is decoded."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from cli_runner import infer_cli
from dmtp.decode import SamplingConfig, build_proposer
from dmtp.families.decoding import spec_decoder
from dmtp.drafters.block_drafter import fresh_drafter_for, load_block_drafter
from dmtp.models.target import load_tokenizer


def _infer(args, tmp_path, monkeypatch, capsys):
    return infer_cli(["num_prompts=1", "eval.domains=[code]", "max_new_tokens=4", "eval.prompt_tokens=8", *args],
                     tmp_path / "run", monkeypatch, capsys)


# -- temperature that would underflow --------------------------------------------------------------

@pytest.mark.parametrize("temperature", [1e-40, 1e-46, 1e-300])
@pytest.mark.parametrize("verification", ["target_only", "rejection"])
def test_a_vanishing_temperature_decodes_as_greedy(micro_target, micro_mtp, micro_target_dir, temperature,
                                                   verification):
    """softmax(x / T) -> the one-hot of the argmax as T -> 0; before, x / 1e-40 overflowed to inf, the
    softmax gave NaN, and every token came out as the last vocabulary id."""
    tok = load_tokenizer(micro_target_dir)
    prompt = tok("def add(a, b):\n    return a", add_special_tokens=False)["input_ids"]
    dec = spec_decoder(micro_target, build_proposer("mtp415", micro_target, mtp=micro_mtp), eos_token_id=[])
    greedy = dec.generate([prompt], max_new_tokens=10).tokens
    tiny = dec.generate([prompt], max_new_tokens=10, seed=1,
                        sampling=SamplingConfig(temperature=temperature, verification=verification)).tokens
    assert tiny == greedy


# -- MTP chains, top_k, multi-step MTP options -----------------------------------------------------

@pytest.mark.parametrize("arg,message", [
    ("methods=[mtp:0]", "method mtp:0: the MTP chains 1..31 steps per round"),
    ("methods=[mtp:32]", "method mtp:32: the MTP chains 1..31 steps per round"),
    ("mtp_steps=100", "mtp_steps=100: the MTP chains 1..31 steps per round"),
])
def test_an_mtp_chain_outside_the_block_is_one_line(arg, message, tmp_path, micro_target_dir, monkeypatch,
                                                    capsys):
    code, line, out = _infer([f"target.path={micro_target_dir}", arg], tmp_path, monkeypatch, capsys)
    assert code == 2 and line.startswith("dmtp.infer: error: " + message), (line, out)


def test_top_k_larger_than_the_vocabulary_is_one_line(tmp_path, micro_target_dir, monkeypatch, capsys):
    code, line, _ = _infer([f"target.path={micro_target_dir}", "methods=[ar]", "temperature=1", "top_k=100000"],
                           tmp_path, monkeypatch, capsys)
    assert (code, line) == (2, "dmtp.infer: error: top_k=100000 exceeds the target's vocabulary of 512 tokens; "
                               "use top_k in 1..512, or 0 (off)")


def test_a_multi_mtp_drafter_keeps_the_m_it_was_trained_for(micro_target, tmp_path):
    fresh_drafter_for(micro_target, "multi_mtp_zero_init", 3, max_mtp_tokens=3).save(tmp_path / "d")
    for options, needle in [({"max_mtp_tokens": 7}, "was trained with max_mtp_tokens=3, which decoding cannot "
                                                    "change (got 7)"),
                            ({"max_mtp_tokens": 7, "num_mtp_tokens": 7}, "max_mtp_tokens=3"),
                            ({"num_mtp_tokens": 7}, "num_mtp_tokens must be an integer in 1..max_mtp_tokens=3")]:
        with pytest.raises(ValueError, match="drafter .*" + needle.replace("(", r"\(").replace(")", r"\)")):
            load_block_drafter(tmp_path / "d", options=options)
    drafter, _ = load_block_drafter(tmp_path / "d", options={"num_mtp_tokens": 2, "max_mtp_tokens": 3})
    assert drafter.injection.mtp_steps == 2


# -- a tampered drafter directory -----------------------------------------------------------------

def _edit_config(path, edit):
    cfg = json.loads((path / "config.json").read_text())
    edit(cfg)
    (path / "config.json").write_text(json.dumps(cfg))


def _edit_tensors(path, edit):
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


TAMPERED = {
    "no hidden_size": (lambda c: c.pop("hidden_size"), None,
                       "{d}/config.json: missing 'hidden_size' (a drafter config needs "),
    "no vocab_size": (lambda c: c.pop("vocab_size"), None, "{d}/config.json: missing 'vocab_size'"),
    "no num_hidden_layers": (lambda c: c.pop("num_hidden_layers"), None,
                             "{d}/config.json: missing 'num_hidden_layers'"),
    "no num_attention_heads": (lambda c: c.pop("num_attention_heads"), None,
                               "{d}/config.json: missing 'num_attention_heads'"),
    "nonsense torch_dtype": (lambda c: c.update(torch_dtype="float42"), None,
                             "{d}/config.json: torch_dtype='float42' is not a floating-point torch dtype"),
    "mask outside the vocabulary": (lambda c: c["dflash_config"].update(mask_token_id=512), None,
                                    "{d}/config.json: mask_token_id 512 is outside the vocabulary (vocab_size 512"),
    "no dmtp section": (lambda c: c.pop("dmtp"), None,
                        "{d}/model.safetensors: unexpected tensor dmtp_injection.fusion.norm_embedding.weight, but "
                        "{d}/config.json has no \"dmtp\" section"),
    "unknown variant": (lambda c: c["dmtp"].update(injection="nine_anchors"), None,
                        "{d}/config.json: unknown injection variant 'nine_anchors'"),
    "missing injection tensor": (None, lambda t: t.pop("dmtp_injection.fusion.proj.weight"),
                                 "{d}/model.safetensors: missing tensor dmtp_injection.fusion.proj.weight of "
                                 "injection dual_anchor_zero_init"),
    "extra injection tensor": (None, lambda t: t.update({"dmtp_injection.extra": torch.zeros(2)}),
                               "{d}/model.safetensors: unexpected tensor dmtp_injection.extra, which injection "
                               "dual_anchor_zero_init does not have"),
    "mis-shaped injection tensor": (None, lambda t: t.update({"dmtp_injection.fusion.proj.weight": torch.zeros(3, 5)}),
                                    "{d}/model.safetensors: tensor dmtp_injection.fusion.proj.weight has shape (3, 5)"),
}


@pytest.mark.parametrize("case", list(TAMPERED))
def test_a_tampered_drafter_is_one_line_naming_its_file(case, micro_target, micro_target_dir, tmp_path,
                                                        monkeypatch, capsys):
    d = tmp_path / "drafter"
    fresh_drafter_for(micro_target, "dual_anchor_zero_init", 3).save(d)
    edit_config, edit_tensors, message = TAMPERED[case]
    if edit_config:
        _edit_config(d, edit_config)
    if edit_tensors:
        _edit_tensors(d, edit_tensors)
    code, line, out = _infer([f"target.path={micro_target_dir}", f"drafter={d}", "methods=[ar,drafter]"],
                             tmp_path, monkeypatch, capsys)
    assert code == 2 and line.startswith("dmtp.infer: error: " + message.format(d=d)), line
    assert not (tmp_path / "run" / "metrics.json").exists()


def test_the_injection_tensor_names_used_above_exist(micro_target):
    names = fresh_drafter_for(micro_target, "dual_anchor_zero_init", 3).injection.state_dict()
    assert list(names)[0] == "fusion.norm_embedding.weight" and "fusion.proj.weight" in names


# -- prompt files ----------------------------------------------------------------------------------

def test_fewer_prompts_than_asked_is_said(tmp_path, micro_target_dir, monkeypatch, capsys):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"x = {i}"}) + "\n" for i in range(3)))
    code, _, out = infer_cli([f"target.path={micro_target_dir}", "methods=[ar]", "eval.name=prompts",
                              f"eval.path={path}", "num_prompts=8", "max_new_tokens=2"], tmp_path / "run",
                             monkeypatch, capsys)
    assert code == 0 and f"[dmtp] {path} holds 3 prompt(s), fewer than num_prompts=8: decoding 3" in out


def test_an_empty_prompt_names_its_file_and_line(tmp_path, micro_target_dir, monkeypatch, capsys):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "x = 1"}) + "\n\n" + json.dumps({"prompt": ""}) + "\n")
    code, line, _ = infer_cli([f"target.path={micro_target_dir}", "methods=[ar]", "eval.name=prompts",
                               f"eval.path={path}", "max_new_tokens=2"], tmp_path / "run", monkeypatch, capsys)
    assert (code, line) == (2, f"dmtp.infer: error: {path} line 3: empty prompt (prompts/1 encodes to no tokens); "
                               "give it text to continue, or remove the record")
