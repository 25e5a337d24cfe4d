"""The body of `python -m dmtp.infer`: load the target, the drafter and the MTP, decode the chosen prompt
set with every method through the one loop, print the comparison and write metrics.json."""
from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import OmegaConf

from dmtp.atomic_io import write_json, write_text
from dmtp.data.evalsets import build_turn_prompts
from dmtp.decode.drafters import (drafter_target, find_latest_drafter, load_drafter_for, method_needs_mtp,
                                  mtp_for_drafter, no_drafter_for)
from dmtp.decode.loop import SpecDecoder, build_proposer
from dmtp.decode.options import decode_options, named_methods, resolve_device, resolve_dtype
from dmtp.decode.prompt_sets import embedded_prompts, eval_set_prompts, fit_prompts, prompt_limit
from dmtp.decode.tables import jsonable, report
from dmtp.decode.workloads import add_comparisons, decode_workloads
from dmtp.models.mtp_loading import MTPLoadError, load_native_mtp
from dmtp.models.target import TargetModel, load_tokenizer
from dmtp.tiny.targets import default_target_dir, ensure_tiny_target


def newest_drafter_for(target_cfg) -> Path:
    """The newest drafter under ./outputs or ./logs trained for the target being decoded (target.path,
    else the embedded preset's cache directory, which need not be built yet); one line names it. None
    found: the message saying how to get one, and exit status 1."""
    target = target_cfg.path or default_target_dir(target_cfg.preset)
    found = find_latest_drafter(target=target)
    if found is None:
        print(no_drafter_for(target))
        sys.exit(1)
    print(f"[dmtp] drafter: {found} (the newest trained for {target}; pass drafter=<dir> to choose another)")
    return found


def compare_methods(cfg, named: set[str] | None = None) -> dict:
    """Decode the prompt set with every method, print the report and write metrics.json. `named`: the
    methods asked for by name (default: `named_methods(cfg)`)."""
    sampling = decode_options(cfg)
    named = named_methods(cfg) if named is None else named
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    methods = list(cfg.methods)
    drafter_dir = None
    if "drafter" in methods:
        drafter_dir = Path(cfg.drafter.path) if cfg.drafter.path else newest_drafter_for(cfg.target)

    trained_on = drafter_target(drafter_dir) if cfg.drafter.path else None
    if cfg.target.path:
        target_path = cfg.target.path
    elif trained_on:
        target_path = trained_on   # the target the given drafter was trained against
    else:
        target_path = str(ensure_tiny_target(cfg.target.preset, progress=True))
    target = TargetModel.from_pretrained(target_path, dtype=dtype, device=device,
                                         trust_remote_code=cfg.target.get("trust_remote_code", False))
    tokenizer = load_tokenizer(target_path, trust_remote_code=cfg.target.get("trust_remote_code", False))

    drafter = variant = None
    if drafter_dir is not None:
        options = cfg.drafter.get("injection_options")
        options = OmegaConf.to_container(options, resolve=True) if OmegaConf.is_config(options) else dict(options or {})
        drafter, variant = load_drafter_for(target, drafter_dir, dtype, device, cfg.drafter.get("injection"),
                                            options=options, block_size=cfg.drafter.get("block_size"))
    mtp = drafter_mtp = None
    if any(method_needs_mtp(m, drafter) for m in methods):
        try:
            mtp = load_native_mtp(target_path, target.embed_tokens, target.lm_head)
            drafter_mtp = mtp
            if method_needs_mtp("drafter", drafter):   # its own jointly trained MTP, if it has one
                drafter_mtp = mtp_for_drafter(target, target_path, drafter_dir, mtp)
        except (MTPLoadError, FileNotFoundError) as e:
            dropped = [m for m in methods if method_needs_mtp(m, drafter)]
            required = [f"drafter {variant} ({drafter_dir})" if m == "drafter" else m for m in dropped if m in named]
            if required:   # asked for by name: run or fail, never a quiet AR-only table
                raise MTPLoadError(f"{', '.join(required)} needs the target's MTP, which did not load: {e}") from None
            print(f"[dmtp] skipping {', '.join(dropped)} (default methods; name them in methods=[...] to require "
                  f"them): {e}")
            methods = [m for m in methods if m not in dropped]

    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else target.config.eos_token_id
    decoders = {}
    engine = cfg.get("engine", "dmtp")
    if engine not in ("dmtp", "vllm"):
        raise ValueError(f"engine must be dmtp or vllm, got {engine!r}")
    if engine == "vllm":   # the same prompts and table, decoded inside vLLM
        from dmtp.serving.vllm_decoder import vllm_decoders

        args = cfg.get("vllm_engine_args")
        args = OmegaConf.to_container(args, resolve=True) if OmegaConf.is_config(args) else dict(args or {})
        decoders = vllm_decoders(methods, named, target_path, [eos], drafter, drafter_dir, variant, args,
                                 str(dtype).replace("torch.", ""))
        methods = []
    for m in methods:
        label = variant if m == "drafter" else m
        proposer = build_proposer(m, target, mtp=drafter_mtp if m == "drafter" else mtp, drafter=drafter,
                                  mtp_steps=cfg.mtp_steps, name=label)
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
    metrics["run"]["engine"] = engine
    for d in decoders.values():   # an engine with processes of its own (vLLM): stop them now
        if hasattr(d, "close"):
            d.close()
    metrics["config"] = OmegaConf.to_container(cfg, resolve=False)
    text = report(metrics)
    print(text)
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "metrics.json", jsonable(metrics))   # read by dmtp.report: replaced whole or not at all
    write_text(out_dir / "table.txt", text + "\n")
    print(f"[dmtp] metrics written to {out_dir / 'metrics.json'}")
    return metrics
