"""The one setup loader of every decoding run: `python -m dmtp.infer`, tools/bench/bench_decode.py,
tools/bench/bench_peer.py and the training job's decode-after.

One piece per function, so that a caller composes what it needs and skips what it holds already (the
training job has its target, MTP and drafter in memory and only builds decoders):

* `placement`: where and in which dtype (the one rule: auto = CUDA in bf16 where there is one, else CPU
  in fp32);
* `load_target`: the target from its conf/target node, instantiated as training does (its `_target_`),
  placed by `placement`, with its tokenizer and end-of-sequence id;
* `load_mtp`: the target's native MTP;
* `load_drafter`: a trained drafter checked against the target, with the MTP it decodes with (its own
  jointly trained one, else the target's);
* `build_decoder`: a method (ar | mtp415 | mtp | mtp:<k> | drafter) as a decoder of the one loop (defined in
  dmtp.families.decoding, where the loop meets the families' runners; the engines import it from there).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch
from omegaconf import OmegaConf

from dmtp.configs import CONF_DIR, instantiate
from dmtp.families.decoding import build_decoder   # re-exported: the loader's decoders (tools, decode-after)
from dmtp.inference.drafter_choice import load_drafter_for, mtp_for_drafter

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def placement(device: str | None = "auto", dtype: str | None = "auto") -> tuple[torch.device, torch.dtype]:
    """-> (device, dtype). auto device: CUDA where there is one, else CPU; auto dtype: bf16 on CUDA, fp32 on CPU.

    A device this machine does not have is one line, before anything loads."""
    if device in (None, "auto"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(str(device))
    except RuntimeError:
        raise ValueError(f"device must be auto, cpu, cuda or cuda:<N>, got {device!r}") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu, cuda or cuda:<N>, got {str(device)!r}")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"device={device} but this machine has no CUDA device (use device=auto or device=cpu)")
        if device.index is not None and device.index >= count:
            raise ValueError(f"device={device} but this machine has {count} CUDA device(s) (cuda:0..cuda:{count - 1})")
    if dtype in (None, "auto"):
        return device, torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    return device, DTYPES[dtype]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def target_config(path: str | None = None, preset: str = "tiny"):
    """conf/target/tiny.yaml with `path` / `preset`: the target node of a caller without Hydra (the tools)."""
    node = OmegaConf.load(Path(CONF_DIR) / "target" / "tiny.yaml")
    node.path, node.preset = path, preset
    return node


@dataclass
class LoadedTarget:
    path: str            # as given (a local directory or a hub id), what the MTP and drafters are read against
    model: object        # dmtp.models.target.TargetModel
    tokenizer: object

    @property
    def eos_token_id(self) -> int | None:
        """The tokenizer's end of sequence, else the target config's."""
        eos = self.tokenizer.eos_token_id
        return eos if eos is not None else self.model.config.eos_token_id


def load_target(target_cfg, device: torch.device, dtype: torch.dtype, path: str | None = None) -> LoadedTarget:
    """Instantiate the conf/target node `target_cfg` (its `_target_`, as training does) on `device` in
    `dtype`; `path` replaces target.path (e.g. the target a drafter was trained against).

    No path: the embedded `preset`, built on first use."""
    from dmtp.models.target import load_tokenizer
    from dmtp.tiny.targets import ensure_tiny_target

    path = str(path or target_cfg.path or ensure_tiny_target(target_cfg.preset, progress=True))
    model = instantiate(target_cfg, path=path, device=str(device), dtype=dtype_name(dtype))
    trust = bool(target_cfg.get("trust_remote_code", False))
    return LoadedTarget(path, model, load_tokenizer(path, trust_remote_code=trust))


def load_mtp(target: LoadedTarget):
    """The target's native MTP (MTPLoadError / FileNotFoundError when it has none that loads)."""
    from dmtp.families.mtp_loading import load_native_mtp

    return load_native_mtp(target.path, target.model.embed_tokens, target.model.lm_head)


@dataclass
class LoadedDrafter:
    model: object        # dmtp.drafters.block_drafter.BlockDrafter
    label: str           # its variant, with decoding-time options: variant[k=v,...]
    path: str
    mtp: object = None   # the MTP it decodes with (None: it uses none, or none was loaded)


def load_drafter(target: LoadedTarget, path, device: torch.device, dtype: torch.dtype, native_mtp=None,
                 injection: str | None = None, options: dict | None = None,
                 block_size: int | None = None) -> LoadedDrafter:
    """The drafter at `path`, checked against the target; an MTP-using one decodes with its own jointly
    trained MTP where its directory has one (one line says so), else with `native_mtp`."""
    model, label = load_drafter_for(target.model, path, dtype, device, injection, options=options,
                                    block_size=block_size)
    return drafter_with_mtp(target, LoadedDrafter(model, label, str(path)), native_mtp)


def drafter_with_mtp(target: LoadedTarget, drafter: LoadedDrafter, native_mtp) -> LoadedDrafter:
    """`drafter` with the MTP it decodes with: an MTP-using one its own jointly trained MTP where its
    directory has one (one line says so), else `native_mtp`."""
    if native_mtp is None or not drafter.model.needs_mtp:
        return replace(drafter, mtp=native_mtp)
    return replace(drafter, mtp=mtp_for_drafter(target.model, target.path, drafter.path, native_mtp))
