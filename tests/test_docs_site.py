"""The documentation: the README stays a front page, every page is reachable from the site's navigation, the
generated tables match the code, and the site builds with `mkdocs build --strict` (a broken link or anchor, a page
that does not render, or an API page whose module is gone fails it), offline."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dmtp.injection.readme_table import BEGIN, END, render_table, table_in

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_LIMIT = 12_000          # characters: a page that reads top to bottom (issue 66)
QUICK_START = ('pip install -e . && python -m dmtp.train', 'pip install -e ".[dev]" && python -m pytest -q')


def _nav_pages(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [p for item in node for p in _nav_pages(item)]
    if isinstance(node, dict):
        return [p for value in node.values() for p in _nav_pages(value)]
    return []


def test_readme_is_a_front_page():
    text = README.read_text()
    assert len(text) <= README_LIMIT, f"README.md has {len(text)} characters, over {README_LIMIT}: move detail to docs/"
    for command in QUICK_START:
        assert command in text, f"the quick start's command is not in README.md as written: {command}"
    for page in ("docs/getting-started.md", "docs/training.md", "docs/decoding.md", "docs/results.md",
                 "docs/serving.md", "docs/scale.md"):
        assert f"]({page})" in text, f"README.md does not link {page}"
    broken = [link for link in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
              if "://" not in link and not (ROOT / link).exists()]
    assert broken == [], f"README.md links to files that do not exist: {broken}"


def test_every_page_is_in_the_navigation():
    nav = set(_nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]))
    pages = {p.relative_to(ROOT / "docs").as_posix()
             for p in [*(ROOT / "docs").glob("*.md"), *(ROOT / "docs" / "results").glob("*.md")]}
    assert pages - nav == set(), f"pages missing from mkdocs.yml's nav: {sorted(pages - nav)}"
    assert nav - pages == set(), f"nav entries without a page: {sorted(nav - pages)}"


def test_results_index_lists_every_study_page():
    index = (ROOT / "docs" / "results.md").read_text()
    for page in sorted((ROOT / "docs" / "results").glob("*.md")):
        assert f"](results/{page.name})" in index, f"docs/results.md does not list {page.name}"


def test_variant_tables_are_the_catalogue():
    for path in (README, ROOT / "docs" / "training.md"):
        text = path.read_text()
        assert BEGIN in text and END in text, f"{path.name} lost its generated variants table"
        assert table_in(text) == render_table(), \
            f"{path.name}'s variants table is stale: python -m dmtp.injection.readme_table --readme {path.relative_to(ROOT)}"


def test_the_site_builds_strictly_and_offline(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        pytest.skip('mkdocs is not installed: pip install -e ".[dev]"')
    nowhere = "http://127.0.0.1:9"          # any fetch at build time fails at once
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "http_proxy": nowhere, "https_proxy": nowhere,
           "HTTP_PROXY": nowhere, "HTTPS_PROXY": nowhere, "no_proxy": "", "NO_PROXY": ""}
    site = tmp_path / "site"
    # not --quiet: it drops the warnings --strict counts, and the build passes with a broken link
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                          "-d", str(site)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    warnings = [line for line in (run.stdout + run.stderr).splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert run.returncode == 0 and not warnings, "mkdocs build --strict failed:\n" + "\n".join(
        warnings or (run.stdout + run.stderr).splitlines()[-40:])
    assert (site / "index.html").is_file()
    api = (site / "api.html").read_text()
    assert "draft_block" in api and "SpecDecoder" in api, "the API reference was not generated from the docstrings"
    benchmarks = (site / "benchmarks.html").read_text()
    assert "At a glance" in benchmarks and "--8&lt;--" not in benchmarks, "BENCHMARKS.md was not included"
    assert not re.search(r"fonts\.googleapis|fonts\.gstatic", (site / "index.html").read_text())
