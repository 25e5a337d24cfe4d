"""The one catalogue of injection variants: each variant class registers itself here, once.

`@register_variant(name=..., slots=..., injected=...)` on the class in `dmtp/injection/<name>.py` is
the only place a variant is named and described. Everything else reads the catalogue: the loader
(`make_injection`, used by `dmtp.drafters.block_drafter`), the sweep report's labels (`dmtp.reports.sweep`), the README's variant table
(`dmtp.injection.readme_table`) and the test that checks `conf/injection/*.yaml` against it.

A variant's options are its constructor's own keyword arguments after the four the drafter sets
(hidden size, tapped layers, mask id, block size); their defaults and annotations come from the signature, so
nothing lists them by hand. The values a module was built with are recorded on it
(`Injection.variant_options`) and saved with the drafter, so it rebuilds identically.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

# Set by the drafter (its width, taps, mask token and block width), not options.
STRUCTURE = ("hidden_size", "num_target_features", "mask_token_id", "block_size")


@dataclass(frozen=True)
class Option:
    name: str
    default: Any
    annotation: str   # as written in the class signature (e.g. "int", "float | None")


@dataclass(frozen=True)
class Variant:
    name: str         # injection=<name>, conf/injection/<name>.yaml, saved as config.json's dmtp.injection
    cls: type
    slots: str        # the drafter's input slots, README notation
    injected: str     # what reaches the drafter from the MTP (README column)
    label: str        # the sweep report's short "interface" cell

    @property
    def options(self) -> dict[str, Option]:
        params = list(inspect.signature(self.cls.__init__).parameters.values())[1:]   # after self
        return {p.name: Option(p.name, p.default, _annotation_text(p.annotation))
                for p in params if p.name not in STRUCTURE}

    @property
    def target_path(self) -> str:
        """What Hydra's `_target_` names for this variant (the class as `dmtp.injection` exports it)."""
        return f"dmtp.injection.{self.cls.__name__}"


CATALOGUE: dict[str, Variant] = {}


def register_variant(*, name: str, slots: str, injected: str, label: str | None = None):
    """Class decorator: enter the variant in the catalogue and record, on every module it builds, the
    option values it was built with (defaults filled in: `variant_options`)."""

    def register(cls: type) -> type:
        if name in CATALOGUE:
            raise ValueError(f"injection variant {name!r} is registered twice "
                             f"({CATALOGUE[name].cls.__qualname__}, {cls.__qualname__})")
        cls.__init__ = _recording_options(cls.__init__)
        CATALOGUE[name] = Variant(name, cls, slots, injected, label or slots)
        return cls

    return register


def _recording_options(init):
    signature = inspect.signature(init)
    options = [p for p in list(signature.parameters)[1:] if p not in STRUCTURE]

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        init(self, *args, **kwargs)
        # Set after the class's own __init__, so that a subclass's (outer) record wins over its base's.
        self.variant_options = {k: bound.arguments[k] for k in options}

    return __init__


def _annotation_text(annotation) -> str:
    if annotation is inspect.Parameter.empty:
        return ""
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))


def variant(name: str) -> Variant:
    if name not in CATALOGUE:
        raise ValueError(f"unknown injection variant {name!r}; choose from {', '.join(CATALOGUE)}")
    return CATALOGUE[name]


def make_injection(name: str, hidden_size: int, num_target_features: int, mask_token_id: int, block_size: int,
                   **options):
    """A module of variant `name` for blocks of `block_size` slots; an option it does not have is one
    clear error."""
    entry = variant(name)
    unknown = [k for k in options if k not in entry.options]
    if unknown:
        raise ValueError(f"{unknown[0]!r} is not an option of injection {name} (its options: "
                         f"{', '.join(entry.options) or 'none'})")
    return entry.cls(hidden_size, num_target_features, mask_token_id, block_size, **options)


def variant_of(module) -> Variant:
    for entry in CATALOGUE.values():
        if type(module) is entry.cls:
            return entry
    raise ValueError(f"{type(module).__name__} is not a registered injection variant")


__all__ = ["CATALOGUE", "Option", "STRUCTURE", "Variant", "make_injection", "register_variant", "variant",
           "variant_of"]
