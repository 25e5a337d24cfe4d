"""A resumed run is the run it continues: `resume=<run dir>` restores that run's own composed config, not
today's defaults, and refuses any option that would change its model or data.

Every checkpoint records the config the run was training with (`RecordRunConfig`, under `RECORD_KEY`,
as YAML text: a plain string, readable with `weights_only=True`); runs from before that record resume
from the config Hydra wrote when they started (`<run>/.hydra/config.yaml`).

What a resume may change is `RESUME_MAY_CHANGE`, the one list (README, "Checkpoints and safety"): how long
it runs, where and how it runs (device), reports and checkpoints, and what is measured after it. Anything
else given with `resume=` (target, drafter, injection, data, model.*, seed, init_from, trainer.precision,
debug / experiment presets, ...) is refused in one line when it differs from the run's own value; an
option repeating the run's value is accepted.
"""
from __future__ import annotations

from pathlib import Path

import lightning as L
from omegaconf import DictConfig, OmegaConf

RECORD_KEY = "dmtp_config"
# Hydra entry points that moved since a run may have recorded them: old name -> new name, so an older run
# resumes (and compares equal to today's config) after the move.
MOVED_TARGETS = {"dmtp.models.target.load_target": "dmtp.tiny.targets.load_target",
                 # conf/data's and conf/train.yaml model's flat options grouped into records by these
                 "dmtp.training.datamodule.DraftDataModule": "dmtp.training.datamodule.data_module",
                 "dmtp.training.module.DMTPModule": "dmtp.training.module.dmtp_module",
                 # the run's lifecycle left dmtp.training for dmtp.runs
                 "dmtp.training.guards.FiniteGuard": "dmtp.runs.guards.FiniteGuard",
                 "dmtp.training.rng_state.ResumableRNG": "dmtp.runs.rng_state.ResumableRNG",
                 "dmtp.run_records.NoteNewRunDirs": "dmtp.runs.records.NoteNewRunDirs"}

RESUME_MAY_CHANGE = (
    "trainer.max_steps",            # extend (or shorten) the run
    "trainer.enable_progress_bar", "trainer.log_every_n_steps",
    "trainer.accelerator", "trainer.devices", "trainer.num_nodes",   # where it runs
    "threads",                      # CPU threads of this process (dmtp.threads)
    "checkpoint_writes",            # checkpoint files written in the background or inline (same contents)
    "logger", "callbacks",          # what it reports and how often it checkpoints (the safety callbacks stay on)
    "decode_eval",                  # the decoding measured after training
    "paths", "hydra",               # where its files go (a resumed run stays in its own directory)
    "resume", "ckpt_path",          # how this run was continued (a run started from ckpt_path= resumes too)
)


class RecordRunConfig(L.Callback):
    """Writes the run's composed config into every checkpoint, so the run can be resumed from itself."""

    def __init__(self, cfg: DictConfig):
        self.text = OmegaConf.to_yaml(cfg, resolve=False)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        checkpoint[RECORD_KEY] = self.text


def recorded_config(run_dir: Path, checkpoint: dict) -> DictConfig:
    """The run's own config: the one recorded in `checkpoint` (its contents), else Hydra's record of its start."""
    if isinstance(checkpoint.get(RECORD_KEY), str):
        return _with_moved_targets(OmegaConf.create(checkpoint[RECORD_KEY]))
    hydra_record = run_dir / ".hydra" / "config.yaml"
    if hydra_record.is_file():
        return _with_moved_targets(OmegaConf.load(hydra_record))
    raise ValueError(f"resume={run_dir}: the run records no config (its checkpoints predate the record and it has "
                     f"no {hydra_record}); continue it with ckpt_path=<its checkpoint> and the options it was "
                     "started with")


def run_recipe(run_dir: Path | None, checkpoint: dict, required: bool) -> DictConfig | None:
    """`recorded_config`, or None when the run records none and none is `required` (a `ckpt_path=` run runs the
    config given: the run's record is only compared with it, `resume_line`)."""
    if run_dir is None and not isinstance(checkpoint.get(RECORD_KEY), str):
        return None   # a checkpoint outside a run directory, from before the record
    try:
        return recorded_config(run_dir or Path("."), checkpoint)
    except ValueError:
        if required:
            raise
        return None


def _with_moved_targets(cfg: DictConfig) -> DictConfig:
    tree = OmegaConf.to_container(cfg, resolve=False)

    def rename(node):
        if isinstance(node, dict):
            return {k: MOVED_TARGETS.get(v, v) if k == "_target_" and isinstance(v, str) else rename(v)
                    for k, v in node.items()}
        return [rename(v) for v in node] if isinstance(node, list) else node

    return OmegaConf.create(rename(tree))


def _leaves(node, prefix: str = "") -> dict:
    if isinstance(node, dict) and node:
        out = {}
        for key, value in node.items():
            out.update(_leaves(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


_ABSENT = object()


def _get(tree: dict, key: str):
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return _ABSENT
        tree = tree[part]
    return tree


def _may_change(key: str) -> bool:
    return any(key == allowed or key.startswith(allowed + ".") for allowed in RESUME_MAY_CHANGE)


def _override_key(override: str) -> str:
    key = override.lstrip("+~").split("=", 1)[0]
    return key.split("@", 1)[0].replace("/", ".")


def _covering(key: str, override_keys: dict[str, str]) -> str | None:
    """The override that set `key` (an override of a whole group covers its keys)."""
    for okey, override in override_keys.items():
        if key == okey or key.startswith(okey + ".") or okey.startswith(key + "."):
            return override
    return None


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def resumed_config(cfg: DictConfig, saved: DictConfig, run_dir: Path, overrides: list[str] | None) -> DictConfig:
    """The run's `saved` config, with the options given now that a resume may change.

    `overrides`: the options given on the command line (Hydra's task overrides); a key they set that
    differs from the run's value is taken if it is in RESUME_MAY_CHANGE, else refused. None (a config
    composed in Python): every key of `cfg` counts as given."""
    given = OmegaConf.to_container(cfg, resolve=False)
    restored = OmegaConf.to_container(saved, resolve=False)
    for key, value in given.items():   # sections added to dmtp since the run started: today's defaults
        restored.setdefault(key, value)
    now, before = _leaves(given), _leaves(restored)
    changed = [k for k in sorted(set(now) | set(before)) if now.get(k, None) != before.get(k, None)]
    override_keys, presets = None, ""
    if overrides is not None:
        override_keys = {_override_key(o): o for o in overrides}
        # A preset of the global package (debug=, experiment=) sets keys all over the config: every change counts.
        presets = ", ".join(o for k, o in override_keys.items()
                            if _get(given, k) is _ABSENT and _get(restored, k) is _ABSENT)
        if not presets:
            changed = [k for k in changed if _covering(k, override_keys)]
    for key in changed:
        if not _may_change(key):
            who = (_covering(key, override_keys) if override_keys else None) or presets or "the given config"
            raise ValueError(f"resume={run_dir}: {who} would change the run's {key} ({_short(before.get(key))} -> "
                             f"{_short(now.get(key))}); a resumed run keeps its model, data and seed (it may change "
                             f"only {', '.join(RESUME_MAY_CHANGE)})")
    for prefix in {next(a for a in RESUME_MAY_CHANGE if k == a or k.startswith(a + ".")) for k in changed}:
        value = _get(given, prefix)
        *parents, last = prefix.split(".")
        node = restored
        for part in parents:
            node = node.setdefault(part, {})
        if value is _ABSENT:
            node.pop(last, None)
        else:
            node[last] = value
    out = OmegaConf.create(restored)
    OmegaConf.set_struct(out, True)
    return out


# Keys that always differ between a run's record and its continuation and say nothing of its recipe.
NOT_RECIPE = ("paths", "hydra", "resume", "ckpt_path")
SHOWN_DIFFERENCES = 8


def recipe_differences(recorded: DictConfig, running: DictConfig) -> list[str]:
    """`key before -> now` for every option whose value the running config changes from the run's record
    (`(unset)` where one side has no such key)."""
    before = _leaves(OmegaConf.to_container(recorded, resolve=False))
    now = _leaves(OmegaConf.to_container(running, resolve=False))
    unset = "(unset)"
    return [f"{key} {_short(before[key]) if key in before else unset} -> {_short(now[key]) if key in now else unset}"
            for key in sorted(set(before) | set(now))
            if before.get(key, _ABSENT) != now.get(key, _ABSENT)
            and not any(key == n or key.startswith(n + ".") for n in NOT_RECIPE)]


def resume_line(ckpt: Path, step, recorded: DictConfig | None, running: DictConfig, by_resume: bool) -> str:
    """The one line a continued run prints before its first step: the checkpoint, its step, and how the config
    it runs with differs from the one the run recorded."""
    diffs = recipe_differences(recorded, running) if recorded is not None else []
    shown = ", ".join(diffs[:SHOWN_DIFFERENCES]) + (f" and {len(diffs) - SHOWN_DIFFERENCES} more"
                                                     if len(diffs) > SHOWN_DIFFERENCES else "")
    head = f"[dmtp] resume: continuing from {ckpt} (step {step})"
    if by_resume:
        return f"{head} with the run's recorded config" + (f"; changed now: {shown}" if diffs else "")
    if recorded is None:
        return f"{head} with the config given (ckpt_path=); the checkpoint records no config to compare it with"
    return f"{head} with the config given (ckpt_path=)" + (f", which differs from the run's recorded config: {shown}"
                                                           if diffs else ", the same as the run's recorded config")


__all__ = ["RECORD_KEY", "RESUME_MAY_CHANGE", "RecordRunConfig", "recorded_config", "resumed_config", "run_recipe",
           "recipe_differences", "resume_line"]
