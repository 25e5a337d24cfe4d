"""Decode a prompt set with every method through the one loop: `python -m dmtp.infer` (Hydra; conf/infer.yaml).

With no arguments: the embedded tiny target, the newest drafter trained in this directory
(`outputs/**/drafter` or `logs/**/drafter`), the embedded held-out prompts of each domain, methods
ar / mtp415 / drafter. Prints a table and writes `metrics.json` to the run directory.

    python -m dmtp.infer drafter=outputs/train/runs/<run>/drafter batch_size=8 max_new_tokens=128
    (drafter=<dir> is short for drafter.path=<dir>)
    python -m dmtp.infer methods=[ar,drafter] temperature=0.7 top_p=0.9
    python -m dmtp.infer target.path=/models/Qwen3-8B drafter=/models/dflash eval.name=gsm8k eval.path=/data/gsm8k
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import hydra
import torch

from dmtp.cli import one_line_errors
from dmtp.decode.loop import SamplingConfig, SpecDecoder, build_proposer
from dmtp.decode.metrics import format_table

TRUNCATE_MODES = (None, "left")   # eval.truncate
NO_DRAFTER_MESSAGE = ("[dmtp] no trained drafter found under ./outputs or ./logs; train one first: "
                      "python -m dmtp.train injection=dual_anchor_zero_init  (or pass drafter=<dir>)")


# ---------------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------------

def resolve_device(name: str) -> torch.device:
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if name not in table:
        raise ValueError(f"unknown dtype {name!r}; choose from {', '.join(table)}")
    return table[name]


def _drafter_target(drafter_dir: Path | None) -> str | None:
    """The target a dmtp-trained drafter records in its config (if that checkpoint still exists)."""
    if drafter_dir is None or not (Path(drafter_dir) / "config.json").exists():
        return None
    from dmtp.models.drafter import read_drafter_config

    path = read_drafter_config(drafter_dir).get("dmtp", {}).get("target")
    return path if path and Path(path).is_dir() else None


def find_latest_drafter(roots=("outputs", "logs"), base: str | Path | None = None) -> Path | None:
    """The newest `<root>/**/drafter/config.json` (by modification time) under the working directory."""
    base = Path(base or Path.cwd())
    found = []
    for root in roots:
        r = base / root
        if r.is_dir():
            found.extend(p for p in r.glob("**/drafter/config.json") if (p.parent / "model.safetensors").exists())
    if not found:
        return None
    return max(found, key=lambda p: p.stat().st_mtime).parent


def embedded_prompts(tokenizer, domains, num_prompts: int, prompt_tokens: int) -> dict[str, list[list[int]]]:
    """Held-out prompts: `num_prompts` prompts of `prompt_tokens` tokens per domain from the test split,
    spread over it (dmtp.data.prompts)."""
    from dmtp.data.prompts import held_out_prompts

    return {domain: held_out_prompts(tokenizer, domain, "test", num_prompts, prompt_tokens) for domain in domains}


def eval_set_prompts(tokenizer, name: str, path: str, num_prompts: int) -> tuple[list, dict[str, list[list[int]]]]:
    from dmtp.data.evalsets import build_turn_prompts, load_eval_set

    if not path:
        raise ValueError(f"eval.name={name} needs eval.path (a local file or directory)")
    requests = load_eval_set(name, path, limit=num_prompts)
    return requests, {name: [build_turn_prompts(tokenizer, r, [], use_raw_prompt=True) for r in requests]}


def decode_options(cfg) -> SamplingConfig:
    """Check the decoding options before anything is loaded (one line naming the option); -> sampling."""
    for key in ("batch_size", "max_new_tokens", "num_prompts"):
        value = cfg[key]
        if key == "num_prompts" and value is None:
            continue   # a named eval set: all of it
        if type(value) is not int or value < 1:
            raise ValueError(f"{key} must be an integer >= 1, got {value}")
    if cfg.eval.get("truncate") not in TRUNCATE_MODES:
        raise ValueError(f"eval.truncate must be null (refuse a prompt the target cannot take) or left, "
                         f"got {cfg.eval.truncate!r}")
    return SamplingConfig(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, verification=cfg.verification)


def prompt_limit(target, max_new_tokens: int, block: int) -> tuple[int | None, str]:
    """The longest prompt the target can take: its position limit minus the new tokens and one verify
    block (a round may run up to a block past the budget). -> (limit or None if unknown, explanation)."""
    positions = getattr(target.config, "max_position_embeddings", None)
    if not positions:
        return None, ""
    why = f"{positions} positions (max_position_embeddings) - max_new_tokens {max_new_tokens} - a verify block of {block}"
    if positions - max_new_tokens - block < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} leaves no room for a prompt on {target.path}: {why}")
    return positions - max_new_tokens - block, why


def fit_prompts(workloads: dict[str, list[list[int]]], limit: int | None, why: str,
                truncate: str | None) -> dict[str, list[list[int]]]:
    """Refuse a prompt longer than `limit`, naming it, or (eval.truncate=left) keep its last `limit` tokens."""
    if limit is None:
        return workloads
    fitted, cut = {}, 0
    for name, prompts in workloads.items():
        for i, prompt in enumerate(prompts):
            if len(prompt) > limit and truncate != "left":
                raise ValueError(f"prompt {i} of {name} has {len(prompt)} tokens; the target takes at most {limit} "
                                 f"({why}); shorten it, or pass eval.truncate=left to keep its last {limit} tokens")
        fitted[name] = [p[-limit:] for p in prompts]
        cut += sum(len(p) > limit for p in prompts)
    if cut:
        print(f"[dmtp] eval.truncate=left: kept the last {limit} tokens of {cut} prompt(s)")
    return fitted


# ---------------------------------------------------------------------------------------------------
# methods
# ---------------------------------------------------------------------------------------------------

def named_methods(cfg, overrides: list[str] | None = None) -> set[str]:
    """The methods the user asked for by name: they must run or fail, never be skipped. With the command
    line's `overrides`: every method of a `methods=` given there; from Python: a methods list other than
    conf/infer.yaml's. `drafter=<dir>` always names the drafter."""
    if overrides is None:
        from omegaconf import OmegaConf

        from dmtp.configs import CONF_DIR

        defaults = list(OmegaConf.load(Path(CONF_DIR) / "infer.yaml").methods)
        named = set(cfg.methods) if list(cfg.methods) != defaults else set()
    else:
        named = set(cfg.methods) if any(o.split("=", 1)[0].lstrip("+~") == "methods" for o in overrides) else set()
    if cfg.drafter.path:
        named.add("drafter")
    return named


def load_drafter_for(target, path, dtype, device, injection: str | None = None, options: dict | None = None):
    """-> (drafter, injection, label). `options`: the injection's decoding-time options (e.g.
    multi_mtp_zero_init's num_mtp_tokens / mtp_threshold), named in the label: `variant[k=v,...]`."""
    from dmtp.injection.io import check_drafter_fits, load_dmtp_drafter, variant_name

    options = dict(options or {})
    drafter, inj, meta = load_dmtp_drafter(path, dtype=dtype, injection=injection, options=options)
    check_drafter_fits(drafter.config, target, f"drafter {path}")
    label = variant_name(inj) + ("[" + ",".join(f"{k}={v}" for k, v in options.items()) + "]" if options else "")
    return drafter.to(device).eval(), inj.to(device).eval(), label


def mtp_for_drafter(target, target_path, drafter_dir, native_mtp):
    """The MTP a drafter decodes with: its own jointly trained one (mtp.safetensors in its directory,
    one line saying so) or the target's native MTP."""
    from dmtp.injection.io import tuned_mtp_path
    from dmtp.models.mtp_loading import load_native_mtp

    tuned = tuned_mtp_path(drafter_dir) if drafter_dir is not None else None
    if tuned is None:
        return native_mtp
    print(f"[dmtp] drafter {drafter_dir} decodes with its jointly trained MTP ({tuned}); other methods use "
          "the target's own")
    p = native_mtp.fc.weight
    return load_native_mtp(target_path, target.embed_tokens, target.lm_head, dtype=p.dtype, device=p.device,
                           tuned=tuned)


def method_needs_mtp(method: str, injection=None) -> bool:
    if method.startswith("mtp"):
        return True
    return method == "drafter" and injection is not None and (injection.uses_mtp or injection.needs_mtp_context)


def decode_workloads(decoders: dict[str, SpecDecoder], workloads: dict[str, list[list[int]]], *, max_new_tokens: int,
                     sampling: SamplingConfig, batch_size: int, seed: int = 0, warmup: bool = True,
                     progress: bool = False, previous: dict | None = None) -> dict:
    """Run every decoder on every workload. Returns {"workloads": {wl: {method: summary}},
    "overall": {method: summary}, "results": {(wl, method): DecodeResult}}. With `previous` (an earlier
    return value), the new workloads are added to it and "overall" covers all of them."""
    per_wl: dict[str, dict] = dict(previous["workloads"]) if previous else {}
    results = dict(previous["results"]) if previous else {}
    for name, dec in decoders.items():
        if warmup and previous is None:
            first = next(iter(workloads.values()))
            graphs = dec.fixed_shapes   # graphs / compiled stages: warm up (capture, compile) at the measured shapes
            dec.generate(first[:batch_size], max_new_tokens=max_new_tokens if graphs else min(8, max_new_tokens),
                         sampling=sampling, batch_size=batch_size, seed=seed)
        for wl, prompts in workloads.items():
            res = dec.generate(prompts, max_new_tokens=max_new_tokens, sampling=sampling, batch_size=batch_size,
                               seed=seed, progress=progress)
            results[(wl, name)] = res
            per_wl.setdefault(wl, {})[name] = res.summary()
    overall = {name: _merge([results[(wl, name)] for wl in per_wl]) for name in decoders}
    return {"workloads": per_wl, "overall": overall, "results": results}


def _merge(results) -> dict:
    """One summary over several workloads' results (acceptance pooled over requests, times summed)."""
    from dmtp.decode.loop import DecodeResult

    first = results[0]
    stage_tot: dict[str, float] = {}
    rounds = 0
    for r in results:
        for k, v in r.stage_ms.items():
            stage_tot[k] = stage_tot.get(k, 0.0) + v * r.counted_rounds
        rounds += r.counted_rounds
    merged = DecodeResult(first.method, first.num_candidates, [t for r in results for t in r.tokens],
                          [a for r in results for a in r.accepted], [a for r in results for a in r.accepted_raw],
                          [p for r in results for p in r.prompt_lengths], sum(r.wall_s for r in results),
                          sum(r.prefill_s for r in results), [t for r in results for t in r.ttft_s],
                          {k: v / rounds for k, v in stage_tot.items()} if rounds else {}, rounds,
                          sum(r.batches for r in results), first.sampling, dict(first.extra))
    return merged.summary()


def add_comparisons(metrics: dict, baseline: str = "ar", greedy: bool = True) -> None:
    """Speedups against the AR baseline and (greedy) whether every method reproduced its output."""
    results = metrics["results"]
    workloads = list(metrics["workloads"])
    for scope in [*(("wl", wl) for wl in workloads), ("overall", None)]:
        table = metrics["workloads"][scope[1]] if scope[0] == "wl" else metrics["overall"]
        base = table.get(baseline)
        for name, s in table.items():
            if base and base.get("tokens_per_s"):
                s["speedup_vs_ar"] = s["tokens_per_s"] / base["tokens_per_s"]
            if greedy and baseline in {m for (_, m) in results}:
                wls = workloads if scope[0] == "overall" else [scope[1]]
                same = total = 0
                for wl in wls:
                    ref = results[(wl, baseline)].tokens
                    mine = results[(wl, name)].tokens
                    same += sum(a == b for a, b in zip(ref, mine))
                    total += len(ref)
                s["matches_ar"] = same / total if total else None


TABLE_COLUMNS = ["workload", "method", "tau", "tau_verify", "t1_accept", "tok/s", "speedup", "ttft_ms",
                 "ms/round", "matches_ar"]


def table_rows(metrics: dict) -> list[dict]:
    rows = []
    scopes = [(wl, t) for wl, t in metrics["workloads"].items()]
    if len(scopes) > 1:
        scopes.append(("all", metrics["overall"]))
    for wl, table in scopes:
        for name, s in table.items():
            rows.append({"workload": wl, "method": name, "tau": s["tau_per_request"], "tau_verify": s["tau_per_verify"],
                         "t1_accept": s["t1_accept"], "tok/s": s["tokens_per_s"], "speedup": s.get("speedup_vs_ar"),
                         "ttft_ms": s["ttft_ms"], "ms/round": s["stage_ms_per_round"].get("round"),
                         "matches_ar": s.get("matches_ar")})
    return rows


def stage_table(metrics: dict) -> str:
    stages = ["mtp", "t1_fusion", "drafter", "verify", "round"]
    rows = [{"method": name, **{k: s["stage_ms_per_round"].get(k) for k in stages}}
            for name, s in metrics["overall"].items()]
    return format_table(rows, ["method", *stages], float_digits=3, title="per-stage ms per round (after warm-up rounds)")


def report(metrics: dict) -> str:
    parts = [format_table(table_rows(metrics), TABLE_COLUMNS, title="acceptance length (tau) and throughput"),
             "", stage_table(metrics)]
    for name, s in metrics["overall"].items():
        if s.get("p_len_ge"):
            parts.append(f"{name}: P(L>=k) k=1..{len(s['p_len_ge'])} = "
                         + ", ".join("-" if v is None else f"{v:.3f}" for v in s["p_len_ge"]))
    return "\n".join(parts)


def jsonable(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k != "results"}


# ---------------------------------------------------------------------------------------------------
# the command
# ---------------------------------------------------------------------------------------------------

def run(cfg, named: set[str] | None = None) -> dict:
    """Decode and report. `named`: the methods asked for by name (default: `named_methods(cfg)`)."""
    from dmtp.models.mtp_loading import MTPLoadError, load_native_mtp
    from dmtp.models.target import TargetModel, load_tokenizer

    sampling = decode_options(cfg)
    named = named_methods(cfg) if named is None else named
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    methods = list(cfg.methods)
    drafter_dir = None
    if "drafter" in methods:
        drafter_dir = Path(cfg.drafter.path) if cfg.drafter.path else find_latest_drafter()
        if drafter_dir is None:
            print(NO_DRAFTER_MESSAGE)
            sys.exit(1)

    trained_on = _drafter_target(drafter_dir)
    if cfg.target.path:
        target_path = cfg.target.path
    elif trained_on:
        target_path = trained_on   # the target the drafter was trained against
    else:
        from dmtp.tiny.build import ensure_tiny_target

        target_path = str(ensure_tiny_target(cfg.target.preset, progress=True))
    target = TargetModel.from_pretrained(target_path, dtype=dtype, device=device,
                                         trust_remote_code=cfg.target.get("trust_remote_code", False))
    tokenizer = load_tokenizer(target_path, trust_remote_code=cfg.target.get("trust_remote_code", False))

    drafter = injection = variant = None
    if drafter_dir is not None:
        from omegaconf import OmegaConf

        options = cfg.drafter.get("injection_options")
        options = OmegaConf.to_container(options, resolve=True) if OmegaConf.is_config(options) else dict(options or {})
        drafter, injection, variant = load_drafter_for(target, drafter_dir, dtype, device, cfg.drafter.get("injection"),
                                                       options=options)
    mtp = drafter_mtp = None
    if any(method_needs_mtp(m, injection) for m in methods):
        try:
            mtp = load_native_mtp(target_path, target.embed_tokens, target.lm_head)
            drafter_mtp = mtp
            if method_needs_mtp("drafter", injection):   # its own jointly trained MTP, if it has one
                drafter_mtp = mtp_for_drafter(target, target_path, drafter_dir, mtp)
        except (MTPLoadError, FileNotFoundError) as e:
            dropped = [m for m in methods if method_needs_mtp(m, injection)]
            required = [f"drafter {variant} ({drafter_dir})" if m == "drafter" else m for m in dropped if m in named]
            if required:   # asked for by name: run or fail, never a quiet AR-only table
                raise MTPLoadError(f"{', '.join(required)} needs the target's MTP, which did not load: {e}") from None
            print(f"[dmtp] skipping {', '.join(dropped)} (default methods; name them in methods=[...] to require "
                  f"them): {e}")
            methods = [m for m in methods if m not in dropped]

    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else target.config.eos_token_id
    decoders = {}
    for m in methods:
        label = variant if m == "drafter" else m
        proposer = build_proposer(m, target, mtp=drafter_mtp if m == "drafter" else mtp, drafter=drafter,
                                  injection=injection, mtp_steps=cfg.mtp_steps, name=label)
        decoders[label] = SpecDecoder(target, proposer, eos_token_id=eos, runner=cfg.runner, attention=cfg.attention,
                                      cuda_graphs=cfg.cuda_graphs, compile=cfg.get("compile", False),
                                      warmup_rounds=cfg.warmup_rounds)

    if cfg.eval.name == "embedded":
        workloads = embedded_prompts(tokenizer, list(cfg.eval.domains), cfg.num_prompts, cfg.eval.prompt_tokens)
        requests = []
    else:
        requests, workloads = eval_set_prompts(tokenizer, cfg.eval.name, cfg.eval.path, cfg.num_prompts)
    block = 1 + max((d.num_candidates for d in decoders.values()), default=0)
    limit, why = prompt_limit(target, cfg.max_new_tokens, block)
    workloads = fit_prompts(workloads, limit, why, cfg.eval.get("truncate"))
    decode = dict(max_new_tokens=cfg.max_new_tokens, sampling=sampling, batch_size=cfg.batch_size, seed=cfg.seed,
                  progress=cfg.progress)
    metrics = decode_workloads(decoders, workloads, warmup=cfg.warmup, **decode)
    # Multi-turn sets (MT-Bench): turn t+1 carries the model's own answers so far. Every method gets the
    # same follow-up prompts (built from the first method's answers; identical for all at temperature 0).
    wl_name = next(iter(workloads), None)
    rows = list(range(len(requests)))          # request index of each row of workload `wl_name`
    answers: dict[int, list[str]] = {i: [] for i in rows}
    turn = 1
    while decoders and any(len(requests[i].turns) > turn for i in rows):
        from dmtp.data.evalsets import build_turn_prompts

        prev = metrics["results"][(wl_name, next(iter(decoders)))].tokens
        for row, i in enumerate(rows):
            answers[i].append(tokenizer.decode(prev[row], skip_special_tokens=True))
        rows = [i for i in rows if len(requests[i].turns) > turn]
        turn += 1
        wl_name = f"{cfg.eval.name}_turn{turn}"
        workloads.update(fit_prompts({wl_name: [build_turn_prompts(tokenizer, requests[i], answers[i]) for i in rows]},
                                     limit, why, cfg.eval.get("truncate")))
        metrics = decode_workloads(decoders, {wl_name: workloads[wl_name]}, previous=metrics, **decode)
    add_comparisons(metrics, greedy=sampling.greedy)
    first = next(iter(decoders.values())) if decoders else None
    metrics["run"] = {
        "target": target_path, "drafter": str(drafter_dir) if drafter_dir else None, "injection": variant,
        "methods": list(decoders), "device": str(device), "dtype": str(dtype).replace("torch.", ""),
        "batch_size": cfg.batch_size, "max_new_tokens": cfg.max_new_tokens, "eval": cfg.eval.name,
        "num_prompts": {wl: len(p) for wl, p in workloads.items()},
        "cuda_graphs": bool(first and first.use_graphs), "runner": first.runner.kind if first else None,
        "compiled": bool(first and first.compiled), "compile_s": {name: d.compile_s for name, d in decoders.items()},
        "attention": getattr(first.runner, "attention", None) if first else None,
    }
    from omegaconf import OmegaConf

    metrics["config"] = OmegaConf.to_container(cfg, resolve=False)
    text = report(metrics)
    print(text)
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "metrics.json").write_text(json.dumps(jsonable(metrics), indent=2) + "\n")
    (out_dir / "table.txt").write_text(text + "\n")
    print(f"[dmtp] metrics written to {out_dir / 'metrics.json'}")
    return metrics


@hydra.main(version_base="1.3", config_path="../conf", config_name="infer")
def _hydra_main(cfg) -> None:
    from hydra.core.hydra_config import HydraConfig

    with one_line_errors("dmtp.infer"):
        run(cfg, named_methods(cfg, list(HydraConfig.get().overrides.task)))


def cli_shorthands(argv: list[str]) -> list[str]:
    """`drafter=<dir>` -> `drafter.path=<dir>`: `drafter` is also the name of the training's config
    group, which Hydra would otherwise try to select."""
    return ["drafter.path=" + a[len("drafter="):] if a.startswith("drafter=") else a for a in argv]


def main() -> None:
    sys.argv = [sys.argv[0], *cli_shorthands(sys.argv[1:])]
    _hydra_main()


if __name__ == "__main__":
    main()
