"""Every command the README and the documentation site show still works as written, so no documented option, group
or flag can drift from the code.

The test collects each `python -m dmtp.<command> ...` (and `python tools/....py ...`) from README.md, BENCHMARKS.md
and docs/*.md, docs/results/*.md: lines of ```bash blocks (continuation lines joined, a block's own `NAME=...`
variables expanded, the command cut at `&&`, `;`, `|` or a redirection) and inline code. A Hydra command is
composed with its config (`conf/<name>.yaml`, in-process: the compose API is what `--cfg job` prints) with its
overrides; a multirun composes its first job, and every other option a swept config group takes (a `+sweep=<file>`'s
parameters included) must exist in that group (tests/test_configs.py composes every sweep file's jobs).
An argparse command parses its arguments with its own parser and stops there. Placeholders (`<run>`, `<dir>`,
`/models/...`) stay strings, which composing never opens; a placeholder for a config group takes one of its options.
In inline code, `a|b|c` is a choice (each is checked) and `[...]` an optional part (checked as present).

Not collected: docs/benchmarks-history.md, dated records of what ran at a past commit.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import re
import runpy
import shlex
import sys
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from dmtp.cli import drafter_path_shorthand
from dmtp.configs import CONF_DIR

ROOT = Path(__file__).resolve().parents[1]
PLACEHOLDER = "PLACEHOLDER"
# Rewrites a command's own main() applies to its arguments before Hydra parses them.
ARGV_REWRITES = {"dmtp.infer": drafter_path_shorthand}

_COMMAND = re.compile(r"(?:\bpython3?(?:\s+-[A-Za-z]+)*\s+-m\s+|\btorchrun\b[^\n]*?\s-m\s+)(dmtp(?:\.\w+)+)"
                      r"|\bpython3?\s+(tools/[\w./-]+\.py)\b")
_FENCE = re.compile(r"^\s*(```|~~~)\s*([\w+-]*)")
_SHELL_LANGS = {"", "bash", "sh", "shell", "console", "text"}
_ASSIGN = re.compile(r"^\s*(?:export\s+)?([A-Za-z_]\w*)=(\"[^\"]*\"|'[^']*'|\S*)\s*(?:#.*)?$")
_VAR = re.compile(r"\\?\$(?:\{(\w+)\}|(\w+))")
_ANGLE = re.compile(r"<[^<>\n]+>")


def documentation_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "docs" / "results").glob("*.md"))]
    return [f for f in files if f.name != "benchmarks-history.md"]


@dataclass
class Command:
    where: str                      # file:line
    target: str                     # dmtp.<module> or tools/<script>.py
    argv: list[str]
    inline: bool
    variants: list[list[str]] = field(default_factory=list)

    def __str__(self):
        return f"{self.where}: {self.target} {' '.join(self.argv)}"


# ------------------------------------------------------------------------------------------------ collection


def _logical_lines(lines: list[tuple[int, str]]):
    """Shell lines with their trailing-backslash continuations joined: (first line number, text)."""
    out, buf, start = [], "", None
    for no, line in lines:
        if start is None:
            start = no
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        out.append((start, buf + line))
        buf, start = "", None
    if buf:
        out.append((start, buf))
    return out


def _expand(text: str, env: dict[str, str]) -> str:
    return _VAR.sub(lambda m: env.get(m.group(1) or m.group(2), "1"), text)


def _commands_in(text: str, where: str, inline: bool, env: dict[str, str]) -> list[Command]:
    text = _ANGLE.sub(PLACEHOLDER, _expand(text, env))
    found = []
    for m in _COMMAND.finditer(text):
        rest = text[m.end():]
        if text[:m.start()].replace('\\"', "").count('"') % 2:   # inside `bash -c "..."`: the string ends it
            rest = re.split(r'(?<!\\)"', rest, maxsplit=1)[0]
        found.append(Command(where, m.group(1) or m.group(2), _tokens(rest, inline), inline))
    return found


def _tokens(rest: str, inline: bool) -> list[str]:
    stops = ";&" if inline else ";&|<>()"
    lex = shlex.shlex(rest, posix=True, punctuation_chars=stops)
    lex.whitespace_split, lex.commenters = True, "" if inline else "#"
    tokens = []
    try:
        for tok in lex:
            if set(tok) <= set(stops):
                break
            tokens.append(tok)
    except ValueError:       # an unclosed quote in prose around inline code: keep what was read
        pass
    return tokens


def collect(path: Path) -> list[Command]:
    rel = path.relative_to(ROOT).as_posix()
    lines = path.read_text().splitlines()
    commands, outside = [], []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            outside.append(lines[i])
            i += 1
            continue
        lang, j, block = fence.group(2).lower(), i + 1, []
        while j < len(lines) and not lines[j].lstrip().startswith(fence.group(1)):
            block.append((j + 1, lines[j]))
            j += 1
        outside.extend([""] * (j + 1 - i))        # keep line numbers of the text outside blocks
        if lang in _SHELL_LANGS:
            env: dict[str, str] = {}
            for no, line in _logical_lines(block):
                assign = _ASSIGN.match(line)
                if assign and "python" not in line:
                    env[assign.group(1)] = _expand(assign.group(2).strip("\"'"), env)
                    continue
                commands += _commands_in(line, f"{rel}:{no}", inline=False, env=env)
        i = j + 1
    prose = "\n".join(outside)
    for m in re.finditer(r"(`+)(.+?)\1", prose, flags=re.S):
        span = m.group(2).replace("\\|", "|").replace("\n", " ")
        no = prose.count("\n", 0, m.start()) + 1
        commands += _commands_in(span, f"{rel}:{no}", inline=True, env={})
    return commands


# ------------------------------------------------------------------------------------------------ variants


def _unwrap(tok: str) -> str | None:
    """A documented token as a command takes it: optional brackets dropped, ellipses and bare placeholders gone."""
    if tok in ("...", "…", "[...]", "[…]", "|"):
        return None
    if tok.startswith("[") and re.match(r"\[(-|[+~]*[\w.]+=)", tok):
        tok = tok[1:]
    if tok.endswith("]") and tok.count("]") > tok.count("["):
        tok = tok[:-1]
    tok = re.sub(r",(\.\.\.|…)$", "", tok)
    return tok or None


def variants(cmd: Command) -> list[list[str]]:
    """The argument lists a documented command stands for: each choice of an inline `a|b|c` (in turn)."""
    options = []
    for raw in cmd.argv:
        tok = _unwrap(raw)
        if tok is None:
            continue
        if cmd.inline and "|" in tok:
            head, *alts = tok.split("|")
            key = head.split("=", 1)[0] + "=" if "=" in head else ""
            options.append([head] + [alt if (not key or "=" in alt) else key + alt for alt in alts])
        else:
            options.append([tok])
    width = max((len(o) for o in options), default=1)
    return [[o[min(k, len(o) - 1)] for o in options] for k in range(width)]


# ------------------------------------------------------------------------------------------------ checks


def _groups() -> set[str]:
    conf = Path(CONF_DIR)
    return {p.relative_to(conf).as_posix() for p in conf.rglob("*") if p.is_dir()}


GROUPS = _groups()


def _group_option(group: str) -> str:
    return sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml"))[0]


def _split_top(value: str) -> list[str]:
    """Hydra's sweep syntax `a,b,c` (commas outside brackets and quotes); one item if it is no sweep."""
    parts, depth, quote, cur = [], 0, None, ""
    for ch in value:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        cur += ch
    return parts + [cur]


def hydra_config_name(module: str) -> str | None:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"no module {module}")
    m = re.search(r"@hydra\.main\([^)]*config_name=\"(\w+)\"", Path(spec.origin).read_text())
    return m.group(1) if m else None


def hydra_jobs(argv: list[str]) -> tuple[bool, list[str], dict[str, list[str]]]:
    """(multirun, the fixed overrides, the swept ones: key -> its values)."""
    multirun, overrides = False, []
    it = iter(argv)
    for tok in it:
        if tok == PLACEHOLDER:                    # `<the run's options>`: stands for overrides, none in particular
            continue
        if tok in ("-m", "--multirun"):
            multirun = True
        elif tok in ("--cfg", "-c", "--package", "-p", "--info", "-i"):
            next(it, None)
        elif tok in ("--help", "-h", "--hydra-help", "--resolve"):
            continue
        elif tok.startswith("-"):
            raise ValueError(f"a flag this test does not know: {tok}")
        else:
            key, eq, value = tok.partition("=")
            if not eq and not key.startswith("~"):
                raise ValueError(f"not an override (key=value): {tok!r}")
            if PLACEHOLDER in value and key.lstrip("+") in GROUPS:
                value = _group_option(key.lstrip("+"))
            overrides.append((key, value, eq))
    fixed = [f"{k}{e}{v}" for k, v, e in overrides if not (multirun and len(_split_top(v)) > 1)]
    swept = {k: _split_top(v) for k, v, e in overrides if multirun and len(_split_top(v)) > 1}
    return multirun, fixed, swept


def compose_jobs(config_name: str, argv: list[str], cache: dict) -> list[str]:
    """Compose each job of a documented Hydra command; the errors, one line each."""
    multirun, fixed, swept = hydra_jobs(argv)
    errors = []

    def attempt(overrides):
        key = (config_name, tuple(overrides))
        if key not in cache:
            try:
                cache[key] = (compose(config_name=config_name, overrides=list(overrides), return_hydra_config=True), None)
            except Exception as err:     # noqa: BLE001 - the message is what the test reports
                cache[key] = (None, f"{type(err).__name__}: {' '.join(str(err).split())[:300]}")
        return cache[key]

    first = fixed + [f"{k}={v[0]}" for k, v in swept.items()]
    cfg, err = attempt(first)
    if err:
        return [f"{' '.join(first)} -> {err}"]
    if multirun:
        params = OmegaConf.to_container(cfg.hydra.sweeper.params or {}) if cfg.hydra.sweeper.get("params") else {}
        for key, value in params.items():
            if key not in swept and not any(o.split("=", 1)[0].lstrip("+") == key for o in fixed):
                swept[key] = _split_top(str(value))
        for key, values in swept.items():         # the other jobs differ in one group's option: it must exist
            group = key.lstrip("+")
            if group not in GROUPS:
                continue
            for value in values[1:]:
                if not re.match(r"(glob|range|choice|interval|tag|sort|shuffle)\(", value) \
                        and not (Path(CONF_DIR) / group / f"{value}.yaml").is_file():
                    errors.append(f"{key}={value} -> no option {value!r} in conf/{group}/")
    return errors


class _Parsed(Exception):
    pass


def _is_placeholder(tok: str) -> bool:
    return PLACEHOLDER in tok or re.fullmatch(r"[A-Z]{1,3}", tok) is not None     # <dir>, DIR, N, W


def _placeholders_typed(parser: argparse.ArgumentParser, args: list[str]) -> list[str]:
    """A placeholder given to an option takes a value of the option's type (its first choice, or 1 for a number)."""
    out = []
    for i, tok in enumerate(args):
        action = parser._option_string_actions.get(args[i - 1]) if i else None
        if _is_placeholder(tok) and action is not None:
            if action.choices:
                tok = str(list(action.choices)[0])
            elif action.type in (int, float):
                tok = "1"
        out.append(tok)
    return out


def parse_with_own_parser(target: str, argv: list[str], monkeypatch) -> str | None:
    """Run an argparse command's main() until its parser has read argv; the parser's complaint, or None."""
    if target.startswith("tools/"):
        main = runpy.run_path(str(ROOT / target), run_name="dmtp_docs_check")["main"]
    else:
        main = importlib.import_module(target).main
    real_parse = argparse.ArgumentParser.parse_args
    real_known = argparse.ArgumentParser.parse_known_args
    inside = []

    def parse_args(self, args=None, namespace=None):
        args = _placeholders_typed(self, list(sys.argv[1:] if args is None else args))
        inside.append(1)
        try:
            real_parse(self, args, namespace)
        finally:
            inside.pop()
        raise _Parsed

    def parse_known_args(self, args=None, namespace=None):
        result = real_known(self, args, namespace)
        if not inside:
            raise _Parsed
        return result

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_args)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", parse_known_args)
    monkeypatch.setattr(sys, "argv", [target, *argv])
    err = StringIO()
    try:
        with redirect_stderr(err), redirect_stdout(StringIO()):
            main(argv) if inspect.signature(main).parameters else main()
    except _Parsed:
        return None
    except SystemExit as exit_:
        return None if exit_.code == 0 else (err.getvalue().strip().splitlines() or [f"exit {exit_.code}"])[-1]
    finally:
        monkeypatch.undo()
    return "main() returned without parsing its arguments"


# ------------------------------------------------------------------------------------------------ tests

COMMANDS = [c for f in documentation_files() for c in collect(f)]


def test_the_documentation_shows_commands():
    """The collector finds what the pages show (a broken collector would pass everything)."""
    where = {c.where.split(":")[0] for c in COMMANDS}
    assert {"README.md", "docs/getting-started.md", "docs/training.md", "docs/decoding.md", "docs/serving.md",
            "docs/scale.md", "docs/data-at-scale.md"} <= where
    targets = {c.target for c in COMMANDS}
    assert {"dmtp.train", "dmtp.infer", "dmtp.prepare", "dmtp.regime", "dmtp.report", "dmtp.tiny.build"} <= targets
    assert any(c.target.startswith("tools/") for c in COMMANDS)
    assert len(COMMANDS) > 100


def test_every_documented_hydra_command_composes():
    by_config, errors, cache = {}, [], {}
    for cmd in COMMANDS:
        if cmd.target.startswith("tools/"):
            continue
        try:
            name = hydra_config_name(cmd.target)
        except ModuleNotFoundError as err:
            errors.append(f"{cmd}\n    {err}")
            continue
        if name is not None:
            by_config.setdefault(name, []).append(cmd)
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        for name, cmds in by_config.items():
            for cmd in cmds:
                for argv in variants(cmd):
                    argv = ARGV_REWRITES.get(cmd.target, list)(argv)
                    try:
                        problems = compose_jobs(name, argv, cache)
                    except ValueError as err:
                        problems = [str(err)]
                    errors += [f"{cmd}\n    {p}" for p in problems]
    assert not errors, f"{len(errors)} documented command(s) do not compose:\n" + "\n".join(errors)


def test_every_documented_argparse_command_parses(monkeypatch):
    errors, seen = [], set()
    for cmd in COMMANDS:
        if not cmd.target.startswith("tools/"):
            try:
                if hydra_config_name(cmd.target) is not None:
                    continue
            except ModuleNotFoundError as err:
                errors.append(f"{cmd}\n    {err}")
                continue
        elif not (ROOT / cmd.target).is_file():
            errors.append(f"{cmd}\n    no such script")
            continue
        for argv in variants(cmd):
            if (cmd.target, tuple(argv)) in seen:
                continue
            seen.add((cmd.target, tuple(argv)))
            problem = parse_with_own_parser(cmd.target, argv, monkeypatch)
            if problem:
                errors.append(f"{cmd}\n    {' '.join(argv)} -> {problem}")
    assert not errors, f"{len(errors)} documented command(s) are refused by their parser:\n" + "\n".join(errors)
