"""A random-weight target with a named real model's shapes and its native MTP in the family's own layout,
for benchmarks only: random weights make acceptance meaningless and timings real.

    python -m dmtp.tiny.random_target --shape qwen3-8b --out /dev/shm/qwen3-8b-random           # on a GPU
    python -m dmtp.tiny.random_target --shape qwen3.5-27b --tiny --out /tmp/hybrid                 # CPU-sized
    python -m dmtp.tiny.random_target --shape deepseek-v3 --layers 4 --set n_routed_experts=64 --out DIR

Writes a Hugging Face checkpoint directory: config.json (the family's transformers config, with its MTP
keys), ~1 GiB safetensors shards + model.safetensors.index.json, the MTP where the family keeps it
(`dmtp.tiny.real_shapes`), the micro target's tokenizer (its ~2k ids are all below any real vocabulary:
prompts encode, ids past it decode to ''), and random_target.json (what was drawn, how long it took).
Loadable by `target.path=` in dmtp.train / dmtp.infer, by `tools/bench/bench_decode.py --target` and by the
strict MTP loader.

Weights are drawn directly on --device (the GPU where there is one: no transformers init, no host-side
random numbers), tensor by tensor, copied to host and written in shards, several shards at a time.
Matrices ~ N(0, 0.02), norm weights 1, biases 0, DeltaNet A_log ~ U(0, log 16) and dt_bias 1. The EOS
row of lm_head is zero, so EOS never wins the argmax and random requests decode their whole budget.
"""
from __future__ import annotations

import argparse
import math
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import yaml

from dmtp.atomic_io import publish_directory, staging_directory, write_json
from dmtp.tiny.real_shapes import SHAPES, shape_config

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
NOTE = "random weights: acceptance lengths mean nothing here, times per round are real"
INDEX_NAME = "model.safetensors.index.json"
MTP_APART_NAME = "mtp.safetensors"


def hf_config(model_type: str, cfg: dict):
    """transformers' config object of the family (its defaults fill what `cfg` leaves out)."""
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **cfg)


def _meta_state(config) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Name -> (shape, dtype) of every tensor transformers' class of `config` holds, built on the meta device."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return {k: (tuple(v.shape), v.dtype) for k, v in model.state_dict().items()}


def saved_names(state: dict) -> dict:
    """Packed expert tensors (transformers' in-memory layout) as releases store them, one per expert:
    experts.gate_up_proj [E, 2I, H] -> experts.{e}.gate_proj / up_proj [I, H];
    experts.down_proj [E, H, I] -> experts.{e}.down_proj [H, I]. Everything else as is."""
    out = {}
    for name, (shape, dtype) in state.items():
        if name.endswith("experts.gate_up_proj") and len(shape) == 3:
            prefix = name[: -len("gate_up_proj")]
            for e in range(shape[0]):
                for part in ("gate_proj", "up_proj"):
                    out[f"{prefix}{e}.{part}.weight"] = ((shape[1] // 2, shape[2]), dtype)
        elif name.endswith("experts.down_proj") and len(shape) == 3:
            prefix = name[: -len("down_proj")]
            for e in range(shape[0]):
                out[f"{prefix}{e}.down_proj.weight"] = ((shape[1], shape[2]), dtype)
        else:
            out[name] = (shape, dtype)
    return out


def _qwen_mtp_names(cfg: dict) -> dict:
    """`mtp.*` names and shapes of the family's MTP, as dmtp's strict loader builds it."""
    from torch import nn

    from dmtp.families.catalogue import mtp_family_of
    from dmtp.families.mtp_loading import build_native_mtp

    with torch.device("meta"):
        embed = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
        mtp = build_native_mtp(mtp_family_of(cfg["model_type"]), cfg, embed, head)
    return {f"mtp.{k}": (tuple(v.shape), torch.float32) for k, v in mtp.state_dict().items()}


def tensor_plan(model_type: str, cfg: dict, layout: str) -> tuple[object, dict, dict]:
    """-> (transformers config, {name: (shape, dtype)} of the causal LM, {name: (shape, dtype)} of the MTP),
    names as the family's releases store them."""
    config = hf_config(model_type, cfg)
    full = config.to_dict()
    if layout == "next_layer":
        layers = cfg["num_hidden_layers"]
        # The MTP block is the family's own decoder layer with index L: take it from a one-layer-deeper twin.
        twin = saved_names(_meta_state(hf_config(model_type, {**cfg, "num_hidden_layers": layers + 1})))
        prefix = f"model.layers.{layers}."
        model = {k: v for k, v in twin.items() if not k.startswith(prefix)}
        h, vocab = cfg["hidden_size"], cfg["vocab_size"]
        mtp = {k: v for k, v in twin.items() if k.startswith(prefix)}
        mtp.update({prefix + "eh_proj.weight": ((h, 2 * h), torch.float32), prefix + "enorm.weight": ((h,), torch.float32),
                    prefix + "hnorm.weight": ((h,), torch.float32),
                    prefix + "shared_head.norm.weight": ((h,), torch.float32),
                    prefix + "embed_tokens.weight": ((vocab, h), torch.float32),
                    prefix + "shared_head.head.weight": ((vocab, h), torch.float32)})
    else:
        model = saved_names(_meta_state(config))
        mtp = _qwen_mtp_names({**full, "model_type": model_type})
    return config, model, mtp


def draw(name: str, shape, dtype: torch.dtype, device, gen: torch.Generator) -> torch.Tensor:
    """One tensor's random values, drawn on `device` (see the module docstring for the rules)."""
    t = torch.empty(shape, dtype=dtype, device=device)
    leaf = name.rsplit(".", 2)[-2:]
    if name.endswith("A_log"):
        return t.uniform_(0.0, math.log(16.0), generator=gen)
    if name.endswith("dt_bias") or (len(shape) == 1 and "norm" in name):
        return t.fill_(1.0)
    if len(shape) == 1 or leaf[-1] == "bias" or name.endswith("e_score_correction_bias"):
        return t.zero_()
    return t.normal_(0.0, 0.02, generator=gen)


def plan_shards(names: dict, dtype: torch.dtype, shard_bytes: int) -> list[list[str]]:
    """Names in order, cut into shards of about `shard_bytes`."""
    shards, current, size = [], [], 0
    item = torch.tensor([], dtype=dtype).element_size()
    for name in sorted(names, key=_layer_order):
        n = math.prod(names[name][0]) * item
        if current and size + n > shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(name)
        size += n
    if current:
        shards.append(current)
    return shards


def _layer_order(name: str):
    """Embedding first, then layer by layer (numerically), then the rest, then `mtp.*`: shards hold whole
    layers in order, the MTP last (as the releases store it)."""
    if name.startswith("mtp."):
        return (3, 0, name)
    parts = name.split(".")
    if "layers" in parts:
        i = parts.index("layers")
        if i + 1 < len(parts) and parts[i + 1].isdigit():
            return (1, int(parts[i + 1]), name)
    return (0 if "embed" in name else 2, 0, name)


def write_random_target(shape: str, out: str | Path, *, tiny: bool = False, layers: int | None = None,
                        overrides: dict | None = None, device: str = "auto", dtype: str = "bfloat16",
                        shard_gb: float = 1.0, writers: int = 4, seed: int = 0, tokenizer: str | Path | None = None,
                        progress: bool = True) -> Path:
    """Write the checkpoint (see the module docstring); returns its directory."""
    spec = SHAPES[shape] if shape in SHAPES else None
    cfg = shape_config(shape, tiny=tiny, layers=layers, overrides=overrides)
    dev = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device)
    wdtype = getattr(torch, dtype)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty")
    started = time.perf_counter()
    tok_dir = Path(tokenizer) if tokenizer else _micro_tokenizer()
    eos = _eos_id(tok_dir)
    cfg.update(eos_token_id=eos, bos_token_id=eos, pad_token_id=eos)
    config, model_names, mtp_names = tensor_plan(spec.model_type, cfg, spec.mtp_layout)
    if eos >= cfg["vocab_size"]:
        raise ValueError(f"the tokenizer's EOS id {eos} is outside the vocabulary ({cfg['vocab_size']})")
    listed = dict(model_names) if spec.mtp_layout == "mtp_apart" else {**model_names, **mtp_names}
    shards = plan_shards(listed, wdtype, int(shard_gb * 2**30))
    files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    jobs = list(zip(files, shards)) + ([(MTP_APART_NAME, sorted(mtp_names))] if spec.mtp_layout == "mtp_apart" else [])

    staging = staging_directory(out)
    gen = torch.Generator(device=dev).manual_seed(seed)
    try:
        drawn_s = _draw_and_save(jobs, {**model_names, **mtp_names}, wdtype, dev, gen, eos, staging, writers, progress)
        weight_map = {name: fname for fname, names in zip(files, shards) for name in names}
        total = sum(math.prod(listed[n][0]) for n in listed) * torch.tensor([], dtype=wdtype).element_size()
        write_json(staging / INDEX_NAME, {"metadata": {"total_size": total}, "weight_map": weight_map})
        _write_config(staging, config, spec, dtype)
        _copy_tokenizer(tok_dir, staging)
        params = {"model": sum(math.prod(s) for s, _ in model_names.values()),
                  "mtp": sum(math.prod(s) for s, _ in mtp_names.values())}
        apart = params["mtp"] * torch.tensor([], dtype=wdtype).element_size() if spec.mtp_layout == "mtp_apart" else 0
        report = {"shape": shape, "tiny": tiny, "note": NOTE, "model_type": spec.model_type,
                  "mtp_layout": spec.mtp_layout, "config_overrides": {"layers": layers, **(overrides or {})},
                  "parameters": params, "dtype": dtype, "bytes": total + apart,
                  "files": len(jobs), "device": str(dev), "seed": seed, "tokenizer": str(tok_dir),
                  "eos_token_id": eos, "draw_s": round(drawn_s, 1), "seconds": round(time.perf_counter() - started, 1)}
        write_json(staging / "random_target.json", report)
        if out.exists():
            _move_into(staging, out)
        else:
            publish_directory(staging, out)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    if progress:
        print(f"[random_target] {shape}{' (tiny)' if tiny else ''}: {params['model'] / 1e9:.2f}B + MTP "
              f"{params['mtp'] / 1e9:.3f}B parameters, {report['bytes'] / 1e9:.1f} GB {dtype} in {len(jobs)} files "
              f"at {out} in {report['seconds']} s (drawn on {dev}). {NOTE}.", flush=True)
    return out


def _draw_and_save(jobs: list, every: dict, wdtype: torch.dtype, dev: torch.device, gen: torch.Generator, eos: int,
                   staging: Path, writers: int, progress: bool) -> float:
    """Draw each file's tensors in order (one generator: the bytes follow the seed) and save them on `writers`
    threads; returns the seconds spent drawing."""
    from safetensors.torch import save_file

    drawn_s = 0.0
    pending = []
    with ThreadPoolExecutor(max_workers=max(1, writers)) as pool:
        for fname, names in jobs:
            t0 = time.perf_counter()
            tensors = {}
            for name in names:
                t = draw(name, every[name][0], wdtype, dev, gen)   # in the written dtype: no fp32 copy
                if name.endswith(("lm_head.weight", "shared_head.head.weight")):
                    t[eos].zero_()   # EOS never wins: random requests decode their whole budget
                tensors[name] = t.cpu()
            drawn_s += time.perf_counter() - t0
            # At most `writers` shards in host memory at once: wait for the oldest before drawing more.
            while len(pending) >= max(1, writers):
                pending.pop(0).result()
            pending.append(pool.submit(save_file, tensors, str(staging / fname), {"format": "pt"}))
            if progress:
                print(f"[random_target] {fname}: {len(names)} tensors "
                      f"({sum(t.numel() * t.element_size() for t in tensors.values()) / 2**30:.2f} GiB)", flush=True)
        for p in pending:
            p.result()
    return drawn_s


def _copy_tokenizer(tok_dir: Path, staging: Path) -> None:
    for name in TOKENIZER_FILES:
        if (tok_dir / name).exists():
            shutil.copy2(tok_dir / name, staging / name)


def _move_into(staging: Path, out: Path) -> None:
    """`out` exists and is empty (e.g. a mount point): move the files in."""
    for f in staging.iterdir():
        f.replace(out / f.name)


def _write_config(directory: Path, config, spec, dtype: str) -> None:
    cfg = config.to_dict()
    arch = {"qwen3": "Qwen3ForCausalLM", "qwen3_5_text": "Qwen3_5ForCausalLM",
            "deepseek_v3": "DeepseekV3ForCausalLM"}[spec.model_type]
    cfg.update(architectures=[arch], dtype=dtype)
    if spec.mtp_layout != "next_layer":   # the keys the Qwen3.5 releases (and the embedded targets) carry
        cfg.update(mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False)
    write_json(directory / "config.json", cfg, sort_keys=True)


def _micro_tokenizer() -> Path:
    from dmtp.tiny.targets import ensure_tiny_target

    return ensure_tiny_target("micro", progress=False)


def _eos_id(tok_dir: Path) -> int:
    from dmtp.models.target import load_tokenizer

    tok = load_tokenizer(tok_dir)
    if tok.eos_token_id is None:
        raise ValueError(f"the tokenizer in {tok_dir} has no EOS token")
    return int(tok.eos_token_id)


def _overrides(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValueError(f"--set takes key=value (a config key), got {item!r}")
        out[key] = yaml.safe_load(value)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES), help="the real model whose shapes to take")
    ap.add_argument("--out", required=True, help="output directory (new, or empty)")
    ap.add_argument("--tiny", action="store_true", help="the shape's small CPU version (tests)")
    ap.add_argument("--layers", type=int, default=None, help="num_hidden_layers (scale down the depth)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="any other config key, e.g. --set hidden_size=1024 --set n_routed_experts=64")
    ap.add_argument("--device", default="auto", help="where the weights are drawn (auto: cuda if available)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--shard-gb", type=float, default=1.0, help="GiB per safetensors shard")
    ap.add_argument("--writers", type=int, default=4, help="shards written (and held in host memory) at once")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", default=None, help="a directory with tokenizer files (default: the micro target's)")
    args = ap.parse_args(argv)
    try:
        if args.shard_gb <= 0:
            raise ValueError(f"--shard-gb must be positive, got {args.shard_gb}")
        write_random_target(args.shape, args.out, tiny=args.tiny, layers=args.layers, overrides=_overrides(args.set),
                            device=args.device, dtype=args.dtype, shard_gb=args.shard_gb, writers=args.writers,
                            seed=args.seed, tokenizer=args.tokenizer)
    except (ValueError, FileExistsError, FileNotFoundError) as e:
        print(f"random_target: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
