"""The projected speed-up of a method at a speed profile: tau x AR step / round, the round priced from the
method's own stages (`dmtp.speed.recipe`) and the profile's measured (or derived, labelled) stage costs.

    speed-up = tau x ms(verify/r1) / sum over the round's stages of (times run x ms)

tau is the mean tokens a round commits (per verify: 1 + accepted drafts, the correction or bonus included), so
tau / round ms is tokens per ms, and AR's is 1 / ms(verify/r1). A profile lacking a stage the round needs gives no
figure but one line naming every stage it lacks (`Projection.why`), never a silent zero.

    from dmtp.speed import projected_speedup
    projected_speedup("mtp:7", tau=5.02, batch=1).speedup                     # the shipped 8B/H200 profile
    projected_speedup("drafter", 4.4, drafter="outputs/.../drafter", batch=32)  # Projection(..., missing=(...))
    projected_speedup({"method": "drafter", "drafter": "<dir>", "draft_vocab": 16384}, 4.3)
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from dmtp.speed.profile import DEFAULT_PROFILE, SpeedProfile, load_profile
from dmtp.speed.recipe import RoundRecipe, round_recipe

PROJECTED_BATCHES = (1, 32)   # the batches every table projects to
AR_STAGE = "verify/r1"


@dataclass(frozen=True)
class Projection:
    method: str
    profile: str            # the profile's label (name and batch)
    batch: int
    tau: float | None
    speedup: float | None   # None: the profile lacks a stage (`missing`) or there is no tau
    round_ms: float | None
    ar_ms: float | None
    missing: tuple[str, ...] = ()
    derived: tuple[str, ...] = ()   # the derived (not measured) stages the figure used

    @property
    def ok(self) -> bool:
        return self.speedup is not None

    def cell(self) -> str:
        return "-" if self.speedup is None else f"{self.speedup:.2f}x"

    def why(self) -> str | None:
        """One line naming the stages the profile lacks (None when the figure exists)."""
        if self.missing:
            return f"{self.method}: no projection at {self.profile}: the profile lacks {', '.join(self.missing)}"
        if self.tau is None and self.round_ms is not None:
            return f"{self.method}: no projection at {self.profile}: no tau"
        return None


def price(recipe: RoundRecipe, profile: SpeedProfile) -> tuple[float | None, tuple[str, ...], tuple[str, ...]]:
    """-> (the round's ms, or None; the stages the profile lacks; the derived stages used)."""
    total, missing, derived = 0.0, [], []
    for key, times in recipe.stages():
        cost = profile.get(key)
        if cost is None:
            missing.append(key)
            continue
        total += times * cost.ms
        if cost.derived and key not in derived:
            derived.append(key)
    return (None if missing else total), tuple(missing), tuple(derived)


def project(recipe: RoundRecipe, tau: float | None, profile: SpeedProfile) -> Projection:
    """`recipe`'s projected speed-up over AR at `profile` for a measured `tau`."""
    ms, missing, derived = price(recipe, profile)
    ar = profile.get(AR_STAGE)
    if ar is None and AR_STAGE not in missing:
        missing = (AR_STAGE, *missing)
    ok = ms is not None and ar is not None and tau is not None and ms > 0
    if ar is not None and ar.derived and AR_STAGE not in derived:
        derived = (AR_STAGE, *derived)
    return Projection(recipe.method, profile.label, profile.batch, tau,
                      tau * ar.ms / ms if ok else None, ms, ar.ms if ar is not None else None, missing, derived)


def recipe_of(method, drafter=None, draft_vocab: int | None = None, mtp_steps: int = 4,
              sampled: bool = False) -> RoundRecipe:
    """A method as a round: a `RoundRecipe`, a recipe's dict, a record {"method", "drafter", "draft_vocab",
    "recipe"} (a study script's), or a name with its drafter."""
    if isinstance(method, RoundRecipe):
        return method
    if isinstance(method, Mapping):
        if "recipe" in method and method["recipe"]:
            return RoundRecipe.from_dict(method["recipe"])
        if "verify_rows" in method:
            return RoundRecipe.from_dict(method)
        return round_recipe(str(method.get("method", "drafter")), method.get("drafter", drafter),
                            method.get("draft_vocab", draft_vocab), int(method.get("mtp_steps", mtp_steps)),
                            bool(method.get("sampled", sampled)))
    return round_recipe(str(method), drafter, draft_vocab, mtp_steps, sampled)


def projected_speedup(method, tau: float | None, profile: str | SpeedProfile = DEFAULT_PROFILE, batch: int = 1, *,
                      drafter=None, draft_vocab: int | None = None, mtp_steps: int = 4,
                      sampled: bool = False) -> Projection:
    """The projected speed-up over AR of `method` (a name: ar | mtp415 | mtp:<k> | drafter with `drafter` = a
    BlockDrafter, its directory or its config.json as a dict; or a record / recipe, see `recipe_of`) at `tau`,
    priced at `profile` (a shipped name, a directory or a file) for `batch`."""
    prof = load_profile(profile, batch)
    return project(recipe_of(method, drafter, draft_vocab, mtp_steps, sampled), tau, prof)


def profile_header(profile: str, batches: Iterable[int] = PROJECTED_BATCHES) -> str:
    """The line a table prints above its projected columns: what they are and where the costs came from."""
    parts, sources = [], []
    for b in batches:
        try:
            p = load_profile(profile, b)
        except (FileNotFoundError, ValueError) as e:
            parts.append(f"b{b}: {e}")
            continue
        measured = sum(not c.derived for c in p.stages.values())
        where = p.provenance.get("source") or p.provenance.get("command") or ""
        if where and where not in sources:
            sources.append(where)
        parts.append(f"b{b}: {p.device or '?'} {p.dtype or ''}, {measured} stages measured, "
                     f"{len(p.stages) - measured} derived")
    return (f"projected speed-up x b<batch> = tau (per verify) x AR step / the method's round, priced from its stages "
            f"at speed profile {profile}: " + "; ".join(parts) + "".join(f"; from {w}" for w in sources))


def projections(recipes: Mapping[str, dict | RoundRecipe], taus: Mapping[str, float | None], profile: str,
                batches: Iterable[int] = PROJECTED_BATCHES) -> dict[str, dict[int, Projection]]:
    """{method: {batch: Projection}} for every method with a recipe (no recipe: no entry), each named as the table
    names it (the keys of `recipes`)."""
    out: dict[str, dict[int, Projection]] = {}
    for b in batches:
        try:
            prof = load_profile(profile, b)
        except (FileNotFoundError, ValueError):
            continue
        for method, recipe in recipes.items():
            if recipe is None:
                continue
            r = recipe if isinstance(recipe, RoundRecipe) else RoundRecipe.from_dict(recipe)
            out.setdefault(method, {})[b] = replace(project(r, taus.get(method), prof), method=method)
    return out


def why_lines(found: Iterable[Projection]) -> list[str]:
    """One line per (method, batch) without a figure, each once, in order."""
    lines: list[str] = []
    for p in found:
        line = p.why()
        if line and line not in lines:
            lines.append(line)
    return lines


__all__ = ["AR_STAGE", "PROJECTED_BATCHES", "Projection", "price", "profile_header", "project", "projected_speedup",
           "projections", "recipe_of", "why_lines"]
