"""Which trained drafter decodes, and with which MTP: the newest one trained for the target in use,
loaded and checked against that target."""
from __future__ import annotations

import json
from pathlib import Path

TRAIN_COMMAND = "python -m dmtp.train"   # the default training run, for the default (assistant) target
NO_DRAFTER = "no trained drafter found under ./outputs or ./logs; train one first: {command} (or pass drafter=<dir>)"
NO_DRAFTER_MESSAGE = NO_DRAFTER.format(command=TRAIN_COMMAND)


def train_command(target_cfg) -> str:
    """The training command that makes a drafter for the target being decoded: the default run for the training's
    own default target (conf/train.yaml's), else that run with the target named."""
    from omegaconf import OmegaConf

    from dmtp.configs import CONF_DIR

    if target_cfg.get("path"):
        return f"{TRAIN_COMMAND} target.path={target_cfg.path}"
    defaults = OmegaConf.load(Path(CONF_DIR) / "train.yaml").defaults
    default = next((d.target for d in defaults if OmegaConf.is_dict(d) and "target" in d), None)
    preset = target_cfg.get("preset")
    return TRAIN_COMMAND if preset == default else f"{TRAIN_COMMAND} target={preset}"


def untrained_line(drafter_dir: str | Path) -> str | None:
    """The refusal of a drafter exported by a run that took no training step, which its run's train_metrics.json,
    beside it, records as global step 0; None for any other.

    Training refuses to export one (dmtp.training.job.require_trained), but a run of trainer.max_steps=0 exported
    one once, and such a directory must never be decoded as the newest trained drafter."""
    metrics = Path(drafter_dir).parent / "train_metrics.json"
    try:
        step = json.loads(metrics.read_text()).get("global_step")
    except (OSError, ValueError, AttributeError):   # no run record beside it (a published drafter): trusted
        return None
    if step != 0:
        return None
    return (f"drafter {drafter_dir} is untrained: the run that exported it took no training step ({metrics}: "
            f"global_step 0); train it ({TRAIN_COMMAND}) or pass another drafter=<dir>")


def require_drafter_dir(drafter_dir: str | Path) -> None:
    """A drafter given by path, checked before the target loads: its directory and files are there and it was
    trained (the drafter itself is read and checked against the target later)."""
    from dmtp.drafters.checkpoint import CONFIG_NAME, WEIGHTS_NAME

    drafter_dir = Path(drafter_dir)
    if not drafter_dir.is_dir():
        raise FileNotFoundError(f"drafter directory not found: {drafter_dir}")
    for name in (CONFIG_NAME, WEIGHTS_NAME):
        if not (drafter_dir / name).is_file():
            raise FileNotFoundError(f"drafter file not found: {drafter_dir / name}")
    line = untrained_line(drafter_dir)
    if line:
        raise ValueError(line)


def recorded_target(drafter_dir: str | Path) -> str | None:
    """The target a dmtp-trained drafter records in its config.json (`dmtp.target`), as written."""
    from dmtp.drafters.checkpoint import read_drafter_config

    return (read_drafter_config(drafter_dir).get("dmtp") or {}).get("target")


def drafter_target(drafter_dir: Path | None) -> str | None:
    """The target a drafter was trained against, if it records one that still exists on disk."""
    if drafter_dir is None or not (Path(drafter_dir) / "config.json").exists():
        return None
    path = recorded_target(drafter_dir)
    return path if path and Path(path).is_dir() else None


def target_over_preset(target_cfg, drafter_dir: Path | None) -> str | None:
    """The target a given drafter records, decoded against instead of the embedded preset when no target.path is
    given (README, "Which target dmtp.infer decodes against"); one line says so whenever it is not the preset's."""
    from dmtp.tiny.targets import default_target_dir

    trained_on = None if target_cfg.path else drafter_target(drafter_dir)
    if trained_on and not same_target(trained_on, default_target_dir(target_cfg.preset)):
        print(f"[dmtp] target: {trained_on}, the one drafter {drafter_dir} was trained for, not "
              f"target.preset={target_cfg.preset} (target.path=<dir> decodes it against another)")
    return trained_on


def drafter_target_mismatch(drafter_dir, target_path) -> str | None:
    """The warning line when the target a drafter decodes against is not the one whose digests it recorded
    (dmtp.models.provenance.target_mismatch), for the results it is printed and recorded with."""
    from dmtp.drafters.checkpoint import read_drafter_config
    from dmtp.models.provenance import target_mismatch

    if drafter_dir is None or target_path is None:
        return None
    return target_mismatch(read_drafter_config(drafter_dir).get("dmtp") or {}, target_path, f"drafter {drafter_dir}")


def same_target(a: str | Path, b: str | Path) -> bool:
    """Two target references name one checkpoint: equal resolved local paths, or equal hub ids."""
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    if pa.exists() or pb.exists():
        return pa.resolve() == pb.resolve()
    return str(a) == str(b)


def find_latest_drafter(roots=("outputs", "logs"), base: str | Path | None = None,
                        target: str | Path | None = None) -> Path | None:
    """The newest `<root>/**/drafter/config.json` (by modification time) under the working directory;
    with `target`, the newest one trained for that target (drafters that record no target, or another
    one, are passed over: a drafter only fits the target whose widths and layers it was built for)."""
    base = Path(base or Path.cwd())
    found = []
    for root in roots:
        r = base / root
        if r.is_dir():
            found.extend(p for p in r.glob("**/drafter/config.json") if (p.parent / "model.safetensors").exists()
                         and untrained_line(p.parent) is None)
    if target is not None:
        found = [p for p in found if _trained_for(p.parent, target)]
    if not found:
        return None
    return max(found, key=lambda p: p.stat().st_mtime).parent


def _trained_for(drafter_dir: Path, target: str | Path) -> bool:
    try:
        recorded = recorded_target(drafter_dir)
    except ValueError:   # an unreadable config.json is not a candidate
        return False
    return bool(recorded) and same_target(recorded, target)


def no_drafter_for(target: str | Path, base: str | Path | None = None, command: str = TRAIN_COMMAND) -> str:
    """The message when no drafter trained for `target` exists (naming the newest one for another target);
    `command`: the training command that makes one (`train_command`)."""
    other = find_latest_drafter(base=base)
    if other is None:
        return NO_DRAFTER.format(command=command)
    trained_on = recorded_target(other) or "an unrecorded target"
    return (f"no drafter trained for {target} under ./outputs or ./logs (the newest, {other}, was trained "
            f"for {trained_on}); pass drafter=<dir> to decode another one on the target it was trained for, or "
            f"train one for this target: {command}")


def load_drafter_for(target, path, dtype, device, injection: str | None = None, options: dict | None = None,
                     block_size: int | None = None):
    """-> (drafter, label): the `BlockDrafter` at `path`, checked against `target`. `options`: its
    injection's decoding-time options (e.g. multi_mtp_zero_init's num_mtp_tokens / mtp_threshold);
    `block_size`: verify a shorter block than it was trained with (None: its own).

    Both are named in the label: `<method name>[k=v,...]` (the method name: injection, architecture, MTP
    correction)."""
    from dmtp.drafters.block_drafter import load_block_drafter
    from dmtp.drafters.fit import require_target_fit
    from dmtp.models.provenance import target_mismatch

    options = dict(options or {})
    drafter, meta = load_block_drafter(path, dtype=dtype, injection=injection, options=options, block_size=block_size)
    require_target_fit(drafter.config, target, f"drafter {path}")   # other shapes: refused
    mismatch = target_mismatch(meta or {}, getattr(target, "path", None), f"drafter {path}")   # same shapes, another target: a warning
    if mismatch:
        print(mismatch)
    named = {**options, **({"block_size": block_size} if block_size is not None else {})}
    label = drafter.method_name + ("[" + ",".join(f"{k}={v}" for k, v in named.items()) + "]" if named else "")
    return drafter.to(device).eval(), label


def mtp_for_drafter(target, target_path, drafter_dir, native_mtp):
    """The MTP a drafter decodes with: its own jointly trained one (mtp.safetensors in its directory,
    one line saying so) or the target's native MTP."""
    from dmtp.drafters.block_drafter import tuned_mtp_path
    from dmtp.families.mtp_loading import load_native_mtp

    tuned = tuned_mtp_path(drafter_dir) if drafter_dir is not None else None
    if tuned is None:
        return native_mtp
    print(f"[dmtp] drafter {drafter_dir} decodes with its jointly trained MTP ({tuned}); other methods use "
          "the target's own")
    p = native_mtp.fc.weight
    return load_native_mtp(target_path, target.embed_tokens, target.lm_head, dtype=p.dtype, device=p.device,
                           tuned=tuned)


def greedy_correction_note(drafter, label: str) -> str | None:
    """One line when sampled decoding proposes with the native MTP instead of the drafter's MTP correction (one
    trained on the target's greedy tokens: `MTPCorrection.greedy_only`); None otherwise."""
    correction = getattr(drafter, "mtp_correction", None)
    if correction is None or not correction.greedy_only:
        return None
    return (f"[dmtp] {label}: its MTP correction was trained on the target's greedy tokens, so sampled decoding "
            "proposes T1 with the native MTP (for sampled serving train python -m dmtp.train experiment=sampled)")


def method_needs_mtp(method: str, drafter=None) -> bool:
    if method.startswith("mtp"):
        return True
    return method == "drafter" and drafter is not None and drafter.needs_mtp
