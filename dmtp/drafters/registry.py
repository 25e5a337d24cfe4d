"""The drafter architectures, each registered once: `@register_drafter(name=..., published=..., dmtp_published=...,
config=...)` on its module class, in its own file (dflash.py, dflash2.py, dspark.py).

Everything else reads `ARCHITECTURES`: the factory (`architecture=<name>`), and the checkpoint I/O (the class of a
config.json's `architectures`). Importing `dmtp.drafters` imports every shipped architecture, so this module imports
none."""
from __future__ import annotations

from dataclasses import dataclass

# `DFlashConfig` / `DFlashDrafter` below are annotations only (never evaluated): the architectures import
# this module, never the reverse.

# A config.json naming no registered architecture is read as DFlash v1 (published name).
DFLASH_ARCH = "DFlashDraftModel"


@dataclass(frozen=True)
class DrafterArchitecture:
    name: str                     # conf/drafter `architecture=<name>`
    published: str                # config.json `architectures` of the backbone as published
    # A DMTP export (the backbone fed by an injection that needs the target's MTP) is a different model:
    # it is named apart, so no engine runs it as the published drafter it is not (vLLM would refuse its
    # `dmtp_injection.*` tensors; a laxer loader would run it silently as raw DFlash). The tensors under
    # the published names are unchanged.
    dmtp_published: str
    config: type[DFlashConfig]
    module: type[DFlashDrafter]


# Published architecture name -> its registration. Architectures register themselves (`register_drafter`)
# when their module is imported; dmtp.drafters' __init__ imports every shipped one, so this module never
# imports them.
ARCHITECTURES: dict[str, DrafterArchitecture] = {}


def register_drafter(*, name: str, published: str, dmtp_published: str, config: type[DFlashConfig]):
    """Class decorator: the decorated drafter class builds `published` (config.json's `architectures`, or
    `dmtp_published` for a DMTP export) and `architecture=<name>` of conf/drafter, from `config`."""
    def register(cls: type[DFlashDrafter]) -> type[DFlashDrafter]:
        taken = [a for a in ARCHITECTURES.values() if a.module is not cls and
                 ({a.name, a.published, a.dmtp_published} & {name, published, dmtp_published})]
        if taken:
            raise ValueError(f"drafter architecture {name!r} ({published}) clashes with {taken[0].name!r}")
        config.architecture = published
        ARCHITECTURES[published] = DrafterArchitecture(name, published, dmtp_published, config, cls)
        return cls
    return register


def architecture_named(name: str) -> DrafterArchitecture:
    """The registration of conf/drafter's `architecture=<name>`, or one line listing the known ones."""
    for arch in ARCHITECTURES.values():
        if arch.name == name:
            return arch
    known = ", ".join(sorted(a.name for a in ARCHITECTURES.values()))
    raise ValueError(f"drafter architecture must be one of {known}, got {name!r}")


def method_name(variant: str, architecture: str, mtp_correction_rank: int = 0) -> str:
    """How every table names a drafter: its injection, its architecture when not DFlash (`raw_dflash+dspark`,
    `dual_anchor_zero_init+dspark`) and `+mtp_correction` when it corrects the MTP's proposals. `architecture`:
    config.json's (published) name.

    The one rule: training's records, dmtp.infer's rows and the sweep report."""
    arch = ARCHITECTURES[architecture].name if architecture in ARCHITECTURES else "dflash"
    return variant + ("" if arch == "dflash" else f"+{arch}") + ("+mtp_correction" if mtp_correction_rank else "")


def backbone_architecture(name: str) -> str:
    """The published backbone architecture of a config.json `architectures` entry (itself for those)."""
    return next((a.published for a in ARCHITECTURES.values() if a.dmtp_published == name), name)


def architecture_of_names(names: list[str]) -> DrafterArchitecture:
    """The registration a config.json's `architectures` names (published or DMTP name); DFlash v1 for others."""
    for name in names:
        if backbone_architecture(name) in ARCHITECTURES:
            return ARCHITECTURES[backbone_architecture(name)]
    return ARCHITECTURES[DFLASH_ARCH]


def drafter_class(config: DFlashConfig) -> type[DFlashDrafter]:
    """The module class of a config's architecture."""
    if config.architecture not in ARCHITECTURES:
        raise ValueError(f"no drafter class is registered for architecture {config.architecture!r} "
                         f"(registered: {', '.join(ARCHITECTURES)})")
    return ARCHITECTURES[config.architecture].module


def build_drafter_from_config(config: DFlashConfig) -> DFlashDrafter:
    return drafter_class(config)(config)


def owned_prefixes() -> tuple[str, ...]:
    """Every registered architecture's tensor names: none of them may be an extra tensor."""
    return tuple(dict.fromkeys(p for a in ARCHITECTURES.values() for p in a.module.tensor_prefixes))


def stored_aliases() -> dict[str, str]:
    return {k: v for a in ARCHITECTURES.values() for k, v in a.module.stored_aliases.items()}


__all__ = ["ARCHITECTURES", "DFLASH_ARCH", "DrafterArchitecture", "architecture_named", "architecture_of_names",
           "backbone_architecture", "build_drafter_from_config", "drafter_class", "owned_prefixes",
           "register_drafter", "stored_aliases"]
