"""The data module's options as typed records, one per concern (the `RegenSettings` pattern): where the training text
comes from (`SourceOptions`), whether and how the target rewrites it (`RegenOptions`), the validation walk's
held-out rows (`ValidationOptions`), the loader (`LoaderOptions`) and the offline feature cache (`FeatureOptions`).

conf/data/*.yaml keeps its flat keys (`data.regen_new_tokens=...`, `data.val_prompts=...`, what users and sweeps
type); `FLAT_KEYS` is the one table from a flat key to its record and field, read by `data_module`, the Hydra
entry point, which checks each record and builds the `DraftDataModule` from them.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from omegaconf import OmegaConf

from dmtp.configs import records_from_flat
from dmtp.data.corpora import DOMAINS
from dmtp.data.evalsets import EVAL_SETS
from dmtp.data.sources import source_named
from dmtp.datagen.feature_spec import FeatureSpec
from dmtp.datagen.regenerate import RegenSettings



def _plain(value):
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def _known_domains(domains, what: str) -> list[str]:
    unknown = [d for d in domains if d not in DOMAINS]
    if unknown:
        raise ValueError(f"unknown corpus domain(s) {unknown} in {what}; choose from {', '.join(DOMAINS)}")
    return list(domains)


@dataclass(frozen=True)
class SourceOptions:
    """The training text: the embedded corpora's `domains`, local `files` (JSONL / JSON / Parquet: "text" or
    conversations) or a Hugging Face dataset; at most `max_examples` documents or records."""
    source: str = "embedded"
    domains: tuple[str, ...] = ("code", "math")
    files: tuple[str, ...] = ()
    hf_dataset: str | None = None
    hf_split: str = "train"
    hf_config: str | None = None
    text_key: str = "text"
    max_examples: int | None = None

    def __post_init__(self):
        missing = source_named(self.source).missing(self)
        if missing:
            raise ValueError(missing)
        object.__setattr__(self, "domains", tuple(_known_domains(self.domains, "data.domains")))
        object.__setattr__(self, "files", tuple(self.files or ()))


@dataclass(frozen=True)
class RegenOptions:
    """`enabled`: the target writes the responses (DFlash/SpecForge recipe): `sequences` prompts of `prompt_len`
    tokens, `new_tokens` each, greedy at temperature 0 else sampled; written `batch_size` at a time by `engine`
    (dmtp's loop or vLLM, with vLLM's own `engine_args`), `shard_size` prompts per cache shard (the unit a
    worker writes, and all a killed one loses)."""
    enabled: bool = False
    prompt_len: int = 64
    new_tokens: int = 192
    sequences: int = 512
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    batch_size: int = 64
    engine: str = "dmtp"
    engine_args: dict = field(default_factory=dict)
    shard_size: int = 1024

    def __post_init__(self):
        object.__setattr__(self, "engine_args", dict(_plain(self.engine_args) or {}))
        if self.engine_args and self.engine != "vllm":   # they would be ignored
            raise ValueError(f"data.vllm_engine_args are vLLM's engine options (data.regen_engine=vllm); "
                             f"data.regen_engine={self.engine} takes none")

    def settings(self, seed: int) -> RegenSettings:
        """How the target writes (dmtp.datagen.regenerate), checked there."""
        return RegenSettings(new_tokens=self.new_tokens, temperature=self.temperature, top_k=self.top_k,
                             top_p=self.top_p, seed=seed, batch_size=self.batch_size, engine=self.engine,
                             engine_args=self.engine_args, shard_size=self.shard_size)


@dataclass(frozen=True)
class ValidationOptions:
    """The validation walk's held-out rows: `prompts` prompts of `prompt_len` tokens from each embedded domain of
    `domains` and from each eval-set file of `sets` ({eval-set name: path}), each with `new_tokens` of the target's
    greedy continuation."""
    domains: tuple[str, ...] = DOMAINS
    prompts: int = 8
    prompt_len: int = 48
    new_tokens: int = 72
    sets: dict = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "domains", tuple(_known_domains(self.domains, "data.val_domains")))
        object.__setattr__(self, "sets", validation_sets(self.sets))
        for name in ("prompts", "prompt_len", "new_tokens"):   # no validation at all: data.val_domains=[]
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"data.val_{name} must be an integer >= 1, got {value!r} (no validation: "
                                 "data.val_domains=[] and no data.val_sets)")


@dataclass(frozen=True)
class LoaderOptions:
    """Training rows of `seq_len` tokens, `batch_size` per device, `num_workers` loader processes."""
    seq_len: int = 256
    batch_size: int = 8
    num_workers: int = 0

    def __post_init__(self):
        for name, least in (("seq_len", 1), ("batch_size", 1), ("num_workers", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"data.{name} must be an integer >= {least}, got {value!r}")


# What the cache stores is FeatureSpec's: its fields (but the taps and the dtype, which the drafter and the target
# give) are data.feature_<field>, with FeatureSpec's defaults.
STORED = tuple(f.name for f in fields(FeatureSpec) if f.name not in ("layer_ids", "dtype"))
_STORED_DEFAULT = {f.name: f.default for f in fields(FeatureSpec)}


@dataclass(frozen=True)
class FeatureOptions:
    """`enabled`: train from the offline feature cache of the same rows (captured by `python -m dmtp.prepare
    step=capture`), the target's decoder never loaded.

    What the cache stores (dmtp.datagen.feature_spec): `codec` (fp32 | bf16 | fp16 | fp8 | lowrank with `rank` /
    `mtp_rank`), the MTP's hidden, the last hidden, the labels (`labels`: none | greedy | topk with `top_k`);
    `shard_rows` rows per shard, captured `batch_size` rows at a time."""
    enabled: bool = False
    codec: str = _STORED_DEFAULT["codec"]
    rank: int | None = _STORED_DEFAULT["rank"]
    mtp_rank: int | None = _STORED_DEFAULT["mtp_rank"]
    mtp_hidden: bool = _STORED_DEFAULT["mtp_hidden"]
    last_hidden: bool = _STORED_DEFAULT["last_hidden"]
    labels: str = _STORED_DEFAULT["labels"]
    top_k: int = _STORED_DEFAULT["top_k"]
    shard_rows: int = 64
    batch_size: int = 8

    def __post_init__(self):
        for name in ("shard_rows", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"data.feature_{name} must be an integer >= 1, got {value!r}")
        self.spec((0,), "float32")   # the spec's own checks (codec, rank, labels), answered at build time

    def spec(self, layer_ids, dtype: str) -> FeatureSpec:
        """What the cache of a drafter tapping `layer_ids` of a target in `dtype` stores."""
        return FeatureSpec(tuple(layer_ids), dtype=dtype, **{name: getattr(self, name) for name in STORED})


def validation_sets(val_sets) -> dict[str, str]:
    """data.val_sets: {eval-set name: path} (dmtp.data.evalsets' names), or nothing."""
    sets = _plain(val_sets)
    if not sets:
        return {}
    if not isinstance(sets, dict) or not all(isinstance(v, str) for v in sets.values()):
        raise ValueError(f"data.val_sets must map an eval-set name to a file, e.g. "
                         f"'data.val_sets={{gsm8k: /data/gsm8k/test.jsonl}}'; got {sets!r:.120}")
    unknown = [name for name in sets if name not in EVAL_SETS]
    if unknown:
        raise ValueError(f"data.val_sets: unknown eval set {unknown[0]!r}; choose from {', '.join(EVAL_SETS)}")
    return {name: str(Path(path).expanduser()) for name, path in sets.items()}


# conf/data's flat key -> (record, field). The one place that says which option belongs where.
FLAT_KEYS: dict[str, tuple[str, str]] = {
    **{k: ("source", k) for k in ("source", "domains", "files", "hf_dataset", "hf_split", "hf_config", "text_key",
                                  "max_examples")},
    "regenerate": ("regen", "enabled"), "vllm_engine_args": ("regen", "engine_args"),
    **{f"regen_{k}": ("regen", k) for k in ("prompt_len", "new_tokens", "sequences", "temperature", "top_k",
                                            "top_p", "batch_size", "engine", "shard_size")},
    **{f"val_{k}": ("val", k) for k in ("domains", "prompts", "prompt_len", "new_tokens", "sets")},
    **{k: ("loader", k) for k in ("seq_len", "batch_size", "num_workers")},
    "features": ("features", "enabled"),
    **{f"feature_{k}": ("features", k) for k in (*STORED, "shard_rows", "batch_size")},
}
RECORDS = {"source": SourceOptions, "regen": RegenOptions, "val": ValidationOptions, "loader": LoaderOptions,
           "features": FeatureOptions}


def grouped(flat: dict) -> dict[str, object]:
    """conf/data's flat options -> one record per concern (unknown keys: one line naming them)."""
    return records_from_flat(flat, FLAT_KEYS, RECORDS, "data")


DATA_MODULE = "dmtp.training.datamodule.data_module"   # conf/data's entry point (its `_target_`)


def checked_before_loading(data_cfg) -> dict[str, object] | None:
    """conf/data's options checked before anything heavy (dmtp.train, before the target loads): each record's own
    checks, and every `data.val_sets` file read (missing, unreadable or not the named set's format: its one line),
    so a wrong file is said in seconds, not after the target has loaded and the training data is written.

    None for another data module than dmtp's."""
    from dmtp.data.evalsets import load_eval_set

    if data_cfg.get("_target_") != DATA_MODULE:
        return None
    records = grouped({k: None if OmegaConf.is_missing(data_cfg, k) else data_cfg[k]   # `???`: as Hydra passes it
                       for k in data_cfg if not str(k).startswith("_") and k != "seed"})
    for name, path in records["val"].sets.items():
        try:
            load_eval_set(name, path, limit=records["val"].prompts)
        except FileNotFoundError as e:
            raise FileNotFoundError(f"data.val_sets.{name}: {e}") from None
        except ValueError as e:
            raise ValueError(f"data.val_sets.{name}: {e}") from None
    return records
