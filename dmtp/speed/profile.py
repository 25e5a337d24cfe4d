"""A stage-cost profile: the ms of each stage of a decoding round (`dmtp.speed.recipe` names them) at one
(shape, device, dtype, batch), one JSON file each, every figure with where it came from.

    {"name": "qwen3-8b.h200.bf16", "batch": 1, "shape": ..., "device": ..., "dtype": ..., "context": 256,
     "provenance": {"commit": ..., "torch": ..., "date": ..., "command": ..., "clock": ...},
     "stages": {"verify/r1": {"ms": 9.38, "source": "measured: ..."},
                "head/full/r1": {"ms": 0.29, "source": "derived: 151936 x 4096 x 2 B / 4.3 TB/s"}, ...},
     "missing": {"dspark/b8/markov": "never measured at this shape", ...},
     "rounds": {"ar": {"ms": 9.38, "source": ...}, ...}}       # whole rounds measured, the composition's check

A source starts with "measured:" or "derived: <formula>"; a stage the profile does not hold is absent (the
projection then names it instead of counting it as zero), and `missing` says why where that is known.

Shipped profiles live in dmtp/speed/profiles/<name>.b<batch>.json (`python -m dmtp.bench.speed_profile` writes them;
the 8B one is `python -m dmtp.speed.reference`); a profile is named by its name (the batch chosen apart), or by a
file path."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

PROFILES_DIR = Path(__file__).with_name("profiles")
DEFAULT_PROFILE = "qwen3-8b.h200.bf16"   # the shipped 8B/H200 profile (dmtp.speed.reference)


@dataclass(frozen=True)
class StageCost:
    ms: float
    source: str

    @property
    def derived(self) -> bool:
        return not self.source.startswith("measured")


@dataclass
class SpeedProfile:
    name: str
    batch: int
    stages: dict[str, StageCost]
    shape: str = ""
    device: str = ""
    dtype: str = ""
    context: int | None = None
    provenance: dict = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    rounds: dict[str, StageCost] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.name} b{self.batch}"

    def get(self, key: str) -> StageCost | None:
        return self.stages.get(key)

    def to_json(self) -> dict:
        return {"name": self.name, "batch": self.batch, "shape": self.shape, "device": self.device, "dtype": self.dtype,
                "context": self.context, "provenance": self.provenance,
                "stages": {k: {"ms": round(v.ms, 6), "source": v.source} for k, v in self.stages.items()},
                "missing": self.missing,
                "rounds": {k: {"ms": round(v.ms, 6), "source": v.source} for k, v in self.rounds.items()},
                "notes": self.notes}

    @classmethod
    def from_json(cls, d: dict) -> "SpeedProfile":
        def costs(node):
            return {k: StageCost(float(v["ms"]), str(v["source"])) for k, v in (node or {}).items()}

        return cls(d["name"], int(d["batch"]), costs(d.get("stages")), d.get("shape", ""), d.get("device", ""),
                   d.get("dtype", ""), d.get("context"), d.get("provenance") or {}, d.get("missing") or {},
                   costs(d.get("rounds")), list(d.get("notes") or []))

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        return path

    def file_name(self) -> str:
        return f"{self.name}.b{self.batch}.json"


def shipped_profiles() -> list[str]:
    """The names of the profiles shipped with the package."""
    return sorted({p.name.rsplit(".b", 1)[0] for p in PROFILES_DIR.glob("*.b*.json")})


_CACHE: dict = {}


def load_profile(profile: str | Path | SpeedProfile, batch: int | None = None) -> SpeedProfile:
    """A profile by name (a shipped one, dmtp/speed/profiles/<name>.b<batch>.json), by a directory holding
    <name>.b<batch>.json, or by its file; one line naming what exists when there is no such profile."""
    if isinstance(profile, SpeedProfile):
        if batch is not None and profile.batch != batch:
            raise ValueError(f"profile {profile.name} is for batch {profile.batch}, not {batch}")
        return profile
    key = (str(profile), batch)
    if key in _CACHE:
        return _CACHE[key]
    path = Path(str(profile))
    if path.suffix == ".json" and path.is_file():
        found = path
    else:
        if batch is None:
            raise ValueError(f"speed profile {profile!r}: name the batch (its files are <name>.b<batch>.json)")
        if path.is_dir():
            found = next(iter(sorted(path.glob(f"*.b{batch}.json"))), None)
        else:
            found = PROFILES_DIR / f"{profile}.b{batch}.json"
        if found is None or not found.is_file():
            raise FileNotFoundError(f"no speed profile {profile!r} at batch {batch} (shipped: "
                                    f"{', '.join(shipped_profiles()) or 'none'}; or a file written by "
                                    f"python -m dmtp.bench.speed_profile)")
    loaded = SpeedProfile.from_json(json.loads(found.read_text()))
    if batch is not None and loaded.batch != batch:
        raise ValueError(f"{found}: a profile for batch {loaded.batch}, not {batch}")
    _CACHE[key] = loaded
    return loaded


def available_batches(profile: str | Path) -> list[int]:
    """The batches a named (or directory) profile has files for."""
    path = Path(str(profile))
    if path.suffix == ".json" and path.is_file():
        return [SpeedProfile.from_json(json.loads(path.read_text())).batch]
    where, pattern = (path, "*.b*.json") if path.is_dir() else (PROFILES_DIR, f"{profile}.b*.json")
    out = []
    for p in where.glob(pattern):
        tail = p.name[: -len(".json")].rsplit(".b", 1)[-1]
        if tail.isdigit():
            out.append(int(tail))
    return sorted(out)


__all__ = ["DEFAULT_PROFILE", "PROFILES_DIR", "SpeedProfile", "StageCost", "available_batches", "load_profile",
           "shipped_profiles"]
