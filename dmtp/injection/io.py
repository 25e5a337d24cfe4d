"""A trained DMTP drafter on disk: the published DFlash layout plus the injection module.

config.json carries the DFlash keys and, under "dmtp", the variant's name and arguments;
model.safetensors carries the DFlash tensors and the injection's own under `dmtp_injection.`.
A plain published DFlash drafter (no "dmtp" section) loads as `raw_dflash` unless told otherwise.
A drafter trained with its MTP (model.train_mtp) also carries `mtp.safetensors`: the tuned MTP under
the target checkpoint's own names (`tuned_mtp_path` finds it; the target is never modified).
"""
from __future__ import annotations

from pathlib import Path

import torch

from dmtp.injection import Injection, variant, variant_of
from dmtp.models.drafter import DFlashDrafter, load_drafter, read_drafter_config, save_drafter
from dmtp.models.mtp_loading import TUNED_MTP_NAME, save_tuned_mtp

PREFIX = "dmtp_injection."


def make_injection(name: str, hidden_size: int, num_target_features: int, mask_token_id: int, **kwargs) -> Injection:
    entry = variant(name)
    unknown = [k for k in kwargs if k not in entry.options]
    if unknown:
        raise ValueError(f"{unknown[0]!r} is not an option of injection {name} (its options: "
                         f"{', '.join(entry.options) or 'none'})")
    return entry.cls(hidden_size, num_target_features, mask_token_id, **kwargs)


def variant_name(injection: Injection) -> str:
    return variant_of(injection).name


def save_dmtp_drafter(path: str | Path, drafter: DFlashDrafter, injection: Injection, tuned_mtp=None,
                      target_path: str | Path | None = None, **extra_config) -> None:
    """`tuned_mtp`: a jointly trained MTP, written beside the drafter as mtp.safetensors under
    `target_path`'s own checkpoint names."""
    tensors = {PREFIX + k: v.detach().contiguous() for k, v in injection.state_dict().items()}
    # "injection_kwargs": the options it was built with (the key every exported drafter carries).
    meta = {"injection": variant_name(injection), "injection_kwargs": injection.variant_options, **extra_config}
    if tuned_mtp is not None:
        meta["tuned_mtp"] = TUNED_MTP_NAME
    save_drafter(path, drafter, extra_tensors=tensors, extra_config=meta)
    if tuned_mtp is not None:
        save_tuned_mtp(path, tuned_mtp, target_path)


def tuned_mtp_path(path: str | Path) -> Path | None:
    """The drafter's own tuned MTP (mtp.safetensors) if it has one; an error if its config says it was
    trained with one that is missing."""
    tuned = Path(path) / TUNED_MTP_NAME
    if tuned.is_file():
        return tuned
    if (read_drafter_config(path).get("dmtp") or {}).get("tuned_mtp"):
        raise FileNotFoundError(f"drafter {path} was trained with its MTP (model.train_mtp) but {tuned} is missing")
    return None


def load_dmtp_drafter(path: str | Path, dtype: torch.dtype = torch.float32, injection: str | None = None,
                      options: dict | None = None) -> tuple[DFlashDrafter, Injection, dict]:
    """-> (drafter, injection, extra config). `injection` overrides the saved variant (e.g. to
    continue a published DFlash drafter as dual_anchor_zero_init); its tensors then start fresh.
    `options` override the saved variant's own options (decoding-time ones, e.g. multi_mtp_zero_init's
    num_mtp_tokens / mtp_threshold)."""
    drafter, extra_tensors, meta = load_drafter(path, dtype=dtype)
    saved_name = meta.get("injection", "raw_dflash")
    name = injection or saved_name
    cfg = drafter.config
    num_features = len(cfg.target_layer_ids)
    kwargs = dict(meta.get("injection_kwargs", {}) if name == saved_name else {})
    kwargs.update(options or {})
    module = make_injection(name, cfg.hidden_size, num_features, cfg.mask_token_id, **kwargs)
    if module.context_dim != cfg.context_dim:
        raise ValueError(f"drafter at {path} has context width {cfg.context_dim}, but {name} needs {module.context_dim}")
    state = {k[len(PREFIX):]: v for k, v in extra_tensors.items() if k.startswith(PREFIX)}
    if name == saved_name:
        module.load_state_dict(state, strict=True)
    return drafter, module.to(dtype), meta


def check_drafter_fits(config, target, what: str) -> None:
    """A drafter runs only on the target it was built for: the same width and vocabulary (it uses the
    target's embedding and LM head) and depth (its target_layer_ids index the target's layers)."""
    mine = (config.hidden_size, config.vocab_size, config.num_target_layers)
    theirs = (target.hidden_size, target.config.vocab_size, target.num_layers)
    if mine != theirs:
        describe = "hidden size {}, vocab {}, {} layers".format
        raise ValueError(f"{what} was built for a different target ({describe(*mine)}) than {target.path} "
                         f"({describe(*theirs)})")


def fresh_drafter_for(target, name: str, mask_token_id: int, seed: int = 0, num_layers: int = 1,
                      perturb: float = 0.0, **options) -> tuple[DFlashDrafter, Injection]:
    """An untrained drafter + injection sized to `target` (tests, benchmark plumbing): one tapped
    layer (the middle one), the target's widths. `perturb` adds noise to the injection's weights so
    that every injected path (zero-init fusion included) changes the drafter's output. `options`: the
    variant's own (e.g. mtp_threshold)."""
    from dmtp.models.drafter_factory import build_drafter

    torch.manual_seed(seed)
    injection = make_injection(name, target.config.hidden_size, 1, mask_token_id, **options)
    drafter = build_drafter(target, injection.context_dim, mask_token_id, num_layers=num_layers, num_target_features=1)
    if perturb:
        with torch.no_grad():
            for p in injection.parameters():
                p.add_(perturb * torch.randn_like(p))
    return drafter.eval(), injection.eval()
