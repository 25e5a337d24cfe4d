"""The offline feature cache: what the drafter reads from the target, captured once and trained on many times.

    $DMTP_HOME/cache/features-<key>/shard-00000.safetensors ...   (`shard_rows` rows each)
                                   /basis.safetensors             (the lowrank codec's basis, fitted once)

`<key>` hashes the target's identity, the rows (every token id and loss-mask bit) and the `FeatureSpec`, so
a cache is never read for other rows, another target, other taps or another codec. Per shard: the rows'
`input_ids` and `loss_mask`, then each stored group's parts (`taps.*`, `mtp.*`, `last.*`: see
dmtp.datagen.feature_codecs) and the labels (`greedy`, `topk_ids`, `topk_probs`, `tail`), all with the
row as leading dimension. Each row's sha256 is in the shard's metadata: a row is verified whenever it is read
(only its bytes are read: the shards are memory-mapped), and a whole shard when a capture finds it or the
merge step verifies the cache.

W workers capture a cache together (dmtp.datagen.shards: worker i writes shards i, i + W, ...), each
resumable; the lowrank basis is fitted by whichever comes first, under its own lock, and read by the others.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from dmtp.atomic_io import remove_stale_temporaries, save_safetensors, write_json
from dmtp.paths import dmtp_home
from dmtp.datagen.feature_codecs import decode, encode, fit_basis
from dmtp.datagen.feature_spec import FeatureSpec
from dmtp.datagen.regenerate import target_identity
from dmtp.datagen.shards import Share, file_lock, fill, shard_name, workers_missing, write_manifest

FORMAT = 2   # 2: one metadata entry per shard (a shard's bytes do not depend on its writer)
FIT_TOKENS = 16384   # tokens the lowrank basis is fitted on (rows spread evenly over the cache: fit_rows)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CAPTURE_HINT = "python -m dmtp.prepare step=capture (with the training run's options)"


class DamagedFeatures(ValueError):
    pass


def rows_digest(rows: list[dict]) -> str:
    digest = hashlib.sha256()
    for row in rows:
        digest.update(torch.tensor(row["input_ids"], dtype=torch.int32).numpy().tobytes())
        digest.update(torch.tensor(row["loss_mask"], dtype=torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def features_dir(target, rows: list[dict], spec: FeatureSpec, root: Path | None = None) -> Path:
    key = json.dumps({"target": target_identity(target), "spec": spec.key(), "rows": rows_digest(rows),
                      "format": FORMAT}, sort_keys=True)
    return (root or dmtp_home() / "cache") / f"features-{hashlib.sha1(key.encode()).hexdigest()[:16]}"


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def _row_sha256(tensors: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(_bytes(tensors[name]))
    return digest.hexdigest()


# ----------------------------------------------------------------------------------------------------
# capture
# ----------------------------------------------------------------------------------------------------

@torch.no_grad()
def _target_pass(target, mtp, ids: torch.Tensor, spec: FeatureSpec) -> dict[str, torch.Tensor]:
    """One forward of the target (and the MTP's teacher-forced pass) over rows ids [B, T]: the raw groups
    [B, T, G, H] and the labels."""
    out = target(ids, layer_ids=list(spec.layer_ids), logits=spec.labels != "none")
    b, t, _ = out.last_hidden.shape
    groups = {"taps": out.layer_hidden.view(b, t, spec.taps, -1)}
    if spec.mtp_hidden:
        groups["mtp"] = mtp.forward_teacher(ids, out.last_hidden)[..., None, :]
    if spec.last_hidden:
        groups["last"] = out.last_hidden[..., None, :]
    if spec.labels != "none":
        logits = out.logits.float()
        groups["greedy"] = logits.argmax(-1).to(torch.int32)
        if spec.labels == "topk":
            probs = torch.softmax(logits, -1)
            top, idx = probs.topk(min(spec.top_k, probs.shape[-1]), dim=-1)
            groups["topk_ids"], groups["topk_probs"] = idx.to(torch.int32), top.to(torch.float16)
            groups["tail"] = (1.0 - top.sum(-1)).clamp(min=0.0)
    return groups


def _encoded_rows(raw: dict[str, torch.Tensor], spec: FeatureSpec, bases: dict) -> dict[str, torch.Tensor]:
    """Raw groups of R rows -> the shard's tensors (row-leading)."""
    out = {}
    for name, value in raw.items():
        if name in ("taps", "mtp", "last"):
            r, t = value.shape[:2]
            parts = encode(value.flatten(0, 1), spec.codec, bases.get(name))
            out.update({f"{name}.{p}": v.reshape(r, t, *v.shape[1:]) for p, v in parts.items()})
        else:
            out[name] = value
    return out


def _row_tensors(rows: list[dict]) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.tensor([r["input_ids"] for r in rows], dtype=torch.int32),
            "loss_mask": torch.tensor([r["loss_mask"] for r in rows], dtype=torch.uint8)}


def _capture_rows(target, mtp, rows: list[dict], spec: FeatureSpec, bases: dict, batch_size: int) -> dict:
    pieces = []
    for start in range(0, len(rows), batch_size):
        batch = rows[start:start + batch_size]
        ids = torch.tensor([r["input_ids"] for r in batch], dtype=torch.long, device=target.device)
        raw = _target_pass(target, mtp, ids, spec)
        pieces.append({k: v.cpu() for k, v in _encoded_rows(raw, spec, bases).items()})
    tensors = {k: torch.cat([p[k] for p in pieces]) for k in pieces[0]}
    return {**_row_tensors(rows), **tensors}


def _write_shard(path: Path, tensors: dict[str, torch.Tensor], spec: FeatureSpec) -> None:
    rows = tensors["input_ids"].shape[0]
    hashes = [_row_sha256({k: v[i] for k, v in tensors.items()}) for i in range(rows)]
    # One metadata entry (safetensors writes its metadata map in no fixed order; a shard's bytes must not depend
    # on the worker that wrote it).
    record = {"row_sha256": hashes, "sha256": hashlib.sha256("".join(hashes).encode()).hexdigest(),
              "spec": spec.key()}
    save_safetensors(path, tensors, metadata={"dmtp": json.dumps(record, sort_keys=True)})


def _record(meta: dict) -> dict:
    try:
        record = json.loads(meta.get("dmtp", ""))
    except json.JSONDecodeError:
        return {}
    return record if isinstance(record, dict) else {}


def _bases(out_dir: Path, target, mtp, rows: list[dict], spec: FeatureSpec, batch_size: int) -> dict:
    """The lowrank codec's basis of each group: read back, or fitted on ~FIT_TOKENS tokens of rows spread evenly
    over the cache and written (once: the first worker fits it under its lock, the others wait and read it).

    Spread, not the first rows: rows come domain by domain, and a basis fitted on code alone lost the math rows'
    features (BENCHMARKS.md, "Data at scale")."""
    if spec.codec != "lowrank":
        return {}
    path = out_dir / "basis.safetensors"
    with file_lock(out_dir, "basis"):
        if path.exists():
            return _read_basis(path)
        take = max(1, min(len(rows), FIT_TOKENS // max(1, len(rows[0]["input_ids"]))))
        sample = [rows[i] for i in fit_rows(len(rows), take)]
        raw = []
        for start in range(0, take, batch_size):
            ids = torch.tensor([r["input_ids"] for r in sample[start:start + batch_size]],
                               dtype=torch.long, device=target.device)
            raw.append({k: v.cpu() for k, v in _target_pass(target, mtp, ids, spec).items()
                        if k in ("taps", "mtp", "last")})
        bases = {}
        for name in raw[0]:
            sample = torch.cat([r[name].flatten(0, 1) for r in raw])
            bases[name] = fit_basis(sample, spec.rank if name == "taps" else spec.mtp_rank)
        tensors = {f"{g}.{p}": v for g, b in bases.items() for p, v in b.items()}
        save_safetensors(path, tensors, metadata={"sha256": _row_sha256(tensors)})
        return bases


def fit_rows(n_rows: int, take: int) -> list[int]:
    """`take` row indices spread evenly over `n_rows` (the first, the last and every (n - 1) / (take - 1)-th)."""
    if take >= n_rows:
        return list(range(n_rows))
    return sorted({round(i * (n_rows - 1) / max(1, take - 1)) for i in range(take)})


def _read_basis(path: Path) -> dict:
    try:
        with safe_open(str(path), framework="pt") as f:
            meta, tensors = f.metadata() or {}, {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # noqa: BLE001 - whatever the reader says, it is unreadable
        raise DamagedFeatures(f"{path} is unreadable ({str(e)[:100]}); delete it and capture again") from None
    if meta.get("sha256") != _row_sha256(tensors):
        raise DamagedFeatures(f"{path} does not match its recorded sha256; delete the cache directory and capture "
                              f"again")
    bases: dict = {}
    for key, value in tensors.items():
        group, part = key.split(".", 1)
        bases.setdefault(group, {})[part] = value
    return bases


@dataclass
class CaptureReport:
    cache: Path
    shards: list[int]
    captured: list[int]
    bytes_written: int
    tokens: int
    seconds: float


def shards_to_capture(out_dir: Path, rows: list[dict], spec: FeatureSpec, indices: list[int],
                      shard_rows: int) -> dict[int, bool]:
    """Shards `indices` of the cache at `out_dir` as a capture finds them: {index: True (there and verified whole) |
    False (missing, or damaged: named in one line)}, for a bill that counts what the capture will write, then hands
    these checks to `capture` (`checked`), which does not read the shards again."""
    found = {}
    for index in indices:
        path = out_dir / shard_name(index)
        if not path.is_file():
            found[index] = False
            continue
        try:
            verify_shard(path, rows[index * shard_rows:(index + 1) * shard_rows], spec)
            found[index] = True
        except DamagedFeatures as e:
            print(f"[dmtp] feature cache: {path} is damaged ({e}); it will be captured again")
            found[index] = False
    return found


def capture(target, mtp, rows: list[dict], spec: FeatureSpec, share: Share = Share(), *, shard_rows: int = 64,
            batch_size: int = 8, cache_root: str | Path | None = None, progress: bool = True,
            on_shard=None, what: str = "training rows", checked: dict[int, bool] | None = None) -> CaptureReport:
    """Worker `share` captures its shards of the cache of `rows` (those already there and verified are kept).
    `checked`: `shards_to_capture`'s findings of a moment ago (a shard is then not read again)."""
    checked = dict(checked or {})
    if spec.mtp_hidden and mtp is None:
        raise ValueError("the feature cache stores the MTP's hidden (data.feature_mtp_hidden=true), but the target "
                         "has no MTP loaded")
    out_dir = features_dir(target, rows, spec, Path(cache_root) if cache_root else None)
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out_dir)
    n_shards = (len(rows) + shard_rows - 1) // shard_rows
    write_json(out_dir / "meta.json", {"spec": asdict(spec), "rows": len(rows), "shard_rows": shard_rows,
                                       "shards": n_shards, "target": target_identity(target), "what": what})
    bases = _bases(out_dir, target, mtp, rows, spec, batch_size)
    mine = share.indices(n_shards)
    started, captured, written, tokens = time.perf_counter(), [], 0, 0
    bar = _bar(sum(len(rows[i * shard_rows:(i + 1) * shard_rows]) for i in mine), progress, what)

    def chunk(index):
        return rows[index * shard_rows:(index + 1) * shard_rows]

    def read(index):
        known = checked.pop(index, None)   # once: a shard rewritten by another worker since is read again
        if known is not None:
            return (out_dir / shard_name(index)).stat().st_size if known else None
        try:
            return verify_shard(out_dir / shard_name(index), chunk(index), spec)
        except DamagedFeatures as e:
            print(f"[dmtp] feature cache: {out_dir / shard_name(index)} is damaged ({e}); capturing it again")
            return None

    def write(index):
        _write_shard(out_dir / shard_name(index), _capture_rows(target, mtp, chunk(index), spec, bases, batch_size),
                     spec)
        return (out_dir / shard_name(index)).stat().st_size

    try:
        for index, _, fresh in fill(out_dir, mine, read, write):
            if fresh:
                captured.append(index)
                written += (out_dir / shard_name(index)).stat().st_size
                tokens += sum(len(r["input_ids"]) for r in chunk(index))
                if on_shard is not None:
                    on_shard(index)
            bar.update(len(chunk(index)))
    finally:
        bar.close()
    return CaptureReport(out_dir, mine, captured, written, tokens, time.perf_counter() - started)


def _bar(total: int, enabled: bool, what: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=f"capturing features of the {what}", unit="row", disable=not enabled,
                mininterval=2.0, dynamic_ncols=True)


# ----------------------------------------------------------------------------------------------------
# reading
# ----------------------------------------------------------------------------------------------------

def _expected_names(spec: FeatureSpec) -> set[str]:
    part = {"fp32": ("v",), "bf16": ("v",), "fp16": ("v",), "fp8": ("q", "scale"), "lowrank": ("q", "scale")}
    groups = ["taps"] + (["mtp"] if spec.mtp_hidden else []) + (["last"] if spec.last_hidden else [])
    names = {"input_ids", "loss_mask"} | {f"{g}.{p}" for g in groups for p in part[spec.codec]}
    if spec.labels != "none":
        names.add("greedy")
    if spec.labels == "topk":
        names |= {"topk_ids", "topk_probs", "tail"}
    return names


def _open(path: Path, rows: int, spec: FeatureSpec):
    """The shard's open handle and its row checksums, after checking its header (names, row count, spec)."""
    try:
        handle = safe_open(str(path), framework="pt")
        meta = handle.metadata() or {}
        names = set(handle.keys())
        count = handle.get_slice("input_ids").get_shape()[0] if "input_ids" in names else -1
    except Exception as e:  # noqa: BLE001 - truncated or garbled: whatever the reader says, it is unreadable
        raise DamagedFeatures(f"unreadable: {str(e).splitlines()[0][:120] if str(e) else type(e).__name__}") from None
    if names != _expected_names(spec):
        raise DamagedFeatures(f"holds {sorted(names)}, expected {sorted(_expected_names(spec))}")
    if count != rows:
        raise DamagedFeatures(f"{count} rows, expected {rows}")
    record = _record(meta)
    if record.get("spec") != json.loads(json.dumps(spec.key())):
        raise DamagedFeatures("written for another feature spec")
    hashes = record.get("row_sha256")
    if not isinstance(hashes, list) or len(hashes) != rows:
        raise DamagedFeatures("records no checksum per row")
    return handle, hashes


def _read_row(handle, hashes, i: int, row: dict, where: str) -> dict[str, torch.Tensor]:
    tensors = {name: handle.get_slice(name)[i] for name in handle.keys()}
    if _row_sha256(tensors) != hashes[i]:
        raise DamagedFeatures(f"{where} row {i} does not match its recorded sha256")
    if tensors["input_ids"].tolist() != list(row["input_ids"]) or tensors["loss_mask"].tolist() != list(row["loss_mask"]):
        raise DamagedFeatures(f"{where} row {i} holds other tokens than the data's row")
    return tensors


def verify_shard(path: Path, rows: list[dict], spec: FeatureSpec) -> int:
    """Every row of a shard read and checked (DamagedFeatures otherwise); -> its size in bytes."""
    handle, hashes = _open(path, len(rows), spec)
    for i, row in enumerate(rows):
        _read_row(handle, hashes, i, row, str(path))
    return path.stat().st_size


class FeatureCache:
    """The captured features of `rows`, row by row, decoded to the target's dtype: {"taps" [T, G*H],
    "mtp_hidden" [T, H], "last_hidden" [T, H], "greedy" [T], "topk_ids" [T, k], "topk_probs" [T, k],
    "tail" [T]} (what the spec stores).

    Opening it checks that every shard is there with the right header; each row's checksum is checked when it is
    read."""

    def __init__(self, target, rows: list[dict], spec: FeatureSpec, shard_rows: int, cache_root=None,
                 workers: int = 1):
        self.rows, self.spec, self.shard_rows = rows, spec, shard_rows
        self.dir = features_dir(target, rows, spec, Path(cache_root) if cache_root else None)
        self.n_shards = (len(rows) + shard_rows - 1) // shard_rows
        missing = [i for i in range(self.n_shards) if not (self.dir / shard_name(i)).is_file()]
        if missing:
            what = "no shard" if len(missing) == self.n_shards else workers_missing(missing, workers)
            raise FileNotFoundError(f"the feature cache {self.dir} ({spec.describe()}) has {what}"
                                    f"{' yet' if len(missing) == self.n_shards else ' missing'}: capture it first: "
                                    f"{CAPTURE_HINT}")
        self.bases = _read_basis(self.dir / "basis.safetensors") if spec.codec == "lowrank" else {}
        self.dtype = DTYPES[spec.dtype]
        self._handles: dict[int, tuple] = {}
        for index in range(self.n_shards):   # every header checked up front (cheap: no tensor is read)
            self._handle(index)
        self._handles.clear()   # reopened lazily where rows are read (a loader process of its own)

    def _handle(self, index: int):
        if index not in self._handles:
            path = self.dir / shard_name(index)
            try:
                self._handles[index] = _open(path, len(self.rows[index * self.shard_rows:(index + 1) * self.shard_rows]),
                                             self.spec)
            except DamagedFeatures as e:
                raise ValueError(f"feature cache shard {path} is damaged ({e}): capture it again: {CAPTURE_HINT}") \
                    from None
        return self._handles[index]

    def __getstate__(self):   # loader worker processes reopen the shards themselves
        return {**self.__dict__, "_handles": {}}

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        index, r = divmod(i, self.shard_rows)
        handle, hashes = self._handle(index)
        path = self.dir / shard_name(index)
        try:
            stored = _read_row(handle, hashes, r, self.rows[i], str(path))
        except DamagedFeatures as e:
            raise ValueError(f"feature cache shard {path} is damaged ({e}): capture it again: {CAPTURE_HINT}") from None
        return self.decoded(stored)

    def decoded(self, stored: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {}
        for group, name in (("taps", "taps"), ("mtp", "mtp_hidden"), ("last", "last_hidden")):
            parts = {k.split(".", 1)[1]: v for k, v in stored.items() if k.startswith(group + ".")}
            if parts:
                out[name] = decode(parts, self.spec.codec, self.bases.get(group), self.dtype)
        for name in ("greedy", "topk_ids"):
            if name in stored:
                out[name] = stored[name].long()
        for name in ("topk_probs", "tail"):
            if name in stored:
                out[name] = stored[name].float()
        return out


def verify_cache(target, rows: list[dict], spec: FeatureSpec, shard_rows: int, cache_root=None,
                 workers: int = 1) -> dict:
    """The merge step: every shard of the cache verified row by row (nothing is captured), then its manifest
    written.

    A missing or damaged shard is one error naming it and the worker that owns it."""
    out_dir = features_dir(target, rows, spec, Path(cache_root) if cache_root else None)
    n_shards = (len(rows) + shard_rows - 1) // shard_rows
    records, missing = [], []
    for index in range(n_shards):
        path = out_dir / shard_name(index)
        chunk = rows[index * shard_rows:(index + 1) * shard_rows]
        try:
            size = verify_shard(path, chunk, spec)
        except DamagedFeatures:
            missing.append(index)
            continue
        with safe_open(str(path), framework="pt") as f:
            sha = _record(f.metadata() or {}).get("sha256")
        records.append({"file": path.name, "sha256": sha, "rows": len(chunk), "bytes": size})
    if missing:
        raise ValueError(f"the feature cache {out_dir} lacks {workers_missing(missing, workers)}: run {CAPTURE_HINT} "
                         f"for them, then merge again")
    tokens = sum(len(r["input_ids"]) for r in rows)
    return write_manifest(out_dir, records, tokens=tokens, spec=asdict(spec))


__all__ = ["CAPTURE_HINT", "CaptureReport", "FeatureCache", "capture", "features_dir", "rows_digest", "shards_to_capture",
           "verify_cache", "verify_shard"]
