"""Aggregate a sweep: join each job's overrides with its metrics.json into CSV, a Markdown table in
the blog's layout, and PNG plots (the command: `python -m dmtp.report <sweep_dir> [--out DIR]`; after a
multirun: the `AggregateOnMultirunEnd` Hydra callback of sweeps/*.yaml).

A job is any directory holding metrics.json (flat or nested: nested keys are joined with "/") and,
from Hydra, .hydra/overrides.yaml. Workloads are the prefixes of keys ending in "/tau".

Jobs that decoded under the evaluation protocol (decode_eval: metrics.json's "eval") also give the protocol's
tables (`protocol_tables`): per decoding mode and workload, every method with tau and its 95% interval over seeds
and prompts (dmtp.reports.intervals), AR and MTP415 rows beside them (each seed's baselines counted once), T1,
P(L>=k), tok/s vs AR here, the projected speed-up over AR where users serve (dmtp.speed: tau x AR step / the
method's round at a speed profile, batch 1 and 32; `protocol_recipes` gives each method's round, from the job's
record or its drafter's config.json), and the verdict of each drafter against the strongest baseline and the best
other drafter ("beats" only where the intervals do not overlap; "within noise" otherwise).
"""
from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import yaml

from dmtp.injection import CATALOGUE
from dmtp.reports.decode_report import is_baseline
from dmtp.reports.intervals import bootstrap_interval, format_interval, separated
from dmtp.speed.profile import DEFAULT_PROFILE
from dmtp.speed.projection import PROJECTED_BATCHES, profile_header, projections, why_lines
from dmtp.speed.recipe import round_recipe

BASELINE, SINGLE_ANCHOR = "raw_dflash", "token_only"
# The "interface" column, in the table's row order: the variants' labels from the catalogue, the
# methods without a drafter, then each variant on the DFlash2 and DSpark drafters (`<variant>+<architecture>`).
INTERFACES = {
    **{name: entry.label for name, entry in CATALOGUE.items()},
    "ar": "target only", "mtp415": "MTP x4 chained",
    **{f"{name}+dflash2": f"DFlash2 {entry.label}" for name, entry in CATALOGUE.items()},
    **{f"{name}+dspark": f"DSpark {entry.label}" for name, entry in CATALOGUE.items()},
}


# Options that make another method of the same variant and drafter (not another seed of it): the row's method gets
# "[loss=tv]", "[markov_head_type=rnn]", "[loss=dspark, label_source=target_kl, regen_temperature=1.0]" when a job ran
# them at other than the greedy recipe's (conf/recipe/greedy.yaml) and the vanilla head, the rows' common reference. Read from the job's composed config (.hydra/config.yaml), else its overrides.
METHOD_OPTIONS = {"model.loss": "ce", "drafter.markov_head_type": "vanilla", "model.label_source": "target",
                  "model.label_temperature": 1.0, "data.regen_temperature": 0.0}


def _job_options(job: Path) -> dict:
    """METHOD_OPTIONS' values of a job: its composed config where it has one, else what its overrides set."""
    config = job / ".hydra" / "config.yaml"
    if config.exists():
        cfg = yaml.safe_load(config.read_text()) or {}
        out = {}
        for key in METHOD_OPTIONS:
            node = cfg
            for part in key.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            if node is not None:
                out[key] = node
        return out
    overrides = job / ".hydra" / "overrides.yaml"
    items = yaml.safe_load(overrides.read_text()) or [] if overrides.exists() else []
    return {k: v for k, _, v in (i.lstrip("+~").partition("=") for i in items) if k in METHOD_OPTIONS}


def _differs(value, default) -> bool:
    if isinstance(default, float):
        try:
            return float(value) != default
        except (TypeError, ValueError):
            return True
    return str(value) != str(default)


def _interface(method: str) -> str:
    return INTERFACES.get(method.split(" [")[0], "")


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "/"))
        elif isinstance(v, (int, float, str, bool)) or v is None:
            out[key] = v
    return out


def collect(sweep_dir: str | Path) -> list[dict]:
    rows = []
    for metrics in sorted(Path(sweep_dir).rglob("metrics.json")):
        job = metrics.parent
        row = {"job": str(job.relative_to(sweep_dir)) or "."}
        overrides = job / ".hydra" / "overrides.yaml"
        if overrides.exists():
            for item in yaml.safe_load(overrides.read_text()) or []:
                key, _, value = item.lstrip("+~").partition("=")
                row[key] = value
        record = json.loads(metrics.read_text())
        evaluation = record.pop("eval", None) if isinstance(record, dict) else None
        row.update(_flatten(record))
        if evaluation is not None:
            row[EVAL_KEY] = evaluation     # nested, for the protocol tables; not a CSV column
        if (job / "drafter" / "config.json").is_file():
            row[DRAFTER_KEY] = str(job / "drafter")
        row.setdefault("method", row.get("injection", "?"))
        changed = [f"{key.split('.')[-1]}={value}" for key, value in _job_options(job).items()
                   if _differs(value, METHOD_OPTIONS[key])]
        if changed:
            row["method"] += f" [{', '.join(changed)}]"
        rows.append(row)
    return rows


EVAL_KEY = "_eval"
DRAFTER_KEY = "_drafter_dir"   # the job's exported drafter (its config.json gives the round a record lacks)


def write_csv(rows: list[dict], path: Path) -> None:
    columns = sorted({k for r in rows for k in r if k not in (EVAL_KEY, DRAFTER_KEY)},
                     key=lambda k: (k not in ("job", "method", "injection", "seed"), k))
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def workloads(rows: list[dict]) -> list[str]:
    """The workloads with a tau.

    Where jobs decoded their held-out prompts, those; the validation walk's domains (`walk/<domain>`, other prompts:
    the validation split's) only where nothing was decoded, so that no table puts figures measured on different
    prompts side by side."""
    found = {k[: -len("/tau")] for r in rows for k in r if k.endswith("/tau") and isinstance(r[k], (int, float))}
    decoded = {w for w in found if not w.startswith("walk/")}
    return sorted(decoded or found)


def summarise(rows: list[dict], key: str) -> dict[str, tuple[float, float, int]]:
    """method -> (mean, stdev over seeds, n) of one metric."""
    by_method: dict[str, list[float]] = {}
    for r in rows:
        if isinstance(r.get(key), (int, float)):
            by_method.setdefault(r["method"], []).append(float(r[key]))
    return {m: (statistics.fmean(v), statistics.stdev(v) if len(v) > 1 else 0.0, len(v)) for m, v in by_method.items()}


def _cell(stats: tuple[float, float, int] | None, fmt: str = "{:.3f}") -> str:
    if stats is None:
        return ""
    mean, sd, n = stats
    return fmt.format(mean) + (" ± " + fmt.format(sd) if n > 1 else "")


def markdown_table(rows: list[dict]) -> str:
    loads = workloads(rows)
    taus = {w: summarise(rows, f"{w}/tau") for w in loads}
    order = list(INTERFACES)
    methods = sorted({m for t in taus.values() for m in t},
                     key=lambda m: (order.index(m.split(" [")[0]) if m.split(" [")[0] in order else 99, m))
    head = ["variant", "interface"] + [f"tau {w}" for w in loads] + ["vs token-only", "vs raw DFlash"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in methods:
        cells = [m, _interface(m)]
        for w in loads:
            cells.append(_cell(taus[w].get(m, (float("nan"), 0.0, 0))))
        for ref in (SINGLE_ANCHOR, BASELINE):
            changes = [taus[w][m][0] / taus[w][ref][0] - 1 for w in loads if m in taus[w] and ref in taus[w]]
            cells.append(f"{100 * statistics.fmean(changes):+.2f}%" if changes and m != ref else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def detail_table(rows: list[dict]) -> str:
    """Per workload and method: tau, T1 acceptance, speed-up vs AR and P(L>=k), mean ± stdev over jobs."""
    lines = []
    for w in workloads(rows):
        ks = sorted({int(k.rsplit("_", 1)[1]) for r in rows for k in r if k.startswith(f"{w}/p_len_ge_")})
        if not ks:
            continue
        cols = {"tau": f"{w}/tau", "T1 accept": f"{w}/t1_accept", "tok/s vs AR": f"{w}/speedup_vs_ar",
                **{f"P(L>={k})": f"{w}/p_len_ge_{k}" for k in ks}}
        stats = {name: summarise(rows, key) for name, key in cols.items()}
        methods = sorted({m for s in stats.values() for m in s})
        lines += [f"\n**{w}**\n", "| variant | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
        for m in methods:
            cells = [_cell(stats[name].get(m), "{:.2f}" if name.startswith("P(") else "{:.3f}") for name in cols]
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n" if lines else ""


def protocol_samples(rows: list[dict]) -> dict:
    """{mode: {workload: {method: {seed: stats}}}} from the jobs' "eval" records: each job's drafter under its
    method's name, the baselines (AR, MTP415) under their own, once per seed (every job of a seed decoded the same
    baselines on the same prompts)."""
    out: dict = {}
    for r in rows:
        evaluation = r.get(EVAL_KEY)
        if not evaluation:
            continue
        seed = str(r.get("seed", 0))
        for mode, per_workload in evaluation.get("modes", {}).items():
            for wl, per_method in per_workload.items():
                for name, stats in per_method.items():
                    method = r["method"] if name == "drafter" else name
                    out.setdefault(mode, {}).setdefault(wl, {}).setdefault(method, {}).setdefault(seed, stats)
    return out


def protocol_recipes(rows: list[dict]) -> dict:
    """{mode: {method: round recipe (dmtp.speed.recipe, a dict)}} for the methods of `protocol_samples`.

    A job's drafter from its record's "speed" section, else from its exported drafter's config.json; the baselines
    (ar, mtp415, mtp:<k>) from their names. A method with no recipe (a drafter neither gives) has no entry. For a
    study script: `projected_speedup(protocol_recipes(rows)[mode][method], tau, profile, batch)` (dmtp.speed)."""
    out: dict = {}
    for r in rows:
        evaluation = r.get(EVAL_KEY)
        if not evaluation:
            continue
        speed = evaluation.get("speed") or {}
        for mode, per_workload in evaluation.get("modes", {}).items():
            recipes = out.setdefault(mode, {})
            for name in {m for per in per_workload.values() for m in per}:
                method = r["method"] if name == "drafter" else name
                if method in recipes:
                    continue
                recipe = (speed.get("recipes") or {}).get(mode, {}).get(name)
                if recipe is None:
                    try:
                        if name == "drafter" and r.get(DRAFTER_KEY):
                            recipe = round_recipe("drafter", r[DRAFTER_KEY], sampled=mode != "greedy").as_dict()
                        elif name != "drafter":
                            recipe = round_recipe(name).as_dict()
                    except (ValueError, OSError, KeyError):
                        recipe = None
                if recipe is not None:
                    recipes[method] = recipe
    return out


def _speed_profile(rows: list[dict], given: str | None) -> str | None:
    """The profile the protocol tables project to: `given`, else the first record's, else the shipped default."""
    if given:
        return given
    for r in rows:
        speed = (r.get(EVAL_KEY) or {}).get("speed") or {}
        if "profile" in speed:
            return speed["profile"]
    return DEFAULT_PROFILE


def _seeds_mean(per_seed: dict, key: str):
    values = [s[key] for s in per_seed.values() if isinstance(s.get(key), (int, float))]
    return statistics.fmean(values) if values else None


def _p_len(per_seed: dict, k: int):
    values = [s["p_len_ge"][k - 1] for s in per_seed.values()
              if len(s.get("p_len_ge") or []) >= k and s["p_len_ge"][k - 1] is not None]
    return statistics.fmean(values) if values else None


def _order(method: str) -> tuple:
    base = method.split(" [")[0]
    return (0 if method == "ar" else 1 if is_baseline(method) else 2, list(INTERFACES).index(base)
            if base in INTERFACES else 99, method)


def protocol_tables(rows: list[dict], speed_profile: str | None = None) -> str:
    """The protocol's tables (see the module docstring); empty when no job decoded under it. `speed_profile`: the
    projected columns' profile (None: the records', else the shipped default)."""
    samples = protocol_samples(rows)
    if not samples:
        return ""
    profile = _speed_profile(rows, speed_profile)
    recipes = protocol_recipes(rows) if profile else {}
    lines = [] if not profile else ["", profile_header(profile)]
    unpriced: list = []
    for mode, per_workload in samples.items():
        lines.append(f"\n### {mode}\n")
        for wl, per_method in per_workload.items():
            ks = sorted({k for m in per_method.values() for s in m.values() for k in range(1, len(s.get("p_len_ge") or []) + 1)})
            shown = [k for k in (2, 4, 7) if k in ks]
            taus = {m: _seeds_mean(ps, "tau_verify") for m, ps in per_method.items()}
            found = projections(recipes.get(mode, {}), taus, profile) if profile else {}
            unpriced += [p for ps in found.values() for p in ps.values()]
            projected = [f"x b{b}" for b in PROJECTED_BATCHES] if profile else []
            head = ["method", "seeds", "tau [95% CI]", "T1", *(f"P(L>={k})" for k in shown), "tok/s vs AR", *projected]
            lines += [f"**{wl}**\n", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            cis = {}
            for method in sorted(per_method, key=_order):
                per_seed = per_method[method]
                groups = [s.get("tau_requests") or [] for s in per_seed.values()]
                ci = bootstrap_interval(groups)
                cis[method] = (_seeds_mean(per_seed, "tau"), ci)
                t1 = _seeds_mean(per_seed, "t1_accept")
                speed = _seeds_mean(per_seed, "speedup_vs_ar")
                cells = [method, str(len(per_seed)), f"{cis[method][0]:.3f} {format_interval(ci)}",
                         "" if t1 is None else f"{t1:.3f}",
                         *("" if _p_len(per_seed, k) is None else f"{_p_len(per_seed, k):.2f}" for k in shown),
                         "" if speed is None else f"{speed:.2f}",
                         *((found[method][b].cell() if b in found.get(method, {})
                            else "-" if method in recipes.get(mode, {}) else "no recipe")
                           for b in (PROJECTED_BATCHES if profile else ()))]
                lines.append("| " + " | ".join(cells) + " |")
            lines += ["", *verdicts(cis), ""]
    notes = why_lines(unpriced)
    if notes:
        lines += ["Projections the profile cannot price:", *(f"- {n}" for n in notes), ""]
    return "\n".join(lines)


def verdicts(cis: dict) -> list[str]:
    """Each drafter against the strongest baseline (an MTP chain, else AR) and the best other drafter: "beats" where the
    95% intervals do not overlap, "within noise" where they do."""
    drafters = [m for m in cis if not is_baseline(m)]
    baselines = [m for m in cis if is_baseline(m) and cis[m][0] is not None]
    out = []
    for m in drafters:
        tau, ci = cis[m]
        rivals = []
        if baselines:
            rivals.append(max(baselines, key=lambda b: cis[b][0]))
        others = [o for o in drafters if o != m]
        if others:
            rivals.append(max(others, key=lambda o: cis[o][0]))
        for rival in rivals:
            r_tau, r_ci = cis[rival]
            change = 100 * (tau / r_tau - 1)
            word = ("beats" if tau > r_tau else "loses to") if separated(ci, r_ci) else "within noise of"
            out.append(f"- {m} {word} {rival} ({change:+.1f}%)")
    return out


def plots(rows: list[dict], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    loads = workloads(rows)
    methods = sorted({r["method"] for r in rows})
    for metric, name in (("tau", "acceptance_length"), ("t1_accept", "t1_acceptance")):
        fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(methods) * max(1, len(loads)) / 2), 4))
        width = 0.8 / max(1, len(methods))
        for i, m in enumerate(methods):
            vals = [summarise(rows, f"{w}/{metric}").get(m, (float("nan"), 0, 0)) for w in loads]
            ax.bar([j + i * width for j in range(len(loads))], [v[0] for v in vals], width,
                   yerr=[v[1] for v in vals], label=m)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(loads))], loads)
        ax.set_ylabel(metric)
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        made.append(out / f"{name}.png")
        fig.savefig(made[-1], dpi=120)
        plt.close(fig)
    for w in loads:
        fig, ax = plt.subplots(figsize=(6, 4))
        for m in methods:
            ks = sorted(int(k.rsplit("_", 1)[1]) for r in rows for k in r if k.startswith(f"{w}/p_len_ge_"))
            ks = sorted(set(ks))
            if ks:
                ax.plot(ks, [summarise(rows, f"{w}/p_len_ge_{k}").get(m, (float('nan'),))[0] for k in ks], "o-", label=m)
        ax.set_xlabel("k")
        ax.set_ylabel("P(L >= k)")
        ax.set_title(w)
        ax.legend(fontsize=7)
        fig.tight_layout()
        made.append(out / f"p_len_ge_{w.replace('/', '_')}.png")
        fig.savefig(made[-1], dpi=120)
        plt.close(fig)
    batch_keys = sorted({k for r in rows for k in r if k.startswith("throughput/bs")})
    if batch_keys:
        fig, ax = plt.subplots(figsize=(6, 4))
        sizes = sorted({int(k.split("bs")[1].split("/")[0]) for k in batch_keys})
        for m in methods:
            ax.plot(sizes, [summarise(rows, f"throughput/bs{b}/tok_s").get(m, (float("nan"),))[0] for b in sizes], "o-", label=m)
        ax.set_xlabel("batch size")
        ax.set_ylabel("tokens / s")
        ax.legend(fontsize=7)
        fig.tight_layout()
        made.append(out / "throughput_vs_batch.png")
        fig.savefig(made[-1], dpi=120)
        plt.close(fig)
    return made


def aggregate(sweep_dir: str | Path, out: str | Path | None = None, speed_profile: str | None = None) -> Path:
    sweep_dir = Path(sweep_dir)
    out = Path(out) if out else sweep_dir / "report"
    rows = collect(sweep_dir)
    if not rows:
        raise FileNotFoundError(f"no metrics.json under {sweep_dir}")
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / "results.csv")
    protocol = protocol_tables(rows, speed_profile)
    if protocol:
        protocol = ("\n## Evaluation protocol: tau [95% interval over seeds and prompts], baselines beside every "
                    "drafter\n" + protocol + "\n")
    (out / "results.md").write_text(markdown_table(rows) + detail_table(rows) + protocol)
    plots(rows, out)
    return out


class AggregateOnMultirunEnd:
    """Hydra callback (hydra.callbacks) that aggregates the sweep when the multirun ends."""

    def on_multirun_end(self, config, **kwargs) -> None:
        try:
            path = aggregate(config.hydra.sweep.dir)
            print(f"[dmtp] sweep report: {path}/results.md")
        except FileNotFoundError as e:
            print(f"[dmtp] no sweep report: {e}")

    def __getattr__(self, name):  # the other Hydra callback hooks are no-ops
        if name.startswith("on_"):
            return lambda *a, **k: None
        raise AttributeError(name)
