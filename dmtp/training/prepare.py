"""The data a training run reads, written before it by W workers: the body of `python -m dmtp.prepare`.

step=regen    the target writes its responses (the training rows, when `data.regenerate`, and each held-out
              set's continuation): worker i of W decodes its shards of every regeneration cache
              (dmtp.datagen.regenerate.write_share), resumable on its own.
step=capture  the offline feature cache of the run's rows (dmtp.datagen.feature_cache): worker i captures its
              shards. Options the training run would refuse for this cache are refused first (the one rule,
              dmtp.training.components.require_serves), before anything is written. The rows are read from the
              regeneration cache (shards still missing there are decoded first, under their locks, never twice).
              The storage bill (the shards already there read whole, a damaged one counted) is printed, and
              checked against the free disk, before anything is captured.
step=merge    every shard of both caches verified and their manifests written; a missing or damaged shard is
              one error naming it and the worker that owns it. Nothing is decoded: the target's decoder is not
              loaded.

The options are the training run's (conf/prepare.yaml composes conf/train.yaml), so the caches written are
exactly the ones that run reads; `workers` / `worker` only choose the shards.
"""
from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

from omegaconf import DictConfig

from dmtp.configs import instantiate
from dmtp.models.target import load_tokenizer
from dmtp.datagen.feature_cache import capture, features_dir, shards_to_capture, verify_cache
from dmtp.training.components import (build_drafter, feature_spec_of, feature_target, load_mtp, require_serves,
                                      target_device, uses_feature_cache)
from dmtp.datagen.regenerate import regen_manifest, write_share
from dmtp.datagen.shards import Share

STEPS = ("regen", "capture", "merge")


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


def _share(cfg: DictConfig) -> Share:
    return Share(cfg.get("workers", 1), cfg.get("worker", 0))


def prepare(cfg: DictConfig) -> dict:
    """Run `cfg.step` for worker `cfg.worker` of `cfg.workers`; -> what it did (reports, manifests)."""
    step = cfg.get("step")
    if step not in STEPS:
        raise ValueError(f"step must be one of {', '.join(STEPS)}, got {step!r}")
    share = _share(cfg)
    target = feature_target(cfg) if step == "merge" else instantiate(cfg.target, device=target_device(cfg))
    tokenizer = load_tokenizer(target.path)
    data = instantiate(cfg.data)(tokenizer=tokenizer, target=target)
    data.features = replace(data.features, enabled=False)   # the caches are written here, not read
    if step == "regen":
        return {"regen": _regen(data, target, share)}
    drafter = build_drafter(cfg, target, tokenizer)
    spec = feature_spec_of(data, drafter, target)
    if step == "merge":
        return _merge(data, target, spec, share.workers, features=uses_feature_cache(cfg))
    require_serves(spec, drafter, cfg.model)   # what the run it feeds would refuse: before anything is written
    mtp = load_mtp(target, drafter) if spec.mtp_hidden else None
    data.setup()
    return {"capture": _capture(data, target, mtp, spec, share)}


def _regen(data, target, share: Share) -> list:
    reports = []
    for request in data.regen_requests():
        report = write_share(target, request.prompts, request.settings, share, eos_token_id=data.eos,
                             progress=request.progress)
        rate = f", {report.tokens / report.seconds:.0f} tokens/s" if report.decoded and report.seconds > 0 else ""
        print(f"[dmtp] regeneration of the {request.name} ({share}): {len(report.decoded)} of its "
              f"{len(report.shards)} shard(s) decoded, {report.tokens} tokens in {report.seconds:.1f} s{rate} "
              f"({report.cache})")
        reports.append(report)
    return reports


def storage_bill(what: str, rows: list[dict], spec, hidden: int, cache: Path, shard_rows: int, share: Share,
                 checked: dict[int, bool]) -> int:
    """Print what a feature cache costs (whole, and this worker's shards still to write: `checked`, its shards as
    `shards_to_capture` found them, missing or damaged ones False) before it is captured; refuse in one line when the
    free disk cannot hold this worker's part. -> that part's bytes."""
    per_token = spec.token_bytes(hidden)["total"]
    tokens = sum(len(r["input_ids"]) for r in rows)
    todo = [i for i, there in checked.items() if not there]
    mine = sum(len(r["input_ids"]) for i in todo for r in rows[i * shard_rows:(i + 1) * shard_rows]) * per_token
    cache.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(cache).free
    print(f"[dmtp] feature cache of the {what}: {len(rows)} rows, {tokens} tokens x {per_token} B/token "
          f"({spec.describe()}) = {_size(tokens * per_token)}; {share}: {_size(mine)} to write, "
          f"{_size(free)} free at {cache}")
    if mine > free:
        raise ValueError(f"the feature cache of the {what} needs {_size(mine)} more at {cache}, but only "
                         f"{_size(free)} is free: free space, point DMTP_HOME elsewhere, or choose a smaller "
                         f"data.feature_codec")
    return mine


def _capture(data, target, mtp, spec, share: Share) -> list:
    opts = data.features
    jobs = data.feature_jobs(spec)
    found = []
    for what, rows, job_spec in jobs:   # the whole bill first (shards already there read whole), then the work
        cache = features_dir(target, rows, job_spec)
        mine = share.indices((len(rows) + opts.shard_rows - 1) // opts.shard_rows)
        found.append(shards_to_capture(cache, rows, job_spec, mine, opts.shard_rows))
        storage_bill(what, rows, job_spec, target.hidden_size, cache, opts.shard_rows, share, found[-1])
    reports = []
    for (what, rows, job_spec), checked in zip(jobs, found):
        report = capture(target, mtp, rows, job_spec, share, shard_rows=opts.shard_rows, batch_size=opts.batch_size,
                         progress=what == "training rows", what=what, checked=checked)
        rate = f", {report.bytes_written / report.seconds / 1e6:.1f} MB/s" if report.captured and report.seconds else ""
        print(f"[dmtp] features of the {what} ({share}): {len(report.captured)} of its {len(report.shards)} shard(s) "
              f"captured, {_size(report.bytes_written)} in {report.seconds:.1f} s{rate} ({report.cache})")
        reports.append(report)
    return reports


def _merge(data, target, spec, workers: int, features: bool) -> dict:
    regen = []
    for request in data.regen_requests():
        manifest = regen_manifest(target, request.prompts, request.settings, eos_token_id=data.eos, workers=workers)
        regen.append(manifest)
        print(f"[dmtp] regeneration of the {request.name}: {len(manifest['shards'])} shard(s) verified, "
              f"{manifest['rows']} rows, {_size(manifest['bytes'])}")
    out = {"regen": regen}
    if features:
        data.setup()
        out["features"] = []
        for what, rows, job_spec in data.feature_jobs(spec):
            manifest = verify_cache(target, rows, job_spec, data.features.shard_rows, workers=workers)
            out["features"].append(manifest)
            print(f"[dmtp] features of the {what}: {len(manifest['shards'])} shard(s) verified, "
                  f"{manifest['tokens']} tokens, {_size(manifest['bytes'])} "
                  f"({manifest['bytes'] / max(1, manifest['tokens']):.0f} B/token)")
    return out


__all__ = ["STEPS", "prepare", "storage_bill"]
