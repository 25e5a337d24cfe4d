"""Decoding options of `python -m dmtp.infer`, checked before anything is loaded: sampling, the
prompt budget, and which methods the user named (those must run or fail)."""
from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from dmtp.decode.loop import parse_mtp_steps
from dmtp.decode.sampling import SamplingConfig, draft_rules

TRUNCATE_MODES = (None, "left")   # eval.truncate


def require_counts(cfg, keys, optional=()) -> None:
    """Each of `keys` an integer >= 1 (one line naming the first that is not); those of `optional` may be null."""
    for key in keys:
        value = OmegaConf.select(cfg, key)
        if value is None and key in optional:
            continue
        if type(value) is not int or value < 1:
            raise ValueError(f"{key} must be an integer >= 1, got {value}")


def require_workloads(domains) -> None:
    """eval.domains (the embedded workloads decoded): at least one, else a table of nothing would be written."""
    if not domains:
        raise ValueError("eval.domains is empty: name at least one workload, e.g. eval.domains=[code]")


def check_speed_profile(profile, key: str = "speed_profile") -> None:
    """`key`: null, a shipped speed profile's name, a directory of <name>.b<batch>.json files or one such file.

    A name with no file at any batch (a typo) is refused before anything decodes: the table would say so only at
    its end."""
    if not profile:
        return
    from dmtp.speed.profile import available_batches, shipped_profiles

    if not available_batches(profile):
        raise FileNotFoundError(f"{key}={profile}: no such speed profile (shipped: {', '.join(shipped_profiles())}; "
                                "or a directory or file written by python -m dmtp.bench.speed_profile; null: none)")


def decode_options(cfg) -> SamplingConfig:
    """Check the decoding options before anything is loaded (one line naming the option); -> sampling."""
    require_counts(cfg, ("batch_size", "max_new_tokens", "num_prompts"), optional=("num_prompts",))  # null: a whole set
    check_speed_profile(cfg.get("speed_profile"))
    if cfg.eval.name == "embedded":
        require_workloads(cfg.eval.domains)
    if cfg.eval.get("truncate") not in TRUNCATE_MODES:
        raise ValueError(f"eval.truncate must be null (refuse a prompt the target cannot take) or left, "
                         f"got {cfg.eval.truncate!r}")
    # The MTP chains' lengths (mtp_steps even when no plain `mtp` method uses it): now, not after loading.
    for method in ["mtp", *(str(m) for m in cfg.methods if str(m).startswith("mtp"))]:
        parse_mtp_steps(method, cfg.mtp_steps)
    return SamplingConfig(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, verification=cfg.verification,
                          confidence_threshold=cfg.get("confidence_threshold", 0.0),
                          verify_length=cfg.get("verify_length", "full"), **draft_rules(cfg.get("draft_rule")))


def named_methods(cfg, overrides: list[str] | None = None) -> set[str]:
    """The methods the user asked for by name: they must run or fail, never be skipped.

    With the command line's `overrides`: every method of a `methods=` given there; from Python: a methods list other
    than conf/infer.yaml's. `drafter=<dir>` always names the drafter."""
    if overrides is None:
        from omegaconf import OmegaConf

        from dmtp.configs import CONF_DIR

        defaults = list(OmegaConf.load(Path(CONF_DIR) / "infer.yaml").methods)
        named = set(cfg.methods) if list(cfg.methods) != defaults else set()
    else:
        named = set(cfg.methods) if any(o.split("=", 1)[0].lstrip("+~") == "methods" for o in overrides) else set()
    if cfg.drafter.path:
        named.add("drafter")
    return named
