"""Our loop side by side with the reference implementation's, on the same target and drafter weights:

* the reference loop (`dflash.model.dflash_generate` of the `dflash` package: one request, transformers'
  DynamicCache cropped on reject) vs our `SpecDecoder` (static caches, eager and, with --compile,
  compiled), batch 1, the same drafter checkpoint loaded by both: identical tokens (greedy), tau, tok/s,
  at temperature 0 and at --temperature (drafts sampled and verified by rejection sampling in both);
* our target-only AR vs transformers' `generate()` at each --hf-batch-sizes: identical tokens, tok/s.

Every system decodes the same held-out prompts; the systems run interleaved, --reps times, in one
process, and the table gives medians (tok/s = output tokens / wall time, prefill included; compile
time apart). Needs the reference package: `pip install --no-deps dflash==0.1.0`.

    python tools/bench/bench_peer.py --drafter <raw DFlash run>/drafter --compile
    python tools/bench/bench_peer.py --preset micro --random-drafter --device cuda --cuda-graphs   # a bare GPU machine
    python tools/bench/bench_peer.py --target /dev/shm/qwen3-8b-random --random-drafter --random-drafter-preset dflash-qwen3-8b \
        --dtype bfloat16 --device cuda --cuda-graphs     # real shapes (random weights: timings only)
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch


from dmtp.bench.args import add_machine_args, write_report
from dmtp.bench.random_drafters import add_random_drafter_size_args, random_drafter_size
from dmtp.bench.hf_baseline import hf_generate
from dmtp.decode import SamplingConfig, SpecDecoder  # noqa: E402
from dmtp.inference.drafter_choice import find_latest_drafter  # noqa: E402
from dmtp.inference.prompt_choice import embedded_prompts  # noqa: E402
from dmtp.inference.setup import (build_decoder, load_drafter, load_mtp, load_target, placement,  # noqa: E402
                                  target_config)


def reference_model(path: str, dtype, device):
    """The drafter directory loaded by the reference package's own class for its architecture."""
    from dflash.model import DFlash2DraftModel, DFlashDraftModel

    arch = (json.loads((Path(path) / "config.json").read_text()).get("architectures") or ["DFlashDraftModel"])[0]
    cls = DFlash2DraftModel if arch == "DFlash2DraftModel" else DFlashDraftModel
    return cls.from_pretrained(path, dtype=dtype).to(device).eval()


@torch.no_grad()
def run_reference(model, target, prompts, max_new: int, eos: int | None, temperature: float, seed: int) -> dict:
    """`dflash_generate` on every prompt in turn (it decodes one request at a time)."""
    import dflash.model
    from dflash.model import dflash_generate

    if target.device.type != "cuda":   # its stats timer calls torch.cuda.synchronize(); plain wall time on CPU
        dflash.model._cuda_time = time.perf_counter

    torch.manual_seed(seed)
    tokens, taus = [], []
    sync = torch.cuda.synchronize if target.device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for p in prompts:
        out = dflash_generate(model, target.hf, torch.tensor([p], device=target.device), max_new,
                              [eos] if eos is not None else None, temperature=temperature, return_stats=True)
        tokens.append(out.output_ids[0, len(p):].tolist())
        taus.append(statistics.fmean(out.acceptance_lengths) if out.acceptance_lengths else None)
    sync()
    wall = time.perf_counter() - t0
    n = sum(map(len, tokens))
    taus = [t for t in taus if t is not None]
    return {"tokens": tokens, "tok_s": n / wall, "tau": statistics.fmean(taus) if taus else None}


def write_random_drafter(target, tok, size: dict | None = None) -> str:
    """An untrained raw DFlash drafter for `target` in the published layout (sized by `size`: layers, taps,
    block; see bench_decode.RANDOM_DRAFTER_PRESETS), in a temporary directory (removed at exit), so that
    the comparison runs where no drafter was trained (a bare GPU machine)."""
    from dmtp.bench.random_drafters import random_drafter, random_drafter_mask_id

    drafter, _ = random_drafter(target, "raw_dflash", random_drafter_mask_id(tok, target), "cpu", torch.float32,
                                size=size)
    out = tempfile.mkdtemp(prefix="bench_peer_drafter_")
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    drafter.save(out)
    return out


def run_ours(decoder: SpecDecoder, prompts, max_new: int, sampling: SamplingConfig, batch: int, seed: int) -> dict:
    res = decoder.generate(prompts, max_new_tokens=max_new, sampling=sampling, batch_size=batch, seed=seed)
    s = res.summary()
    return {"tokens": res.tokens, "tok_s": s["tokens_per_s"], "tau": s["tau_per_request"],
            "ms_round": s["stage_ms_per_round"].get("round"), "ms_verify": s["stage_ms_per_round"].get("verify")}


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def median_table(title: str, runs: dict[str, list[dict]], base: str, greedy: bool) -> tuple[str, dict]:
    """Median tok/s and tau per system over the reps, speed vs `base`, identical outputs vs `base`."""
    lines = [f"\n{title}", f"| system | tau | tok/s (median) | vs {base} | identical to {base} | ms / round |",
             "|---|---|---|---|---|---|"]
    out = {}
    base_tps = statistics.median(r["tok_s"] for r in runs[base])
    for name, reps in runs.items():
        tps = statistics.median(r["tok_s"] for r in reps)
        taus = [r["tau"] for r in reps if r.get("tau") is not None]
        ms = [r["ms_round"] for r in reps if r.get("ms_round")]
        n = len(reps[-1]["tokens"])
        same = sum(a == b for a, b in zip(reps[-1]["tokens"], runs[base][-1]["tokens"])) if greedy else None
        out[name] = {"tok_s": tps, "tau": statistics.median(taus) if taus else None, "vs_base": tps / base_tps,
                     "identical": same, "requests": n, "ms_per_round": statistics.median(ms) if ms else None,
                     "tok_s_reps": [round(r["tok_s"], 1) for r in reps]}
        o = out[name]
        lines.append(f"| {name} | {_fmt(o['tau'], '.3f')} | {tps:.1f} | {o['vs_base']:.2f}x | "
                     f"{'-' if same is None else f'{same}/{n}'} | {_fmt(o['ms_per_round'], '.2f')} |")
    return "\n".join(lines), out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None, help="target checkpoint dir (default: the embedded --preset)")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--drafter", default=None, help="a raw DFlash / DFlash2 drafter dir (default: the newest trained)")
    ap.add_argument("--random-drafter", action="store_true",
                    help="no trained drafter: an untrained raw DFlash drafter for the target, written to a temporary "
                         "dir and loaded by both loops (identical tokens still checked; tau means nothing)")
    ap.add_argument("--domains", default="code,prose,math")
    ap.add_argument("--num-prompts", type=int, default=8, help="per domain")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0, help="the sampled comparison (0: skip it)")
    ap.add_argument("--hf-batch-sizes", type=int, nargs="*", default=[1, 8], help="AR vs generate() at these batches")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions (medians reported)")
    ap.add_argument("--compile", action="store_true", help="also our compiled loop (torch.compile of the stages)")
    ap.add_argument("--cuda-graphs", action="store_true", help="also our loop with CUDA graphs (--device cuda)")
    add_random_drafter_size_args(ap)
    add_machine_args(ap, device="cpu", dtype="float32", threads=0, seed=True,
                     dtype_help="both loops' dtype (float32: exact greedy identity; bfloat16: real-size targets, "
                                "where near-ties may flip between the loops' different kernels)")
    args = ap.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = placement(args.device, args.dtype)
    if args.drafter and args.random_drafter:
        raise SystemExit("bench_peer: --drafter and --random-drafter exclude each other")
    if args.cuda_graphs and device.type != "cuda":
        raise SystemExit(f"bench_peer: --cuda-graphs needs --device cuda, got {args.device}")
    loaded = load_target(target_config(args.target, args.preset), device, dtype)
    path, target, tok, eos = loaded.path, loaded.model, loaded.tokenizer, loaded.eos_token_id
    if args.random_drafter:
        drafter_dir = write_random_drafter(target, tok, random_drafter_size(args, ap, target.config.num_hidden_layers))
    else:
        latest = find_latest_drafter(target=path)   # the newest trained for this target
        drafter_dir = args.drafter or (str(latest) if latest else None)
    if drafter_dir is None:
        raise SystemExit("bench_peer: no --drafter given and no trained drafter found (--random-drafter: an untrained one)")
    mtp = load_mtp(loaded)
    loaded_drafter = load_drafter(loaded, drafter_dir, device, dtype, native_mtp=mtp)
    drafter, variant = loaded_drafter.model, loaded_drafter.label
    if drafter.needs_mtp:
        raise SystemExit(f"bench_peer: {drafter_dir} is a {variant} drafter; the reference loop runs raw DFlash only")
    theirs = reference_model(drafter_dir, dtype, device)

    def decoder(method: str, compile: bool = False, graphs: bool = False) -> SpecDecoder:
        kw = {"drafter": drafter} if method == "drafter" else {}
        return build_decoder(target, method, eos, mtp=mtp, compile=compile, cuda_graphs=graphs, **kw)

    ours = {"dmtp": decoder("drafter")}
    ar = {"dmtp AR": decoder("ar")}
    if args.compile:
        ours["dmtp compiled"] = decoder("drafter", compile=True)
        ar["dmtp AR compiled"] = decoder("ar", compile=True)
    if args.cuda_graphs:
        ours["dmtp graphs"] = decoder("drafter", graphs=True)
        ar["dmtp AR graphs"] = decoder("ar", graphs=True)
    workloads = embedded_prompts(tok, args.domains.split(","), args.num_prompts, args.prompt_tokens)
    prompts = [p for ps in workloads.values() for p in ps]
    n = args.max_new_tokens
    temps = [0.0] + ([args.temperature] if args.temperature > 0 else [])
    samplings = {t: SamplingConfig(temperature=t, verification="rejection" if t > 0 else "target_only") for t in temps}

    # Warm-up (untimed): allocation, first-call costs, compilation (reported apart).
    compile_s = {}
    run_reference(theirs, target, prompts[:1], 8, eos, 0.0, args.seed)
    for name, dec in {**ours, **ar}.items():
        for batch in ([1] if name in ours else args.hf_batch_sizes):
            for t in (temps if name in ours else [0.0]):
                dec.generate(prompts[:batch], max_new_tokens=n if dec.fixed_shapes else 8, sampling=samplings[t],
                             batch_size=batch, seed=args.seed)
        compile_s[name] = dec.compile_s
    load = [os.getloadavg()[0]]
    peer: dict[float, dict[str, list]] = {t: {} for t in temps}
    hf_runs: dict[int, dict[str, list]] = {b: {} for b in args.hf_batch_sizes}
    for _ in range(args.reps):
        for t in temps:
            peer[t].setdefault("reference", []).append(run_reference(theirs, target, prompts, n, eos, t, args.seed))
            for name, dec in ours.items():
                peer[t].setdefault(name, []).append(run_ours(dec, prompts, n, samplings[t], 1, args.seed))
        for b in args.hf_batch_sizes:
            hf = hf_generate(target, prompts, n, b, eos)
            hf_runs[b].setdefault("generate()", []).append({"tokens": hf["tokens"], "tok_s": hf["tokens_per_s"]})
            for name, dec in ar.items():
                hf_runs[b].setdefault(name, []).append(run_ours(dec, prompts, n, samplings[0.0], b, args.seed))
        load.append(os.getloadavg()[0])

    print(f"\nbench_peer: {path}, drafter {drafter_dir} ({variant}, {drafter.config.architecture}, "
          f"{drafter.config.num_hidden_layers} layers, block {drafter.config.block_size}), {str(dtype).replace('torch.', '')}, "
          f"{len(prompts)} prompts "
          f"x {n} new tokens, {args.reps} interleaved reps, torch threads {torch.get_num_threads()}, "
          f"load average {min(load):.1f}..{max(load):.1f}")
    report = {"target": path, "drafter": drafter_dir, "prompts": len(prompts), "max_new_tokens": n, "reps": args.reps,
              "dtype": str(dtype).replace("torch.", ""), "block_size": drafter.config.block_size,
              "drafter_layers": drafter.config.num_hidden_layers,
              "threads": torch.get_num_threads(), "load_average": load, "compile_s": compile_s, "peer": {}, "ar": {}}
    for t in temps:
        verification = "greedy" if t == 0 else f"T={t:g}, drafts sampled, rejection sampling"
        table, figures = median_table(f"batch 1, {verification}: reference dflash_generate vs our loop",
                                      peer[t], "reference", greedy=t == 0)
        print(table)
        report["peer"][str(t)] = figures
    for b in args.hf_batch_sizes:
        table, figures = median_table(f"target-only AR, batch {b}, greedy: transformers generate() vs our loop",
                                      hf_runs[b], "generate()", greedy=True)
        print(table)
        report["ar"][str(b)] = figures
    if args.cuda_graphs:   # the same shapes eager and captured: identical greedy tokens expected in any dtype
        pairs = [("dmtp", "dmtp graphs", peer[0.0])] + [("dmtp AR", "dmtp AR graphs", hf_runs[b]) for b in args.hf_batch_sizes]
        same = {f"{g} vs {e}" + ("" if runs is peer[0.0] else f" (batch {b})"): sum(
            x == y for x, y in zip(runs[e][-1]["tokens"], runs[g][-1]["tokens"]))
            for (e, g, runs), b in zip(pairs, [1, *args.hf_batch_sizes])}
        report["graphs_vs_eager_identical"] = same
        print("greedy, CUDA graphs vs eager at the same shapes, identical outputs: "
              + ", ".join(f"{k} {v}/{len(prompts)}" for k, v in same.items()))
    if args.compile:
        print("\ncompile time (s, warm-up, not in tok/s): " + ", ".join(f"{k} {v:.1f}" for k, v in compile_s.items()))
    write_report(args.out, report)
    return report


if __name__ == "__main__":
    main()
