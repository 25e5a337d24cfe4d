"""The package's layers, checked on every import the code makes (module level and inside functions, `import x`,
`from x import y`, relative imports): no import circle between modules, and no arrow from a lower tier up to a
higher one. A module may import its own tier sideways (another package of it) only where that makes no circle.

Tiers, low -> high (the one table, one tier per folder; a new package or top-level module must be placed here,
or this test fails):
  0  utilities every layer may use (files, paths, threads, warnings, error wording, config composition) and a
     training run's lifecycle (dmtp.runs: directories, resume, checkpoint I/O, RNG state, the safety callbacks)
  1  the model, injection, drafter-architecture (the block drafter included) and data libraries
  2  what is built on them: decoding, the target families (each one's MTP block and static-cache runner,
     built on decoding's runner machinery), the embedded tiny-target builder, the speed projection (dmtp.speed:
     stage-cost profiles and each method's round)
  3  applications of those: reports, serving (every engine behind one interface), offline data generation,
     inference, the benchmarks' shared pieces, training
  4  commands and their command-line plumbing, and tools/
Inside a tier, packages that build on others of it sit above them (the decimals): the injection variants below
the drafter architectures (1.1 < 1.2), decoding below the families that give it runners below the tiny-target
builder (2.1 < 2.2 < 2.3), reports below serving below data generation (which writes through an engine) below
inference below the benchmarks' pieces below training (3.0 < 3.1 < 3.15 < 3.2 < 3.25 < 3.3). Commands (COMMANDS) are tier 4 wherever they sit.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TIERS = {
    # 0: utilities, and the run's lifecycle
    "dmtp": 0,   # the package's __init__ only (it registers the config resolvers)
    "dmtp.atomic_io": 0, "dmtp.paths": 0, "dmtp.threads": 0, "dmtp.quiet": 0, "dmtp.errors": 0,
    "dmtp.configs": 0, "dmtp.resolvers": 0, "dmtp.runs": 0,
    # 1: libraries (the block width, dmtp.models.block_size, is the models' and read by both above them)
    "dmtp.models": 1, "dmtp.data": 1, "dmtp.injection": 1.1, "dmtp.drafters": 1.2,
    # 2: built on the libraries
    "dmtp.decode": 2.1, "dmtp.families": 2.2, "dmtp.tiny": 2.3,
    # 3: applications
    "dmtp.speed": 2.4,
    "dmtp.reports": 3, "dmtp.serving": 3.1, "dmtp.datagen": 3.15, "dmtp.inference": 3.2, "dmtp.bench": 3.25,
    "dmtp.training": 3.3,
    # 4: commands (imported by nothing: see COMMANDS) and their plumbing; tools/
    "dmtp.cli": 4, "dmtp.train": 4, "dmtp.infer": 4, "dmtp.report": 4, "dmtp.prepare": 4, "dmtp.regime": 4,
    "tools": 4,
}
COMMANDS = {"dmtp.train", "dmtp.infer", "dmtp.report", "dmtp.prepare", "dmtp.regime", "dmtp.tiny.build"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_files() -> dict[str, Path]:
    files = list((ROOT / "dmtp").rglob("*.py")) + list((ROOT / "tools").rglob("*.py"))
    return {module_name(p): p for p in files}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The dmtp/tools modules `path` imports anywhere in its body, each resolved to the module file it runs
    (`from pkg import sub` is the submodule when `sub` is one, else the package)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:   # `import a.b.c` of a non-module attribute path
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


@functools.lru_cache(maxsize=1)
def import_graph() -> dict[str, set[str]]:
    files = source_files()
    known = set(files)
    # tools/ run as scripts: an import of one by another (`from bench_decode import ...`) is seen by its bare name
    bare = {n.rpartition(".")[2]: n for n in files if n.startswith("tools.")}
    known |= set(bare)
    graph = {}
    for name, path in files.items():
        edges = imports_of(name, path, known)
        graph[name] = {bare[e] if e in bare and e not in files else e for e in edges}
    return graph


def tier_of(module: str) -> float | None:
    if module in COMMANDS:
        return 4
    table = TIERS
    best = None
    for prefix in table:
        if module == prefix or (prefix != "dmtp" and module.startswith(prefix + ".")):
            if best is None or len(prefix) > len(best):
                best = prefix
    return None if best is None else table[best]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of two or more modules (Tarjan), each as one circle through it."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(circle_through(graph, set(component)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def circle_through(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """One concrete circle inside a strongly connected `component`: a -> b -> ... -> a."""
    start = min(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & component):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    return sorted(component)


def test_every_module_has_a_tier():
    unplaced = sorted(m for m in source_files() if tier_of(m) is None)
    assert unplaced == [], f"place these in tests/test_layering.py TIERS: {unplaced}"


def test_one_tier_per_folder():
    """Each entry of the table is a top-level package or module: a folder has one tier, all of it."""
    nested = sorted(m for m in TIERS if m.startswith("dmtp.") and m.count(".") > 1)
    assert nested == [], f"tier entries inside a package: {nested}"


def test_no_import_circle():
    found = [" -> ".join(c) for c in cycles(import_graph())]
    assert found == [], "import circles:\n" + "\n".join(found)


def upward_arrows(graph) -> list[str]:
    arrows = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            low, high = tier_of(module), tier_of(target)
            if low is not None and high is not None and high > low:
                arrows.append(f"{module} (tier {low}) imports {target} (tier {high})")
    return arrows


def test_no_upward_import():
    arrows = upward_arrows(import_graph())
    assert arrows == [], "upward imports:\n" + "\n".join(arrows)


def test_no_tool_imports_another_tool():
    """What two scripts share lives in the package (dmtp.bench), not in one of them."""
    graph = import_graph()
    offenders = sorted(f"{m} imports {t}" for m, targets in graph.items() if m.startswith("tools.")
                       for t in targets if t.startswith("tools."))
    assert offenders == [], offenders


def test_no_module_imports_a_command():
    graph = import_graph()
    offenders = sorted(f"{m} imports {t}" for m, targets in graph.items() for t in targets & COMMANDS)
    assert offenders == []


def test_the_walk_sees_lazy_relative_and_aliased_imports(tmp_path):
    """The walker itself: an import inside a method, a relative one and `import a.b as c` all count."""
    pkg = tmp_path / "dmtp" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("class A:\n    def f(self):\n        from .b import thing\n")
    (pkg / "b.py").write_text("import dmtp.pkg.c as c\n")
    (pkg / "c.py").write_text("def g():\n    from dmtp.pkg import a\n")
    known = {"dmtp", "dmtp.pkg", "dmtp.pkg.a", "dmtp.pkg.b", "dmtp.pkg.c"}
    graph = {n: imports_of(n, tmp_path / (n.replace(".", "/") + ".py"), known)
             for n in ("dmtp.pkg.a", "dmtp.pkg.b", "dmtp.pkg.c")}
    assert graph == {"dmtp.pkg.a": {"dmtp.pkg.b"}, "dmtp.pkg.b": {"dmtp.pkg.c"}, "dmtp.pkg.c": {"dmtp.pkg.a"}}
    assert cycles(graph) == [["dmtp.pkg.a", "dmtp.pkg.b", "dmtp.pkg.c", "dmtp.pkg.a"]]


def test_the_arrows_that_once_pointed_up_are_upward_in_the_table():
    """The injection read the block width from a drafter architecture, the loop chose its runner from the families'
    catalogue, and dmtp's engine built its decoders through the inference loader: each now goes the other way (the
    width is dmtp.models.block_size's, the runner is chosen in dmtp.families.decoding), and the table keeps it so."""
    for low, high in (("dmtp.injection.base", "dmtp.drafters.dflash"), ("dmtp.decode.loop", "dmtp.families.catalogue"),
                      ("dmtp.serving.dmtp_loop", "dmtp.inference.setup")):
        assert tier_of(low) < tier_of(high)
        assert high not in import_graph()[low]
