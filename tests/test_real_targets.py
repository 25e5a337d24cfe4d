"""End to end on tiny random checkpoints of the real MTP-bearing families (issue: real checkpoints).

Each checkpoint is a whole model written the way its family publishes it: transformers' own class of
the real `model_type` saves the main model (Qwen3.5/3.6: the multimodal `Qwen3_5*ForConditionalGeneration`
with `text_config` and `model.language_model.*`), and the MTP tensors are added under the family's
names (`mtp.*` or `model.layers.{L}.*`). The micro target's tokenizer is copied in, so the embedded
corpora tokenise as usual. On each: `dmtp.train` runs 2 steps and `dmtp.infer` decodes, greedy output
identical to the target's own. The Qwen3.5 targets are hybrid (gated-DeltaNet + full attention), so
their decoding also checks exactness against transformers' cached `generate()` with rejections.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dmtp.configs import compose_config, compose_train
from dmtp.decode.loop import build_proposer
from dmtp.families.decoding import spec_decoder
from dmtp.drafters.block_drafter import fresh_drafter_for, load_block_drafter
from scripted_proposer import ScriptedProposer
from dmtp.families.catalogue import make_target_runner
from dmtp.families.hybrid import HybridTargetRunner
from dmtp.families.mtp_loading import MTPLoadError, load_native_mtp
from dmtp.inference.compare import compare_methods as infer_run
from dmtp.models.target import TargetModel
from dmtp.training.components import build_components
from dmtp.training.job import train
from test_mtp_loading import qwen_mtp_tensors

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")

# Qwen3.5 text dimensions shared with test_mtp_loading's `mtp.*` tensors (hidden 32, 4 heads x 16, 2 kv).
QWEN_TEXT = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=4,
                 layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
                 linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
                 linear_conv_kernel_dim=4, max_position_embeddings=512, tie_word_embeddings=False, rms_norm_eps=1e-6,
                 mtp_num_hidden_layers=1)
QWEN_VISION = dict(depth=1, hidden_size=16, num_heads=2, intermediate_size=32, out_hidden_size=32)
DS_COMMON = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, n_routed_experts=8, num_experts_per_tok=2,
                 n_shared_experts=1, moe_intermediate_size=12, intermediate_size=40, first_k_dense_replace=1,
                 routed_scaling_factor=2.5, norm_topk_prob=True, max_position_embeddings=512,
                 num_nextn_predict_layers=1, tie_word_embeddings=False)


def _copy_tokenizer(src: Path, dst: Path) -> None:
    for name in TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copy(src / name, dst / name)


def _vocab_size(tokenizer_dir: Path) -> int:
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(str(tokenizer_dir)))


def _sharpen_(model: torch.nn.Module) -> None:
    """Random init at std 0.02 gives near-uniform next-token distributions; larger weights give a
    target with preferences, so drafts get both accepted and rejected."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 and "embed" not in name:
                p.mul_(4.0)


def write_qwen35(root: Path, tokenizer_dir: Path, moe: bool, packed: bool = True) -> Path:
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration, Qwen3_5MoeConfig, \
        Qwen3_5MoeForConditionalGeneration

    torch.manual_seed(0)
    vocab = _vocab_size(tokenizer_dir)
    text = dict(QWEN_TEXT, vocab_size=vocab)
    if moe:
        text.update(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=12, shared_expert_intermediate_size=20,
                    norm_topk_prob=True)
        config = Qwen3_5MoeConfig(text_config=text, vision_config=QWEN_VISION, tie_word_embeddings=False)
        model = Qwen3_5MoeForConditionalGeneration(config)
    else:
        text.update(intermediate_size=48)
        config = Qwen3_5Config(text_config=text, vision_config=QWEN_VISION, tie_word_embeddings=False)
        model = Qwen3_5ForConditionalGeneration(config)
    _sharpen_(model)
    model.save_pretrained(root)
    _add_tensors(root, qwen_mtp_tensors(moe, packed))
    _copy_tokenizer(tokenizer_dir, root)
    return root


def write_deepseek_family(root: Path, tokenizer_dir: Path, family: str) -> Path:
    """Main model from transformers' class; the MTP block is a decoder layer with index
    num_hidden_layers (taken from a one-layer-deeper twin, so it is the family's own layer) plus
    enorm/hnorm/eh_proj/shared_head, stored as `model.layers.{L}.*`."""
    torch.manual_seed(0)
    vocab = _vocab_size(tokenizer_dir)
    if family == "deepseek_v3":
        from transformers import DeepseekV3Config as Config, DeepseekV3ForCausalLM as Model

        extra = dict(num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
                     v_head_dim=8, n_group=2, topk_group=1, rms_norm_eps=1e-6)
    else:
        from transformers import Glm4MoeConfig as Config, Glm4MoeForCausalLM as Model

        extra = dict(num_key_value_heads=2, head_dim=16, partial_rotary_factor=0.5, use_qk_norm=True,
                     attention_bias=True, n_group=1, topk_group=1, rms_norm_eps=1e-5)
    kwargs = dict(DS_COMMON, vocab_size=vocab, **extra)
    layers = kwargs["num_hidden_layers"]
    twin = Model(Config(**dict(kwargs, num_hidden_layers=layers + 1)))
    _sharpen_(twin)
    model = Model(Config(**kwargs))
    model.load_state_dict({k: v for k, v in twin.state_dict().items() if not k.startswith(f"model.layers.{layers}.")})
    model.save_pretrained(root)
    prefix = f"model.layers.{layers}."
    saved_layer = {k: v for k, v in _saved_state(twin).items() if k.startswith(prefix)}
    h = kwargs["hidden_size"]
    gen = torch.Generator().manual_seed(1)
    mtp = {prefix + "enorm.weight": 1 + 0.1 * torch.randn(h, generator=gen),
           prefix + "hnorm.weight": 1 + 0.1 * torch.randn(h, generator=gen),
           prefix + "eh_proj.weight": torch.randn(h, 2 * h, generator=gen) / (2 * h) ** 0.5 * 2,
           prefix + "shared_head.norm.weight": 1 + 0.1 * torch.randn(h, generator=gen),
           prefix + "embed_tokens.weight": model.model.embed_tokens.weight.detach().clone(),
           prefix + "shared_head.head.weight": model.lm_head.weight.detach().clone()}
    _add_tensors(root, {**saved_layer, **mtp})
    _copy_tokenizer(tokenizer_dir, root)
    return root


def _saved_state(model) -> dict:
    """The tensors as `save_pretrained` names them (per-expert or packed, whatever this transformers writes)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        return _read_all(Path(tmp))


def _read_all(root: Path) -> dict:
    out = {}
    for f in sorted(root.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _add_tensors(root: Path, extra: dict) -> None:
    """Add tensors to a single-file checkpoint, keeping its metadata (format=pt)."""
    files = sorted(root.glob("*.safetensors"))
    assert len(files) == 1, files
    tensors = load_file(str(files[0]))
    tensors.update({k: v.contiguous() for k, v in extra.items()})
    save_file(tensors, str(files[0]), metadata={"format": "pt"})


FAMILIES = {
    "qwen3_5-dense": lambda root, tok: write_qwen35(root, tok, moe=False),
    "qwen3_5_moe-packed": lambda root, tok: write_qwen35(root, tok, moe=True, packed=True),
    "qwen3_5_moe-per_expert": lambda root, tok: write_qwen35(root, tok, moe=True, packed=False),
    "deepseek_v3": lambda root, tok: write_deepseek_family(root, tok, "deepseek_v3"),
    "glm4_moe": lambda root, tok: write_deepseek_family(root, tok, "glm4_moe"),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_ckpt(request, tmp_path_factory, micro_target_dir):
    root = tmp_path_factory.mktemp("real") / request.param
    return request.param, FAMILIES[request.param](root, micro_target_dir)


def _train_overrides(root: Path) -> list[str]:
    return ["target=local", f"target.path={root}", "target.dtype=float32", "injection=dual_anchor_zero_init",
            "recipe=greedy", "trainer.max_steps=2",
            "trainer.val_check_interval=2", "data.max_examples=8", "data.val_prompts=1", "data.val_new_tokens=8",
            "decode_eval.enabled=false"]


def test_family_trains_two_steps_and_decodes_losslessly(family_ckpt, tmp_path):
    name, root = family_ckpt
    summary = train(compose_train(_train_overrides(root), output_dir=tmp_path / "train"))
    assert summary["global_step"] == 2
    drafter_dir = tmp_path / "train" / "drafter"
    drafter, meta = load_block_drafter(drafter_dir)
    assert meta["injection"] == "dual_anchor_zero_init" and drafter.injection.uses_mtp

    out = tmp_path / "infer"
    cfg = compose_config("infer", [f"target.path={root}", f"drafter.path={drafter_dir}", f"output_dir={out}",
                                   "num_prompts=2", "max_new_tokens=10", "batch_size=2", "eval.prompt_tokens=12",
                                   "eval.domains=[code,math]", "progress=false"])
    infer_run(cfg)
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["overall"]) == {"ar", "mtp415", drafter.method_name}
    for method, stats in metrics["overall"].items():
        assert stats["matches_ar"] == 1.0, f"{name}: {method} differs from the target's greedy output"


@pytest.fixture(scope="module")
def hybrid_target(tmp_path_factory, micro_target_dir):
    root = write_qwen35(tmp_path_factory.mktemp("hybrid") / "qwen3_5", micro_target_dir, moe=False)
    return root, TargetModel.from_pretrained(root)


def _hf_greedy(target: TargetModel, prompt: list[int], n: int) -> list[int]:
    """transformers' own cached greedy decoding: the recurrent states advance token by token."""
    ids = torch.tensor([prompt])
    out = target.hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("method", ["scripted", "mtp415", "drafter"])
def test_hybrid_target_is_exact_with_rejections(hybrid_target, method):
    """Gated-DeltaNet layers carry recurrent state; after a rejection decoding must continue from
    the accepted prefix only. Reference: transformers' cached greedy `generate()`, one prompt at a
    time. `scripted` proposes the reference continuation with candidate 3 corrupted, so every round
    accepts exactly 2 of 7 and rejects the rest (partial acceptance, the case rollback must get right);
    the real proposers (random MTP, untrained drafter) get everything rejected or accepted by chance."""
    root, target = hybrid_target
    types = target.config.layer_types
    assert "linear_attention" in types and "full_attention" in types
    assert isinstance(make_target_runner(target), HybridTargetRunner)   # the static-cache hybrid runner serves them
    gen = torch.Generator().manual_seed(5)
    vocab = target.config.vocab_size
    prompts = [torch.randint(5, vocab, (n,), generator=gen).tolist() for n in (9, 14, 6)]
    new = 20
    refs = [_hf_greedy(target, p, new) for p in prompts]
    if method == "scripted":
        proposer = ScriptedProposer(refs, 7, corrupt_at=3, vocab_size=vocab)
    else:
        mtp = load_native_mtp(root, target.embed_tokens, target.lm_head)
        drafter = None
        if method == "drafter":
            drafter = fresh_drafter_for(target, "dual_anchor_zero_init", mask_token_id=3, perturb=0.5)
        proposer = build_proposer(method, target, mtp=mtp, drafter=drafter)
    result = spec_decoder(target, proposer, eos_token_id=None).generate(prompts, max_new_tokens=new)
    assert result.tokens == refs
    if method == "scripted":
        for per_request in result.accepted:
            assert per_request[:-1] == [2] * (len(per_request) - 1)   # last round: cut by the budget


def test_variant_needing_mtp_on_a_target_without_mtp_is_one_clear_error(tmp_path, micro_target_dir):
    root = tmp_path / "no_mtp"
    root.mkdir()
    for f in Path(micro_target_dir).iterdir():
        if f.is_file() and f.name != "mtp.safetensors":   # the MTP's own file
            shutil.copy(f, root / f.name)
    state = load_file(str(root / "model.safetensors"))
    save_file({k: v for k, v in state.items() if not k.startswith("mtp.")}, str(root / "model.safetensors"),
              metadata={"format": "pt"})
    config = json.loads((root / "config.json").read_text())
    config.pop("mtp_num_hidden_layers", None)
    (root / "config.json").write_text(json.dumps(config))
    with pytest.raises(MTPLoadError, match="no MTP") as err:
        build_components(compose_train(["target=local", f"target.path={root}", "target.dtype=float32"]))
    assert "\n" not in str(err.value)
    # The same target is fine for a variant that does not use the MTP.
    build_components(compose_train(["target=local", f"target.path={root}", "target.dtype=float32",
                                    "injection=raw_dflash"]))


@pytest.mark.parametrize("module,args,expected", [
    ("dmtp.train", ["target=local", "target.path=/no/such/target"], "dmtp.train: error: target checkpoint not found"),
    ("dmtp.infer", ["target.path=/no/such/target", "methods=[ar]"], "dmtp.infer: error: target checkpoint not found"),
])
def test_cli_bad_input_is_one_line(module, args, expected, tmp_path):
    """At the command line a bad input ends with one line on stderr and exit status 2, no traceback."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", module, *args, f"hydra.run.dir={tmp_path}"], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(expected)
