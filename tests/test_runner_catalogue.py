"""The target runners: a catalogue of classes (one per family) that each say why they do not fit a target,
and one copy of the runner machinery (the static-cache forward and the parameter binding live in
dmtp/decode/runners/base.py only; the families' files hold what is their own)."""
from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

from dmtp.decode.runners import RecomputeTargetRunner, StaticCacheRunner
from dmtp.families.catalogue import STATIC_RUNNERS, static_runner_for

ROOT = Path(__file__).resolve().parents[1] / "dmtp"
# The runner machinery and the files holding each family's runner.
RUNNER_FILES = sorted((ROOT / "decode" / "runners").glob("*.py")) + sorted(
    p for p in (ROOT / "families").glob("*.py") if p.name not in ("__init__.py", "base.py", "catalogue.py",
                                                                  "mtp_loading.py"))
# The static-cache machinery every family shares; recompute.py is a different runtime with its own.
SHARED_METHODS = {"allocate", "prefill", "verify", "_forward", "attend_cached", "visible_slots"}


def _trees() -> dict[str, ast.Module]:
    return {p.name: ast.parse(p.read_text()) for p in RUNNER_FILES}


def test_catalogue_is_runner_classes_that_say_why_they_do_not_fit(micro_target):
    assert STATIC_RUNNERS and all(isinstance(cls, type) and issubclass(cls, StaticCacheRunner) for cls in STATIC_RUNNERS)
    families = [cls.family for cls in STATIC_RUNNERS]
    assert len(set(families)) == len(families) and "base" not in families
    reasons = {cls.family: cls.why_unsupported(micro_target) for cls in STATIC_RUNNERS}
    assert reasons["dense"] is None                       # the micro target is a dense Qwen3
    assert all(isinstance(why, str) and why for family, why in reasons.items() if family != "dense")
    assert static_runner_for(micro_target) == (STATIC_RUNNERS[0], "")
    assert RecomputeTargetRunner.why_unsupported(micro_target) is None


def test_no_helper_is_defined_in_two_runner_files():
    top = Counter(node.name for tree in _trees().values() for node in tree.body
                  if isinstance(node, (ast.FunctionDef, ast.ClassDef)))
    assert [name for name, n in top.items() if n > 1] == []


def test_static_cache_machinery_and_binding_live_in_base_only():
    for name, tree in _trees().items():
        if name in ("base.py", "recompute.py"):
            continue
        methods = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert methods & SHARED_METHODS == set(), name
        # transformers' parameters are bound by attribute name through base.bind, not assigned one by one
        assigned = [f"{ast.unparse(t)}" for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets
                    if isinstance(t, ast.Attribute) and t.attr in ("weight", "bias", "eps")]
        assert assigned == [], name
