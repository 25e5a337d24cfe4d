"""Every target family registers once, in its own file, with what a family must have: the model types it
takes, its MTP layout, spec and block, its static-cache runner, a micro target and a test file."""
from __future__ import annotations

import ast
from pathlib import Path

from dmtp.decode.runners import StaticCacheRunner
from dmtp.families import catalogue
from dmtp.families.base import MTP_LAYOUTS, Family
from dmtp.families.catalogue import FAMILIES, STATIC_RUNNERS, family_of, mtp_family_of
from dmtp.tiny.presets import PRESETS

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "dmtp" / "families"
# The package's files that are not a family.
MACHINERY = {"__init__.py", "base.py", "catalogue.py", "mtp_loading.py", "decoding.py"}


def _written_by_real_targets() -> set[str]:
    """The micro checkpoints tests/test_real_targets.py writes (its `FAMILIES` keys)."""
    tree = ast.parse((REPO / "tests" / "test_real_targets.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "FAMILIES" for t in node.targets):
            return {ast.literal_eval(k) for k in node.value.keys}
    raise AssertionError("tests/test_real_targets.py has no FAMILIES table")


def test_each_family_is_one_file_registering_it_once():
    files = sorted(p.stem for p in PACKAGE.glob("*.py") if p.name not in MACHINERY)
    assert sorted(f.name for f in FAMILIES) == files
    for family in FAMILIES:
        assert getattr(catalogue, family.name).FAMILY is family, family.name
        assert family.runner.__module__ == f"dmtp.families.{family.name}"
        assert family.mtp_block.__module__ == f"dmtp.families.{family.name}"


def test_every_family_has_model_types_mtp_runner_micro_target_and_test():
    written = _written_by_real_targets()
    for family in FAMILIES:
        assert isinstance(family, Family)
        assert family.model_types and set(family.mtp_types) <= set(family.model_types), family.name
        assert family.mtp_layout in MTP_LAYOUTS
        assert callable(family.mtp_spec) and callable(family.mtp_block)
        assert issubclass(family.runner, StaticCacheRunner) and family.runner.family == family.name
        assert family.runner.why_unsupported is not StaticCacheRunner.why_unsupported, family.name
        assert family.micro in PRESETS or family.micro in written, f"{family.name}: no micro target {family.micro!r}"
        assert (REPO / family.test).is_file(), f"{family.name}: {family.test} does not exist"


def test_one_registry_keyed_by_model_type():
    seen = [t for f in FAMILIES for t in f.model_types]
    assert len(seen) == len(set(seen))
    for family in FAMILIES:
        assert all(family_of(t) is family for t in family.model_types)
        assert all(mtp_family_of(t) is family for t in family.mtp_types)
    assert family_of("gpt2") is None and mtp_family_of("llama") is None   # a dense runner, but no MTP block
    # the runner choice reads the same records, in the same order
    assert STATIC_RUNNERS == tuple(f.runner for f in FAMILIES)


def test_micro_presets_are_the_family_of_their_architecture():
    for family in FAMILIES:
        if family.micro in PRESETS:
            assert mtp_family_of(PRESETS[family.micro].architecture) is family, family.name
