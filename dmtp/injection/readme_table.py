"""README.md's "Injection variants" table, rendered from the catalogue.

`python -m dmtp.injection.readme_table` rewrites the table in README.md (between the two marker
comments); `--check` only reports whether it is current (tests/test_variant_catalogue.py fails when it
is not), so the README cannot drift from the registered variants.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from dmtp.injection import CATALOGUE

BEGIN = "<!-- variants table: generated from dmtp/injection/catalogue.py by python -m dmtp.injection.readme_table -->"
END = "<!-- end of variants table -->"
README = Path(__file__).resolve().parents[2] / "README.md"


def render_table() -> str:
    lines = ["| name | drafter input slots | injected |", "|---|---|---|"]
    lines += [f"| `{e.name}` | `{e.slots}` | {e.injected} |" for e in CATALOGUE.values()]
    return "\n".join(lines) + "\n"


def table_in(text: str) -> str:
    """The table between the markers of a README's text."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"README has no generated variants table (markers {BEGIN!r} ... {END!r})")
    return text.split(BEGIN, 1)[1].split(END, 1)[0].lstrip("\n")


def with_table(text: str, table: str) -> str:
    head, rest = text.split(BEGIN, 1)
    return head + BEGIN + "\n" + table + END + rest.split(END, 1)[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Render README.md's injection-variant table from the catalogue.")
    parser.add_argument("--readme", type=Path, default=README)
    parser.add_argument("--check", action="store_true", help="only report whether the table is current")
    args = parser.parse_args(argv)
    text = args.readme.read_text()
    current = table_in(text) == render_table()
    if args.check:
        print(f"{args.readme}: variants table is {'current' if current else 'out of date'}")
        return 0 if current else 1
    if not current:
        args.readme.write_text(with_table(text, render_table()))
    print(f"{args.readme}: variants table {'unchanged' if current else 'rewritten'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
