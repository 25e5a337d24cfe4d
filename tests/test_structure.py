"""Library vs command, and no import circles: commands are imported by nothing, and a base module never
imports the module built on it (subclasses and families register themselves instead)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dmtp.models.dflash2 import DFlash2Drafter
from dmtp.models.drafter import DFLASH2_ARCH, DFLASH_ARCH, DRAFTER_CLASSES, DFlashConfig, DFlashDrafter, drafter_class

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {"dmtp.train", "dmtp.infer", "dmtp.tiny.build", "dmtp.report"}


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth (lazy imports inside functions included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_library_module_or_tool_imports_a_command():
    files = [p for p in (ROOT / "dmtp").rglob("*.py")] + list((ROOT / "tools").glob("*.py"))
    offenders = {str(p.relative_to(ROOT)): sorted(imported_modules(p) & COMMANDS) for p in files}
    assert {k: v for k, v in offenders.items() if v} == {}


@pytest.mark.parametrize("base,built_on", [("dmtp/models/drafter.py", "dmtp.models.dflash2"),
                                           ("dmtp/models/mtp_families.py", "dmtp.models.mtp_loading"),
                                           ("dmtp/models/target.py", "dmtp.tiny.build")])
def test_base_module_does_not_import_what_builds_on_it(base, built_on):
    assert built_on not in imported_modules(ROOT / base)


def test_drafter_architectures_are_registered():
    assert DRAFTER_CLASSES[DFLASH_ARCH] is DFlashDrafter and DRAFTER_CLASSES[DFLASH2_ARCH] is DFlash2Drafter
    config = DFlashConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=2, head_dim=16, vocab_size=50, num_target_layers=2,
                          target_layer_ids=[0], mask_token_id=3)
    assert drafter_class(config) is DFlashDrafter
    DRAFTER_CLASSES.pop(DFLASH_ARCH)
    try:
        with pytest.raises(ValueError, match="no drafter class is registered for architecture 'DFlashDraftModel'"):
            drafter_class(config)
    finally:
        DRAFTER_CLASSES[DFLASH_ARCH] = DFlashDrafter
