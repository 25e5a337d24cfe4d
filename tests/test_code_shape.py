"""The shape the code keeps (read from the source, nothing imported): small functions, no package that holds
a large share of the code, tools and tests that import the package rather than each other through `sys.path`,
and comments that say why rather than narrate history (which lives in docs/ and BENCHMARKS.md)."""
from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dmtp"
MAX_FUNCTION_LINES = 60
MAX_PACKAGE_SHARE = 0.12   # of the package's lines, for each package's own files (a sub-package counts apart)


def package_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def long_functions(path: Path, limit: int) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    return [f"{shown(path)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > limit]


def test_no_function_over_the_limit():
    found = [f for path in package_files() for f in long_functions(path, MAX_FUNCTION_LINES)]
    assert found == [], f"functions over {MAX_FUNCTION_LINES} lines (split them into named steps):\n" + "\n".join(found)


def package_shares() -> dict[str, float]:
    lines = Counter()
    for path in package_files():
        lines[str(path.parent.relative_to(ROOT))] += len(path.read_text().splitlines())
    total = sum(lines.values())
    return {package: n / total for package, n in lines.items()}


def test_no_package_holds_too_large_a_share():
    shares = package_shares()
    big = {package: round(share, 3) for package, share in shares.items() if share > MAX_PACKAGE_SHARE}
    assert big == {}, f"packages over {MAX_PACKAGE_SHARE:.0%} of dmtp/'s lines (split by job): {big}"


def test_tools_and_tests_do_not_edit_sys_path():
    edits = [f"{p.relative_to(ROOT)}:{i}" for folder in ("tools", "tests") for p in sorted((ROOT / folder).rglob("*.py"))
             if p.name != Path(__file__).name
             for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"sys\.path\.(insert|append)", line)]
    assert edits == [], "import the shared pieces from the package instead: " + ", ".join(edits)


def test_package_comments_do_not_narrate_history():
    found = []
    for path in package_files():
        for i, line in enumerate(path.read_text().splitlines(), 1):
            text = line.split("#", 1)[1] if "#" in line else line if line.strip().startswith(('"', "'")) else ""
            if re.search(r"\bissue #?\d+\b|\bcommit [0-9a-f]{7,40}\b", text, re.I):
                found.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()[:80]}")
    assert found == [], "history belongs in docs/ and BENCHMARKS.md:\n" + "\n".join(found)


def test_the_guards_see_what_they_guard(tmp_path):
    """The scanners themselves: a long function is found, a short one is not."""
    src = tmp_path / "m.py"
    src.write_text("def short():\n    return 1\n\n\ndef long():\n" + "    x = 1\n" * 70)
    assert long_functions(src, MAX_FUNCTION_LINES) == ["m.py:5 long (71 lines)"]


SENTENCE_BOUNDARY = re.compile(r"[a-z0-9)`][.] [A-Z]")


def test_docstrings_open_with_one_sentence():
    """PEP 257's summary line: a docstring's opening paragraph is one sentence; the rest follows a blank line."""
    found = []
    for path in package_files():
        tree = ast.parse(path.read_text(), str(path))
        for node in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef,
                                                                          ast.AsyncFunctionDef)))]:
            doc = ast.get_docstring(node)
            if doc and SENTENCE_BOUNDARY.search(doc.split("\n\n")[0].replace("\n", " ")):
                found.append(f"{shown(path)}:{getattr(node, 'name', '<module>')}")
    assert found == [], "docstrings whose opening paragraph holds more than one sentence:\n" + "\n".join(found)
