"""The target writes its own responses: drafter training data from the project's own batched decoding.

The published DFlash / SpecForge recipe trains a drafter on the target's own outputs, because that is
what verification compares against: a block position k is only learnable when the tokens before it
are the target's own chain, not a corpus's. `regenerate` decodes prompts with the one decoding loop
(`SpecDecoder`: static caches, large batches, the same path on CPU and GPU), greedy or sampled, and
caches the result on disk in shards so that a killed run resumes where it stopped:

    $DMTP_HOME/cache/regen-<key>/shard-00000.safetensors ...   (one per `shard_size` prompts)

`<key>` hashes the target's identity, the prompts and every setting that changes the output, so a
different target, prompt set or temperature never reuses a stale cache. Each shard is decoded with its
own seed (derived from `seed` and the shard index), so a resumed run gives exactly the tokens of an
uninterrupted one, sampled or greedy. Shards are tensors in safetensors (never pickles).

The cache is verified, not trusted: each shard is written atomically (dmtp.atomic_io) with the sha256 of
its tensors in its metadata, and a shard read back must match it, have the expected shape and hold only
ids of the target's vocabulary; a damaged one (changed, truncated, garbled) is named in one line and
decoded again, never trained on. Each shard has its own lock file (dmtp.datagen.shards): a run that
finds a shard being written waits, then reads what the other wrote, instead of decoding it twice.

Many workers: `write_share(..., Share(W, i))` decodes only worker i's shards (i, i + W, ...), so W
processes, GPUs or nodes sharing the cache directory write it together (`python -m dmtp.prepare
step=regen workers=W worker=i`), each resumable on its own; the tokens are those of one worker, shard by
shard (each shard's seed is its own). `regen_manifest` verifies a finished cache and writes its manifest
(the merge step); the trainer's `regenerate` reads every shard and decodes any still missing.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from dmtp.atomic_io import remove_stale_temporaries, save_safetensors, write_json
from dmtp.serving.catalogue import engine_named, engine_names
from dmtp.paths import dmtp_home
from dmtp.datagen.shards import Share, fill, shard_name, workers_missing, write_manifest

REGEN_METHODS = engine_named("dmtp").regen_methods   # what dmtp's own loop writes with: ar, mtp415
SHARD_FORMAT = 2   # 2: shards carry their checksum (older caches, which do not, are never reused)
REGEN_ENGINES = engine_names(regenerates=True)   # the engines with a writer (dmtp.serving.catalogue)


@dataclass(frozen=True)
class RegenSettings:
    """How the target writes: `new_tokens` per prompt (fewer when it emits EOS), greedy at
    temperature 0 else sampled with top-k / top-p; `method` is the decoding method that writes them
    (`mtp415` gives the same greedy tokens as `ar`, and samples from the same distribution)."""

    new_tokens: int
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    method: str = "ar"
    batch_size: int = 64
    shard_size: int = 1024
    engine: str = "dmtp"
    engine_args: dict = field(default_factory=dict)   # vLLM's own engine options, passed through

    def __post_init__(self):
        engine = engine_named(self.engine, "regeneration engine", regenerates=True)
        if self.method in REGEN_METHODS and self.method not in engine.regen_methods:
            raise ValueError(f"regeneration through {engine.title} decodes with method "
                             f"{' or '.join(engine.regen_methods)}, got {self.method!r}")
        if self.new_tokens < 1:
            raise ValueError(f"regeneration needs new_tokens >= 1, got {self.new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"regeneration temperature must be >= 0, got {self.temperature}")
        if self.method not in REGEN_METHODS:
            raise ValueError(f"regeneration method must be one of {', '.join(REGEN_METHODS)}, got {self.method!r}")
        if self.batch_size < 1 or self.shard_size < 1:
            raise ValueError(f"regeneration batch_size and shard_size must be >= 1, got {self.batch_size} and "
                             f"{self.shard_size}")

    def output_key(self) -> dict:
        """The settings that change what is written (batch size and method change the sampled
        stream's order, so they count too; greedy tokens do not depend on them)."""
        d = asdict(self)
        d.pop("engine_args")   # parallelism and memory options never change the tokens
        if self.engine == "dmtp":   # keys written before engines existed stay valid
            d.pop("engine")
        if self.temperature == 0:   # greedy: the same tokens from either engine (tests/vllm_interop)
            for k in ("top_k", "top_p", "seed", "method", "batch_size", "engine"):
                d.pop(k, None)
        return d


def target_identity(target) -> dict:
    """What identifies a target's weights: its path plus the size and mtime of its weight files."""
    path = Path(str(getattr(target, "path", "") or ""))
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
    return {"path": str(path), "weights": [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files]}


def _eos_ids(target, eos_token_id) -> list[int]:
    eos = getattr(target.config, "eos_token_id", None) if eos_token_id is None else eos_token_id
    if eos is None:
        return []
    return [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]


def cache_dir_for(target, prompts: Sequence[Sequence[int]], settings: RegenSettings, eos_ids: Sequence[int] = (),
                  root: Path | None = None) -> Path:
    digest = hashlib.sha1()
    digest.update(json.dumps({"target": target_identity(target), "settings": settings.output_key(),
                              "eos": list(eos_ids), "shard_format": SHARD_FORMAT}, sort_keys=True).encode())
    for p in prompts:
        digest.update(json.dumps(list(p)).encode())
    return (root or dmtp_home() / "cache") / f"regen-{digest.hexdigest()[:16]}"


def _shard_seed(seed: int, index: int) -> int:
    return int(hashlib.sha1(f"dmtp-regen-{seed}-{index}".encode()).hexdigest()[:8], 16)


def _checksum(tokens: torch.Tensor, lengths: torch.Tensor) -> str:
    digest = hashlib.sha256(tokens.contiguous().numpy().tobytes())
    digest.update(lengths.contiguous().numpy().tobytes())
    return digest.hexdigest()


def _write_shard(path: Path, outputs: list[list[int]], new_tokens: int) -> None:
    tokens = torch.full((len(outputs), new_tokens), -1, dtype=torch.int32)
    for i, out in enumerate(outputs):
        tokens[i, :len(out)] = torch.tensor(out, dtype=torch.int32)
    lengths = torch.tensor([len(o) for o in outputs], dtype=torch.int32)
    # One metadata entry: safetensors writes its metadata map in no fixed order, and a shard's bytes must not
    # depend on the process that wrote it (W workers write what one worker writes).
    save_safetensors(path, {"tokens": tokens, "lengths": lengths}, metadata={"sha256": _checksum(tokens, lengths)})


class DamagedShard(ValueError):
    pass


def _read_shard(path: Path, rows: int, new_tokens: int, vocab_size: int) -> list[list[int]]:
    """A shard's responses, or DamagedShard(why) when it is not exactly what `_write_shard` wrote for
    `rows` prompts of at most `new_tokens` ids below `vocab_size`."""
    try:
        with safe_open(str(path), framework="pt") as f:
            sha256 = (f.metadata() or {}).get("sha256")
            data = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:   # truncated or garbled: whatever the reader says, it is unreadable
        raise DamagedShard(f"unreadable: {str(e).splitlines()[0][:120] if str(e) else type(e).__name__}") from None
    tokens, lengths = data.get("tokens"), data.get("lengths")
    if set(data) != {"tokens", "lengths"} or tokens.dtype != torch.int32 or lengths.dtype != torch.int32:
        raise DamagedShard(f"holds {sorted(data)}, not int32 tokens and lengths")
    if tuple(tokens.shape) != (rows, new_tokens) or tuple(lengths.shape) != (rows,):
        raise DamagedShard(f"tokens {list(tokens.shape)} / lengths {list(lengths.shape)}, expected [{rows}, "
                           f"{new_tokens}] / [{rows}]")
    if sha256 is None:
        raise DamagedShard("records no checksum")
    if _checksum(tokens, lengths) != sha256:
        raise DamagedShard("its tensors do not match their recorded sha256")
    if int(lengths.min()) < 0 or int(lengths.max()) > new_tokens:
        raise DamagedShard(f"a length outside [0, {new_tokens}]")
    filled = torch.arange(new_tokens)[None, :] < lengths[:, None]
    if bool(((tokens < 0) | (tokens >= vocab_size))[filled].any()) or bool((tokens[~filled] != -1).any()):
        raise DamagedShard(f"a token id outside the target's vocabulary [0, {vocab_size})")
    return [row[:n].tolist() for row, n in zip(tokens, lengths.tolist())]


def _waiting_notice(out_dir: Path) -> Callable[[str], None]:
    """Says once per call that this run waits for the holder of a shard of `out_dir` (another run, or this
    run's own other rank: dmtp.datagen.shards.file_lock)."""
    said = []

    def notice(holder: str):
        if not said:
            print(f"[dmtp] waiting for {holder} that is writing the training data in {out_dir}")
            said.append(True)
    return notice


def make_writer(target, settings: RegenSettings, eos_ids: Sequence[int], mtp=None):
    """The writer of the settings' engine (dmtp.serving.catalogue): dmtp's loop with the settings' method,
    vLLM's offline engine on the target's checkpoint, ..."""
    return engine_named(settings.engine).writer(target, settings.method, eos_ids, mtp, settings.engine_args)


@dataclass
class ShareReport:
    """What one worker's call did: the shards it owns, those it decoded, the tokens written and the seconds."""
    cache: Path
    shards: list[int]
    decoded: list[int]
    tokens: int
    seconds: float


def _prepared_dir(target, prompts, settings: RegenSettings, eos_token_id, cache_root) -> tuple[Path, list[int]]:
    if any(len(p) == 0 for p in prompts):
        raise ValueError("regeneration got an empty prompt")
    eos_ids = _eos_ids(target, eos_token_id)
    out_dir = cache_dir_for(target, prompts, settings, eos_ids, Path(cache_root) if cache_root else None)
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out_dir)   # what a killed run left
    meta = {"settings": asdict(settings), "prompts": len(prompts), "target": target_identity(target),
            "shards": _n_shards(len(prompts), settings)}
    write_json(out_dir / "meta.json", meta)
    return out_dir, eos_ids


def _n_shards(n_prompts: int, settings: RegenSettings) -> int:
    return (n_prompts + settings.shard_size - 1) // settings.shard_size


def regenerate(target, prompts: Sequence[Sequence[int]], settings: RegenSettings, *, eos_token_id=None, mtp=None,
               cache_root: str | Path | None = None, progress: bool = True,
               on_shard: Callable[[int], None] | None = None, decode_missing: bool = True) -> list[list[int]]:
    """The target's responses to `prompts` (each: up to `new_tokens` tokens, ending at its first EOS:
    `eos_token_id`, an id or a list, default the target config's).

    Cached in shards under `cache_root` (default `$DMTP_HOME/cache`); finished shards are read back,
    missing ones decoded (also those of workers that have not written theirs yet), so an interrupted call
    resumes. `on_shard(i)` runs after shard i is written (progress hooks, tests). `decode_missing=False`: a
    missing shard is an error naming it (a trainer without the target's decoder: data.features)."""
    if not prompts:
        return []
    out_dir, eos_ids = _prepared_dir(target, prompts, settings, eos_token_id, cache_root)
    outputs: list[list[int]] = []
    records = []
    for _, shard, record in _fill(out_dir, target, prompts, settings, eos_ids, mtp, progress, on_shard, Share(),
                                  decode_missing):
        outputs.extend(shard)
        records.append(record)
    write_manifest(out_dir, records, prompts=len(prompts), new_tokens=settings.new_tokens)
    return outputs


def write_share(target, prompts: Sequence[Sequence[int]], settings: RegenSettings, share: Share, *,
                eos_token_id=None, mtp=None, cache_root: str | Path | None = None, progress: bool = True,
                on_shard: Callable[[int], None] | None = None) -> ShareReport:
    """Worker `share.worker` of `share.workers` writes its shards of the cache (those already there and
    verified are kept); the others' shards are left to them."""
    out_dir, eos_ids = _prepared_dir(target, prompts, settings, eos_token_id, cache_root)
    started = time.perf_counter()
    decoded, tokens, mine = [], 0, share.indices(_n_shards(len(prompts), settings))
    for index, shard, _ in _fill(out_dir, target, prompts, settings, eos_ids, mtp, progress,
                                 lambda i: decoded.append(i) or (on_shard and on_shard(i)), share):
        if index in decoded:
            tokens += sum(len(t) for t in shard)
    return ShareReport(out_dir, mine, decoded, tokens, time.perf_counter() - started)


def regen_manifest(target, prompts: Sequence[Sequence[int]], settings: RegenSettings, *, eos_token_id=None,
                   cache_root: str | Path | None = None, workers: int = 1) -> dict:
    """The merge step: every shard read back and verified (nothing is decoded), then the manifest written.

    A missing or damaged shard is one error naming it and the worker that owns it (of `workers`)."""
    eos_ids = _eos_ids(target, eos_token_id)
    out_dir = cache_dir_for(target, prompts, settings, eos_ids, Path(cache_root) if cache_root else None)
    vocab_size = int(target.config.vocab_size)
    records, missing = [], []
    for index in range(_n_shards(len(prompts), settings)):
        chunk = prompts[index * settings.shard_size:(index + 1) * settings.shard_size]
        path = out_dir / shard_name(index)
        try:
            _read_shard(path, len(chunk), settings.new_tokens, vocab_size)
        except (DamagedShard, FileNotFoundError):
            missing.append(index)
            continue
        records.append(_record(path))
    if missing:
        raise ValueError(f"the regeneration cache {out_dir} lacks {workers_missing(missing, workers)}: run "
                         f"python -m dmtp.prepare step=regen for them (the same options), then merge again")
    return write_manifest(out_dir, records, prompts=len(prompts), new_tokens=settings.new_tokens)


def _record(path: Path) -> dict:
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        rows = f.get_slice("lengths").get_shape()[0]
    return {"file": path.name, "sha256": meta.get("sha256"), "rows": int(rows), "bytes": path.stat().st_size}


def _fill(out_dir: Path, target, prompts, settings: RegenSettings, eos_ids, mtp, progress: bool, on_shard,
          share: Share, decode_missing: bool = True):
    """Yields (index, responses, manifest record) for each shard of `share`: read back if it verifies, else
    decoded and written (under the shard's lock)."""
    n_shards = _n_shards(len(prompts), settings)
    vocab_size = int(target.config.vocab_size)
    mine = share.indices(n_shards)
    writer = None
    bar = _bar(sum(len(prompts[i * settings.shard_size:(i + 1) * settings.shard_size]) for i in mine), progress)
    started, written = time.perf_counter(), 0
    from dmtp.decode.sampling import SamplingConfig

    sampling = SamplingConfig(temperature=settings.temperature, top_k=settings.top_k, top_p=settings.top_p)

    def chunk_of(index):
        return prompts[index * settings.shard_size:(index + 1) * settings.shard_size]

    def read(index):
        path = out_dir / shard_name(index)
        try:
            return _read_shard(path, len(chunk_of(index)), settings.new_tokens, vocab_size)
        except DamagedShard as e:
            print(f"[dmtp] regeneration cache: {path} is damaged ({e}); decoding it again")
            return None

    def write(index):
        nonlocal writer
        if not decode_missing:
            raise FileNotFoundError(f"the regeneration cache {out_dir} has no verified {shard_name(index)} and the "
                                    f"target's decoder is not loaded here: write it first with python -m dmtp.prepare "
                                    f"step=regen (the same options)")
        writer = writer or make_writer(target, settings, eos_ids, mtp)
        result = writer.generate(chunk_of(index), max_new_tokens=settings.new_tokens, sampling=sampling,
                                 batch_size=settings.batch_size, seed=_shard_seed(settings.seed, index))
        _write_shard(out_dir / shard_name(index), result.tokens, settings.new_tokens)
        return result.tokens

    try:
        for index, shard, fresh in fill(out_dir, mine, read, write, _waiting_notice(out_dir)):
            if fresh:
                written += sum(len(t) for t in shard)
                if on_shard is not None:
                    on_shard(index)
            yield index, shard, _record(out_dir / shard_name(index))
            bar.update(len(chunk_of(index)))
            if written:
                bar.set_postfix(tok_s=f"{written / (time.perf_counter() - started):.0f}", refresh=False)
    finally:
        bar.close()
        if hasattr(writer, "close"):   # an engine with processes of its own (vLLM): stop them now (a wrapping
            writer.close()             # writer, e.g. a test's, may have nothing to close)


def _bar(total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="target writes training data", unit="seq", disable=not enabled,
                mininterval=2.0, dynamic_ncols=True)


__all__ = ["RegenSettings", "REGEN_METHODS", "REGEN_ENGINES", "ShareReport", "regenerate", "regen_manifest",
           "write_share", "cache_dir_for", "target_identity", "make_writer"]
