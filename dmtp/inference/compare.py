"""The body of `python -m dmtp.infer`: load (target, drafter, MTP) -> the engine's decoders (dmtp.serving,
`engine=` by name) -> the prompts -> decode them with every method -> print the comparison and write
metrics.json."""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from omegaconf import OmegaConf

from dmtp.atomic_io import write_json, write_text
from dmtp.data.corpora import corpus_of_target
from dmtp.data.evalsets import build_turn_prompts
from dmtp.inference.drafter_choice import (drafter_target_mismatch, find_latest_drafter, greedy_correction_note,
                                     method_needs_mtp, no_drafter_for, require_drafter_dir, target_over_preset,
                                     train_command)
from dmtp.inference.options import decode_options, named_methods
from dmtp.inference.prompt_choice import embedded_prompts, eval_set_prompts, fit_prompts, prompt_limit
from dmtp.serving.base import DecoderRequest
from dmtp.serving.catalogue import engine_named
from dmtp.inference.setup import (LoadedDrafter, LoadedTarget, drafter_with_mtp, dtype_name, load_drafter, load_mtp,
                                  load_target, placement)
from dmtp.inference.workloads import add_comparisons, decode_workloads
from dmtp.models.model_card import CARD_NAME, set_card_section
from dmtp.models.provenance import weights_digest
from dmtp.models.mtp_errors import MTPLoadError
from dmtp.reports.decode_report import jsonable, report
from dmtp.speed.projection import PROJECTED_BATCHES
from dmtp.speed.recipe import round_recipe
from dmtp.tiny.targets import default_target_dir

@dataclass
class Loaded:
    """What one run decodes with: the methods left after an unloadable MTP dropped default ones."""
    target: LoadedTarget
    device: torch.device
    dtype: torch.dtype
    drafter: LoadedDrafter | None
    mtp: object
    methods: list[str]
    target_from: str = "target.preset"   # what chose the target: target.path | drafter (its record) | target.preset
    draft_vocab: object = None           # the drafting heads' reduced vocabulary (dmtp.models.draft_vocab), or None


def compare_methods(cfg, named: set[str] | None = None) -> dict:
    """Decode the prompt set with every method, print the report and write metrics.json. `named`: the
    methods asked for by name (default: `named_methods(cfg)`)."""
    sampling = decode_options(cfg)
    named = named_methods(cfg) if named is None else named
    chosen_engine(cfg)   # before anything loads
    loaded = load(cfg, named)
    decoders = build_decoders(cfg, loaded, named)
    try:
        requests, workloads, fit = prompts(cfg, loaded.target, decoders)
        metrics = decode_turns(cfg, decoders, sampling, requests, workloads, fit, loaded.target.tokenizer)
        add_comparisons(metrics, greedy=sampling.greedy)
        metrics["run"] = run_record(cfg, loaded, decoders, workloads)
        metrics["run"]["speed"] = speed_record(cfg, loaded, decoders, sampling)
    finally:
        for d in decoders.values():   # an engine with processes of its own (vLLM): stop them now
            d.close()
    text = write_report(cfg, metrics)
    record_on_card(cfg, loaded, text)
    return metrics


def chosen_engine(cfg):
    """The engine `engine=` names, checked before anything loads: a wrong name, its package not installed, or vLLM's
    own options given to another engine (where they would be ignored) are one line each."""
    engine = engine_named(cfg.get("engine", "dmtp"))
    if engine.require_installed is not None:
        engine.require_installed()
    if cfg.get("vllm_engine_args") and engine.name != "vllm":
        raise ValueError(f"vllm_engine_args are vLLM's engine options (engine=vllm); engine={engine.name} takes none")
    return engine


def newest_drafter_for(target_cfg) -> Path:
    """The newest drafter under ./outputs or ./logs trained for the target being decoded (target.path,
    else the embedded preset's cache directory, which need not be built yet); one line names it.

    None found: the line saying how to get one (a FileNotFoundError: bad input, exit status 2)."""
    target = target_cfg.path or default_target_dir(target_cfg.preset)
    found = find_latest_drafter(target=target)
    if found is None:
        raise FileNotFoundError(no_drafter_for(target, command=train_command(target_cfg)))
    print(f"[dmtp] drafter: {found} (the newest trained for {target}; pass drafter=<dir> to choose another)")
    return found


def load(cfg, named: set[str]) -> Loaded:
    """The target (target.path, else the target a given drafter was trained against, else the embedded
    preset), the drafter (drafter.path, else the newest trained for that target) and the MTP."""
    device, dtype = placement(cfg.device, cfg.dtype)
    methods = list(cfg.methods)
    drafter_dir = None
    if "drafter" in methods:
        drafter_dir = Path(cfg.drafter.path) if cfg.drafter.path else newest_drafter_for(cfg.target)
        require_drafter_dir(drafter_dir)   # before the target loads
    trained_on = target_over_preset(cfg.target, drafter_dir) if cfg.drafter.path else None
    target = load_target(cfg.target, device, dtype, path=trained_on)
    drafter = None
    if drafter_dir is not None:
        options = cfg.drafter.get("injection_options")
        options = OmegaConf.to_container(options, resolve=True) if OmegaConf.is_config(options) else dict(options or {})
        drafter = load_drafter(target, drafter_dir, device, dtype, injection=cfg.drafter.get("injection"),
                               options=options, block_size=cfg.drafter.get("block_size"))
    mtp, drafter, methods = with_mtp(target, drafter, methods, named)
    note = greedy_correction_note(drafter.model, drafter.label) if drafter and cfg.temperature > 0 else None
    if note:
        print(note)
    chosen_by = "target.path" if cfg.target.path else "drafter" if trained_on else "target.preset"
    return Loaded(target, device, dtype, drafter, mtp, methods, chosen_by, chosen_draft_vocab(cfg, drafter_dir))


def chosen_draft_vocab(cfg, drafter_dir):
    """`draft_vocab=<V>`: the V most frequent tokens of the drafter data's counts (`draft_vocab_from`, else the decoded
    drafter's draft_vocab/token_counts.safetensors), said in one line; None without the option."""
    from dmtp.models.draft_vocab import draft_vocab_for, load_token_counts

    size = cfg.get("draft_vocab")
    if size is None:
        return None
    if type(size) is not int or size < 1:
        raise ValueError(f"draft_vocab must be an integer >= 1 (tokens; null: the whole head), got {size!r}")
    if cfg.get("engine", "dmtp") != "dmtp":
        raise ValueError(f"draft_vocab={size} is dmtp's own loop's (engine=dmtp); engine={cfg.engine} drafts with "
                         f"its own heads")
    source = cfg.get("draft_vocab_from") or drafter_dir
    vocab = draft_vocab_for(int(size), source)
    print(f"[dmtp] draft vocabulary: the {vocab.size} most frequent tokens of {source}'s data "
          f"({vocab.coverage(load_token_counts(source)):.1%} of its supervised tokens; the MTP's steps and the "
          f"drafter's slots propose from them)")
    return vocab


def with_mtp(target: LoadedTarget, drafter: LoadedDrafter | None, methods: list[str], named: set[str]):
    """-> (the target's MTP, the drafter with the MTP it decodes with, the methods to run).

    An MTP that does not load fails the methods asked for by name (never a quiet AR-only table) and skips the
    default ones, saying so."""
    model = drafter.model if drafter else None
    if not any(method_needs_mtp(m, model) for m in methods):
        return None, drafter, methods
    try:
        mtp = load_mtp(target)
        return mtp, drafter and drafter_with_mtp(target, drafter, mtp), methods
    except (MTPLoadError, FileNotFoundError) as e:
        dropped = [m for m in methods if method_needs_mtp(m, model)]
        required = [f"drafter {drafter.label} ({drafter.path})" if m == "drafter" else m for m in dropped if m in named]
        if required:
            raise MTPLoadError(f"{', '.join(required)} needs the target's MTP, which did not load: {e}") from None
        print(f"[dmtp] skipping {', '.join(dropped)} (default methods; name them in methods=[...] to require "
              f"them): {e}")
        return None, drafter, [m for m in methods if m not in dropped]


def build_decoders(cfg, loaded: Loaded, named: set[str]) -> dict:
    """label -> decoder of every method, from the engine `engine=` names (dmtp.serving.catalogue)."""
    engine = engine_named(cfg.get("engine", "dmtp"))
    return engine.decoders(DecoderRequest(loaded.methods, named, loaded.target, loaded.drafter, loaded.mtp,
                                          loaded.dtype, engine.options(cfg), draft_vocab=loaded.draft_vocab))


def prompts(cfg, target: LoadedTarget, decoders: dict):
    """-> (the eval set's requests, {workload: prompts} fitted to the target, the fitting of later turns)."""
    if cfg.eval.name == "embedded":
        workloads = embedded_prompts(target.tokenizer, list(cfg.eval.domains), cfg.num_prompts, cfg.eval.prompt_tokens,
                                     corpus_of_target(target.path))
        requests = []
    else:
        requests, workloads = eval_set_prompts(target.tokenizer, cfg.eval.name, cfg.eval.path, cfg.num_prompts)
    block = 1 + max((d.num_candidates for d in decoders.values()), default=0)
    limit, why = prompt_limit(target.model, cfg.max_new_tokens, block)
    fit = partial(fit_prompts, limit=limit, why=why, truncate=cfg.eval.get("truncate"))
    return requests, fit(workloads), fit


def decode_turns(cfg, decoders: dict, sampling, requests: list, workloads: dict, fit, tokenizer) -> dict:
    """Decode every workload with every decoder.

    Multi-turn sets (MT-Bench): turn t+1 carries the model's own answers so far; every method gets the same
    follow-up prompts (built from the first method's answers; identical for all at temperature 0). Later turns are
    added to `workloads`."""
    decode = dict(max_new_tokens=cfg.max_new_tokens, sampling=sampling, batch_size=cfg.batch_size, seed=cfg.seed,
                  progress=cfg.progress)
    metrics = decode_workloads(decoders, workloads, warmup=cfg.warmup, **decode)
    wl_name = next(iter(workloads), None)
    rows = list(range(len(requests)))          # request index of each row of workload `wl_name`
    answers: dict[int, list[str]] = {i: [] for i in rows}
    turn = 1
    while decoders and any(len(requests[i].turns) > turn for i in rows):
        prev = metrics["results"][(wl_name, next(iter(decoders)))].tokens
        for row, i in enumerate(rows):
            answers[i].append(tokenizer.decode(prev[row], skip_special_tokens=True))
        rows = [i for i in rows if len(requests[i].turns) > turn]
        turn += 1
        wl_name = f"{cfg.eval.name}_turn{turn}"
        workloads.update(fit({wl_name: [build_turn_prompts(tokenizer, requests[i], answers[i]) for i in rows]}))
        metrics = decode_workloads(decoders, {wl_name: workloads[wl_name]}, previous=metrics, **decode)
    return metrics


def run_record(cfg, loaded: Loaded, decoders: dict, workloads: dict) -> dict:
    """metrics.json's `run`: what was decoded, where and how."""
    first = next(iter(decoders.values())).info() if decoders else {}
    drafter = loaded.drafter
    return {
        "target": loaded.target.path, "target_digest": weights_digest(loaded.target.path),
        "target_from": loaded.target_from, "drafter": drafter.path if drafter else None,
        "injection": drafter.label if drafter else None,
        "methods": list(decoders), "device": str(loaded.device), "dtype": dtype_name(loaded.dtype),
        "batch_size": cfg.batch_size, "max_new_tokens": cfg.max_new_tokens, "eval": cfg.eval.name,
        "num_prompts": {wl: len(p) for wl, p in workloads.items()},
        "cuda_graphs": bool(first.get("cuda_graphs")), "runner": first.get("runner"),
        "compiled": bool(first.get("compiled")), "compile_s": {name: d.info()["compile_s"] for name, d in decoders.items()},
        "attention": first.get("attention"),
        "engine": cfg.get("engine", "dmtp"),
        # the target the drafter recorded is another than this one: the warning line, printed with the table
        "target_mismatch": drafter_target_mismatch(drafter.path, loaded.target.path) if drafter else None,
    }


def speed_record(cfg, loaded: Loaded, decoders: dict, sampling) -> dict:
    """metrics.json's `run.speed`: the speed profile the table projects to and each method's round (dmtp.speed.recipe,
    from the method's own config), which the report prices."""
    vocab = loaded.draft_vocab
    recipes = {}
    for m in loaded.methods:
        label = loaded.drafter.label if m == "drafter" else m
        if label in decoders:
            recipes[label] = round_recipe(m, loaded.drafter.model if m == "drafter" else None,
                                          vocab.size if vocab is not None else None, cfg.mtp_steps,
                                          sampled=not sampling.greedy).as_dict()
    return {"profile": cfg.get("speed_profile"), "batches": list(PROJECTED_BATCHES), "recipes": recipes,
            "draft_vocab": vocab.size if vocab is not None else None}


def record_on_card(cfg, loaded: Loaded, text: str) -> None:
    """The printed comparison, as a section of the decoded drafter's model card (dmtp.models.model_card; one
    section per run directory, so a rerun replaces its own).

    Only a card dmtp wrote is edited, and a card that cannot be written is one line: the run's own outputs are
    already on disk."""
    drafter = loaded.drafter
    if drafter is None:
        return
    title = (f"`dmtp.infer` against {loaded.target.path}: {drafter.label}, eval {cfg.eval.name}, engine "
             f"{cfg.get('engine', 'dmtp')}, temperature {cfg.temperature}, {cfg.max_new_tokens} new tokens")
    try:
        if set_card_section(drafter.path, f"infer {Path(cfg.output_dir).resolve()}", title, text):
            print(f"[dmtp] table added to the drafter's card: {Path(drafter.path) / CARD_NAME}")
    except OSError as e:
        print(f"[dmtp] the drafter's card {Path(drafter.path) / CARD_NAME} was not updated: {e.strerror or e}")


def write_report(cfg, metrics: dict) -> str:
    """Print the comparison (returned); write metrics.json (read by dmtp.report: replaced whole or not at all)
    and table.txt."""
    metrics["config"] = OmegaConf.to_container(cfg, resolve=False)
    text = report(metrics)
    print(text)
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "metrics.json", jsonable(metrics))
    write_text(out_dir / "table.txt", text + "\n")
    print(f"[dmtp] metrics written to {out_dir / 'metrics.json'}")
    return text
