"""Build (once) and cache the embedded targets: tokenizer + causal LM + native MTP layer
(the command is `python -m dmtp.tiny.build`).

The result is a normal Hugging Face checkpoint directory: config.json (with mtp_num_hidden_layers),
the weights, tokenizer files and build_report.json. The native MTP is stored under `mtp.*` (Qwen3.5
naming) where the preset says (`mtp_apart`):
- dense Qwen3 (`tiny`, `micro`, `micro_vllm`): model.safetensors holds the causal LM alone, listed by
  model.safetensors.index.json, and mtp.safetensors the MTP: engines that load the causal LM alone
  (transformers; vLLM, which reads only the files an index lists) load the directory as is;
- Qwen3.5 (`*_hybrid`): one model.safetensors with both, as the Qwen3.5 releases.
dmtp's MTP loader reads either strictly.
"""
from __future__ import annotations

import hashlib
import json
import platform
import random
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch
import transformers
from transformers import PreTrainedModel

from dmtp.atomic_io import (publish_directory, remove_stale_temporaries, save_safetensors, staging_directory,
                            write_json)
from dmtp.data.corpora import DOMAINS, documents, encode_documents
from dmtp.models.mtp import NativeMTP
from dmtp.models.mtp_checkpoint import MTP_FILE_NAME
from dmtp.models.safe_weights import SAFE_WEIGHTS_NAMES
from dmtp.models.target import TargetModel
from dmtp.paths import targets_dir
from dmtp.tiny.architectures import build_model
from dmtp.tiny.presets import TinyPreset, get_preset
from dmtp.tiny.pretrain import DomainStreams, evaluate, pretrain
from dmtp.tiny.tokenizer import train_tokenizer

BUILD_VERSION = 1
WEIGHTS_NAME, WEIGHTS_INDEX_NAME = SAFE_WEIGHTS_NAMES


def default_target_dir(preset: str) -> Path:
    """Cache directory named after the preset's content, so a changed preset never reuses a stale build."""
    spec = get_preset(preset)
    # The on-disk layout is part of the key: targets built before the MTP moved to its own file rebuild.
    layout = "mtp-apart" if spec.mtp_apart else ""
    # So is the recipe's corpus and chained MTP loss, named only when not the base testbed's (its names stay).
    if (spec.corpus, spec.mtp_chain_depth) != ("stdlib", 1):
        layout += f"{spec.corpus}-chain{spec.mtp_chain_depth}"
    digest = hashlib.sha1(f"{BUILD_VERSION}{asdict(spec)}{layout}".encode()).hexdigest()[:8]
    return targets_dir() / f"{preset}-{digest}"


def ensure_tiny_target(preset: str = "tiny", out_dir: str | Path | None = None, progress: bool = True) -> Path:
    """Return the cached target directory; on first use unpack the build the package ships for it
    (dmtp.tiny.shipped: the same weights on every machine), else build it."""
    from dmtp.tiny.shipped import unpack_shipped

    path = Path(out_dir) if out_dir else default_target_dir(preset)
    if (path / "build_report.json").exists():
        return path
    if out_dir is None and unpack_shipped(path, progress=progress) is not None:
        return path
    return build_tiny_target(preset, path, progress=progress, keep_existing=True)


def load_target(path: str | None = None, preset: str = "tiny", dtype: str = "float32", device: str = "cpu",
                trust_remote_code: bool = False, attn_implementation: str | None = "sdpa") -> TargetModel:
    """Hydra entry point (conf/target): a checkpoint path, or (path=None) the embedded tiny target of `preset`,
    built on first use and cached.

    It lives here, above dmtp.models, so the runtime never imports its builder."""
    if path is None:
        path = str(ensure_tiny_target(preset))
    return TargetModel.from_pretrained(path, dtype=getattr(torch, dtype), device=device,
                                       trust_remote_code=trust_remote_code, attn_implementation=attn_implementation)


def _tokenizer_sample(docs: dict[str, list], chars: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    sample = []
    for domain in DOMAINS:
        pool = list(docs[domain])
        rng.shuffle(pool)
        budget = chars // len(DOMAINS)
        for doc in pool:
            text = doc.text
            if budget <= 0:
                break
            sample.append(text[:budget])
            budget -= len(text)
    return sample


def _encode(tok, docs: list) -> torch.Tensor:
    """One stream: each document's tokens (an exchange's request and response encoded apart), then EOS."""
    ids = []
    for enc in encode_documents(tok, docs):
        ids.extend(enc)
        ids.append(tok.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def build_tiny_target(preset_name: str, out_dir: str | Path, progress: bool = True,
                      keep_existing: bool = False) -> Path:
    """Build into a staging directory, then move it to `out_dir`. keep_existing: if another process
    finished the same build meanwhile, keep its copy (it may be in use) and drop this one."""
    preset: TinyPreset = get_preset(preset_name)
    out_dir = Path(out_dir)
    started = time.perf_counter()
    torch.manual_seed(preset.seed)
    if progress:
        print(f"[dmtp] building the {preset.name} target into {out_dir} (once; it is cached and reused)")

    train_docs = {d: documents(d, "train", preset.corpus)[: preset.docs_per_domain] for d in DOMAINS}
    val_docs = {d: documents(d, "validation", preset.corpus)[: preset.docs_per_domain] for d in DOMAINS}

    remove_stale_temporaries(out_dir.parent)   # what a killed build left
    staging = staging_directory(out_dir)
    try:
        tok = train_tokenizer(_tokenizer_sample(train_docs, preset.tokenizer_chars, preset.seed),
                              preset.vocab_size, staging)
        train_streams = {d: _encode(tok, train_docs[d]) for d in DOMAINS}
        val_streams = {d: _encode(tok, val_docs[d]) for d in DOMAINS}

        model, mtp = build_model(preset, len(tok), tok.eos_token_id)

        weights = dict(zip(DOMAINS, preset.domain_weights))
        data = DomainStreams(train_streams, weights, preset.seq_len, preset.seed)
        stats = pretrain(model, mtp, data, preset, progress=progress)
        report = {"preset": preset.name, "build_version": BUILD_VERSION, "architecture": type(model).__name__,
                  "corpus": preset.corpus, "mtp_chain_depth": preset.mtp_chain_depth,
                  "parameters": sum(p.numel() for p in model.parameters()),
                  "mtp_parameters": sum(p.numel() for p in mtp.parameters()),
                  **stats, "heldout": evaluate(model, mtp, val_streams, preset.seq_len)}
        save_target(model, mtp, staging, preset.mtp_apart)
        report.update(provenance(staging))
        report["build_seconds"] = round(time.perf_counter() - started, 1)
        write_json(staging / "build_report.json", report)
        if not (keep_existing and (out_dir / "build_report.json").exists()):
            if out_dir.exists():
                shutil.rmtree(out_dir)
            publish_directory(staging, out_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    if progress:
        print(f"[dmtp] {preset.name} target ready at {out_dir} ({report['build_seconds']} s); "
              f"held-out: {json.dumps(report['heldout'])}")
    return out_dir


def provenance(target_dir: Path) -> dict:
    """What tells two builds of one recipe apart: the target's name keys its recipe, but another torch
    (its CPU kernels sum in another order over the build's steps) trains other weights from it."""
    return {"built_with": {"python": platform.python_version(), "torch": torch.__version__,
                           "transformers": transformers.__version__},
            "weights_sha256": {f.name: hashlib.sha256(f.read_bytes()).hexdigest()
                               for f in sorted(Path(target_dir).glob("*.safetensors"))}}


def save_target(model: PreTrainedModel, mtp: NativeMTP, out_dir: Path, mtp_apart: bool) -> None:
    """The causal LM's tensors in model.safetensors and the MTP's under `mtp.*` (Qwen3.5 naming): in
    mtp.safetensors with an index listing model.safetensors alone when `mtp_apart`, else beside them;
    config.json with the MTP keys the Qwen3.5 releases carry.

    The index is what keeps the MTP apart: without one, vLLM loads every `*.safetensors` in the
    directory, and its dense Qwen3 refuses tensors it has no module for."""
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    mtp_tensors = {f"mtp.{k}": v.detach().contiguous() for k, v in mtp.state_dict().items()}
    if mtp_apart:
        save_safetensors(out_dir / MTP_FILE_NAME, mtp_tensors, metadata={"format": "pt"})
        index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
                 "weight_map": {k: WEIGHTS_NAME for k in sorted(tensors)}}
        write_json(out_dir / WEIGHTS_INDEX_NAME, index)
    else:
        tensors.update(mtp_tensors)
    save_safetensors(out_dir / WEIGHTS_NAME, tensors, metadata={"format": "pt"})
    config = model.config.to_dict()
    config.update(architectures=[type(model).__name__], mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False,
                  dtype="float32")
    write_json(out_dir / "config.json", config, sort_keys=True)
    model.generation_config.save_pretrained(str(out_dir))


@torch.no_grad()
def reevaluate_target(path: str | Path) -> dict:
    """Recompute a built target's held-out figures with the current `evaluate` and store them in its
    build_report.json (the weights are untouched)."""
    from dmtp.families.mtp_loading import load_native_mtp
    from dmtp.models.target import TargetModel, load_tokenizer

    path = Path(path)
    report_path = path / "build_report.json"
    if not report_path.exists():
        raise FileNotFoundError(f"{path} is not a built dmtp target (no build_report.json)")
    report = json.loads(report_path.read_text())
    preset = get_preset(report["preset"])
    model = TargetModel.from_pretrained(path).hf
    mtp = load_native_mtp(path, model.model.embed_tokens, model.lm_head).eval()
    tok = load_tokenizer(path)
    val_streams = {d: _encode(tok, documents(d, "validation", preset.corpus)[: preset.docs_per_domain])
                   for d in DOMAINS}
    report["heldout"] = evaluate(model, mtp, val_streams, preset.seq_len)
    write_json(report_path, report)
    return report["heldout"]
