"""Side-by-side decoding benchmark on one target, in one run:

* tau (acceptance length) and tok/s for ar, mtp415 and every drafter given (raw DFlash and DMTP variants);
* DMTP / DFlash ratios (tau and tok/s) for every DMTP drafter against the raw_dflash one;
* our AR runner against transformers' `generate()` on the same target and prompts;
* with several `--verification` modes, every method decoded under each of them, side by side.

    python tools/bench/bench_decode.py --drafter outputs/train/runs/A/drafter --drafter outputs/train/runs/B/drafter
    python tools/bench/bench_decode.py --preset micro --random-drafters raw_dflash,dual_anchor_zero_init   # plumbing check
    python tools/bench/bench_decode.py --target /dev/shm/qwen3-8b-random --random-drafters raw_dflash,dual_anchor_zero_init \
        --random-drafter-preset dflash-qwen3-8b --dtype bfloat16   # real shapes: timings real, tau meaningless
    python tools/bench/bench_decode.py --drafter <raw D> --drafter <DMTP D> --temperature 1 \
        --verification target_only rejection block      # tau and tok/s of each verification rule
    python tools/bench/bench_decode.py --drafter <multi D>@num_mtp_tokens=1 --drafter <multi D>@mtp_threshold=0.7
        # one drafter under several decoding-time injection options (labelled variant[k=v]);
        # DIR@block_size=8 verifies a shorter block than the drafter was trained with

With no --drafter and no --random-drafters, the newest trained drafter under ./outputs or ./logs is used
(if any). Writes a JSON report with --out: the first verification mode's figures at the top level (as with one
mode) and every mode's under `by_verification`.
"""
from __future__ import annotations

import argparse
import re
import statistics

import torch


from dmtp.bench.args import add_machine_args, write_report
from dmtp.bench.hf_baseline import hf_generate
from dmtp.bench.random_drafters import (add_random_drafter_size_args, random_drafter,
                                        random_drafter_mask_id, random_drafter_size)
from dmtp.decode import SamplingConfig  # noqa: E402
from dmtp.decode.sampling import VERIFICATION_MODES  # noqa: E402
from dmtp.inference.drafter_choice import find_latest_drafter  # noqa: E402
from dmtp.inference.prompt_choice import embedded_prompts  # noqa: E402
from dmtp.inference.setup import (build_decoder, load_drafter, load_mtp, load_target, placement,  # noqa: E402
                                  target_config)
from dmtp.inference.workloads import decode_workloads  # noqa: E402
from dmtp.reports.tables import format_table  # noqa: E402


def method_of(label: str) -> str:
    """Repeated drafters of one method are labelled `name#n` (compiled: `name#n compiled`); this is `name`
    (`name compiled`): a compiled repeat merges with the compiled ones, never with the eager ones."""
    return re.sub(r"#\d+", "", label)


def grouped_summary(overall: dict, workloads: dict) -> dict:
    """Merge repeated drafters of one method (labels `name#n`, e.g. several seeds) into mean and stdev
    per workload: tau, T1 acceptance, tok/s vs AR (same run), P(L>=k)."""
    out: dict = {}
    for wl, per_method in {"all": overall, **workloads}.items():
        ar_tps = per_method["ar"]["tokens_per_s"]
        groups: dict[str, list[dict]] = {}
        for label, s in per_method.items():
            groups.setdefault(method_of(label), []).append(s)
        for method, runs in groups.items():
            values = {"tau": [r["tau_per_request"] for r in runs], "tok_s": [r["tokens_per_s"] for r in runs],
                      "speedup_vs_ar": [r["tokens_per_s"] / ar_tps for r in runs]}
            if all(r["t1_accept"] is not None for r in runs):   # AR has no candidates
                values["t1_accept"] = [r["t1_accept"] for r in runs]
            for k in range(len(runs[0]["p_len_ge"])):
                values[f"p_len_ge_{k + 1}"] = [r["p_len_ge"][k] for r in runs]
            out.setdefault(wl, {})[method] = {
                key: (statistics.fmean(v), statistics.stdev(v) if len(v) > 1 else 0.0, len(v)) for key, v in values.items()}
    return out


def grouped_table(grouped: dict) -> str:
    lines = []
    for wl, methods in grouped.items():
        lines += [f"\n{wl}:", "| method | n | tau | T1 accept | tok/s | vs AR | P(L>=k), k = 1.. |", "|---|---|---|---|---|---|---|"]
        for m, st in methods.items():
            def pm(key, f="{:.3f}"):
                if key not in st:
                    return "-"
                return f.format(st[key][0]) + (" ± " + f.format(st[key][1]) if st[key][2] > 1 else "")

            ks = sorted((int(k.rsplit("_", 1)[1]) for k in st if k.startswith("p_len_ge_")))
            plen = " ".join(f"{st[f'p_len_ge_{k}'][0]:.2f}" for k in ks)
            lines.append(f"| {m} | {st['tau'][2]} | {pm('tau')} | {pm('t1_accept')} | {pm('tok_s', '{:.1f}')} | "
                         f"{pm('speedup_vs_ar')} | {plen} |")
    return "\n".join(lines)


def median_speed(reps: list[dict]) -> dict:
    """`decode_workloads` run several times in turn (every method once per repetition, so the methods are
    interleaved and share the machine's drift): the first run's figures with each method's tok/s and
    stage times replaced by their medians over the repetitions, overall and per workload; the single
    tok/s values are kept under `tok_s_reps`. Acceptance is the same in every repetition (seeded)."""
    first = reps[0]
    if len(reps) == 1:
        return first
    for scope in ("overall", "workloads"):
        tables = [first[scope]] if scope == "overall" else list(first[scope].values())
        for i, table in enumerate(tables):
            for method, summary in table.items():
                runs = [(r[scope] if scope == "overall" else list(r[scope].values())[i])[method] for r in reps]
                summary["tok_s_reps"] = [round(x["tokens_per_s"], 1) for x in runs]
                summary["tokens_per_s"] = statistics.median(x["tokens_per_s"] for x in runs)
                summary["stage_ms_per_round"] = {k: statistics.median(x["stage_ms_per_round"].get(k, 0.0) for x in runs)
                                                 for k in summary["stage_ms_per_round"]}
    return first


def throughput_vs_batch(decoders, workloads, batch_sizes, max_new_tokens: int, sampling, reps: int = 1) -> dict:
    """tok/s of every method (repeated drafters: mean ± stdev; median over interleaved --reps) with all
    prompts decoded together at each batch size; printed as a table."""
    if not batch_sizes:
        return {}
    everything = {"all": [p for prompts in workloads.values() for p in prompts]}
    out = {}
    for b in batch_sizes:
        overall = median_speed([decode_workloads(decoders, everything, max_new_tokens=max_new_tokens, sampling=sampling,
                                                 batch_size=b, warmup=rep == 0) for rep in range(reps)])["overall"]
        groups: dict[str, list[float]] = {}
        for label, s in overall.items():
            groups.setdefault(method_of(label), []).append(s["tokens_per_s"])
        out[b] = {m: (statistics.fmean(v), statistics.stdev(v) if len(v) > 1 else 0.0) for m, v in groups.items()}
    methods = list(next(iter(out.values())))
    print("\ntok/s vs batch size (all prompts; repeated drafters: mean ± stdev):")
    print("| batch | " + " | ".join(methods) + " |\n|---|" + "---|" * len(methods))
    for b, row in out.items():
        print(f"| {b} | " + " | ".join(f"{row[m][0]:.1f}" + (f" ± {row[m][1]:.1f}" if row[m][1] else "") for m in methods) + " |")
    return out


def bench_sampling(decoders, workloads, sampling, args, title: str) -> tuple[dict, dict]:
    """Every method on every workload under one sampling config: prints the methods' table, the
    DMTP / DFlash ratios, merged repeated drafters and (if asked) tok/s vs batch size. Returns the
    report's figures for this config and the raw return value of `decode_workloads`."""
    reps = [decode_workloads(decoders, workloads, max_new_tokens=args.max_new_tokens, sampling=sampling,
                             batch_size=args.batch_size, warmup=rep == 0, progress=args.reps == 1)
            for rep in range(args.reps)]
    metrics = median_speed(reps)
    overall = metrics["overall"]
    ar_tps = overall["ar"]["tokens_per_s"]
    rows = [{"method": m, "tau": s["tau_per_request"], "tau_verify": s["tau_per_verify"], "t1_accept": s["t1_accept"],
             "tok/s": s["tokens_per_s"], "speedup_vs_ar": s["tokens_per_s"] / ar_tps,
             "ms/round": s["stage_ms_per_round"].get("round")} for m, s in overall.items()]
    print(format_table(rows, ["method", "tau", "tau_verify", "t1_accept", "tok/s", "speedup_vs_ar", "ms/round"],
                       title=title))
    ratios = dmtp_over_dflash(overall)
    grouped = grouped_summary(overall, metrics["workloads"])
    if any("#" in m for m in overall):
        print("\nrepeated drafters merged (mean ± stdev):" + grouped_table(grouped))
    by_batch = throughput_vs_batch(decoders, workloads, args.throughput_batch_sizes, args.max_new_tokens, sampling,
                                   args.reps)
    figures = {"methods": dict(overall), "workloads": metrics["workloads"], "dmtp_over_dflash": ratios,
               "grouped": grouped, "throughput_vs_batch": by_batch}
    return figures, metrics


def dmtp_over_dflash(overall: dict) -> dict:
    """tau and tok/s ratios (and T1 acceptance points) of every drafter over the first raw_dflash one; printed."""
    raw = [m for m in overall if m.startswith("raw_dflash")]
    if not raw:
        return {}
    base = overall[raw[0]]
    ratios = {}
    for m, s in overall.items():
        if m.removesuffix(" compiled") in ("ar", "mtp415") or m == raw[0]:
            continue
        ratios[m] = {"tau_ratio": s["tau_per_request"] / base["tau_per_request"],
                     "tps_ratio": s["tokens_per_s"] / base["tokens_per_s"],
                     "t1_points": 100 * ((s["t1_accept"] or 0) - (base["t1_accept"] or 0))}
        print(f"{m} / {raw[0]}: tau x{ratios[m]['tau_ratio']:.3f} ({100 * (ratios[m]['tau_ratio'] - 1):+.2f}%), "
              f"tok/s x{ratios[m]['tps_ratio']:.3f}, T1 {ratios[m]['t1_points']:+.2f} points")
    return ratios


def verification_table(methods_by_mode: dict[str, dict], title: str) -> str:
    """One row per method; tau (per request) and tok/s under every verification mode, side by side."""
    modes = list(methods_by_mode)
    rows = [{"method": m, **{f"{key} {mode}": methods_by_mode[mode][m][field] for mode in modes
                             for key, field in (("tau", "tau_per_request"), ("tok/s", "tokens_per_s"))}}
            for m in methods_by_mode[modes[0]]]
    columns = ["method"] + [f"{key} {mode}" for mode in modes for key in ("tau", "tok/s")]
    return format_table(rows, columns, title=title)


def drafter_spec(spec: str) -> tuple[str, dict]:
    """`DIR` or `DIR@key=value[,key=value]` (decoding-time injection options; values parsed as YAML)."""
    import yaml

    path, _, opts = spec.partition("@")
    options = {}
    for item in filter(None, opts.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise SystemExit(f"--drafter {spec}: options are key=value pairs, got {item!r}")
        options[key] = yaml.safe_load(value)
    return path, options


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None, help="target checkpoint dir (default: the embedded --preset)")
    ap.add_argument("--preset", default="tiny", help="embedded target preset when --target is not given")
    ap.add_argument("--drafter", action="append", default=[],
                    help="drafter checkpoint dir (repeatable); DIR@key=value,... sets decoding-time injection options")
    ap.add_argument("--random-drafters", default="", help="comma-separated variants with random weights (plumbing)")
    add_random_drafter_size_args(ap)
    ap.add_argument("--domains", default="code,prose,math")
    ap.add_argument("--num-prompts", type=int, default=8, help="per domain")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--no-cuda-graphs", action="store_true")
    ap.add_argument("--compile", choices=["off", "on", "both"], default="off",
                    help="CPU: torch.compile the round (on), or decode every method both eagerly and compiled "
                         "(both: '<method> compiled' rows); compile time is reported apart")
    ap.add_argument("--no-hf", action="store_true", help="skip the transformers generate() baseline")
    ap.add_argument("--reps", type=int, default=1,
                    help="decode everything this many times, the methods interleaved; tok/s and stage times are medians")
    add_machine_args(ap, threads=0)
    ap.add_argument("--throughput-batch-sizes", type=int, nargs="*", default=[],
                    help="also decode all prompts together at each batch size: tok/s vs batch size")
    ap.add_argument("--verification", nargs="+", default=["target_only"], choices=VERIFICATION_MODES, metavar="MODE",
                    help=f"verification mode(s), any of {' '.join(VERIFICATION_MODES)}: every method is decoded under "
                         "each, side by side (they differ only at --temperature > 0; 1 is the methods' throughput setting)")
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error(f"--reps must be at least 1, got {args.reps}")
    modes = list(dict.fromkeys(args.verification))
    if len(modes) > 1 and args.temperature <= 0:
        print("note: at temperature 0 every verification mode is greedy verification (identical tokens and tau); "
              "pass --temperature 1 to compare them")

    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = placement(args.device, args.dtype)
    loaded = load_target(target_config(args.target, args.preset), device, dtype)
    path, target, tok, eos = loaded.path, loaded.model, loaded.tokenizer, loaded.eos_token_id
    mtp = load_mtp(loaded)

    drafters = []
    paths = list(args.drafter)
    if not paths and not args.random_drafters:
        latest = find_latest_drafter(target=path)   # the newest trained for this target
        if latest is not None:
            paths = [str(latest)]
    for spec in paths:
        p, options = drafter_spec(spec)
        block_size = options.pop("block_size", None)   # DIR@block_size=8: a shorter verified block
        d = load_drafter(loaded, p, device, dtype, native_mtp=mtp, options=options, block_size=block_size)
        drafters.append((d.model, d.label, d.mtp))   # d.mtp: its own jointly trained MTP, if it has one
    mask_id = random_drafter_mask_id(tok, target)
    size = random_drafter_size(args, ap, target.config.num_hidden_layers)
    for name in filter(None, args.random_drafters.split(",")):
        drafters.append((*random_drafter(target, name, mask_id, device, dtype, size=size), mtp))

    graphs = not args.no_cuda_graphs
    decoders = {}
    for suffix, compile in {"off": [("", False)], "on": [("", True)],
                            "both": [("", False), (" compiled", True)]}[args.compile]:
        for m in ("ar", "mtp415"):
            decoders[m + suffix] = build_decoder(target, m, eos, mtp=mtp, cuda_graphs=graphs, compile=compile)
        for drafter, name, drafter_mtp in drafters:
            # `name`: the loader's label, the method's name (its architecture and MTP correction included)
            if drafter_mtp is not mtp:   # decoded with its own jointly trained MTP: another method
                name = f"{name}+tuned_mtp"
            label = (name if name + suffix not in decoders else f"{name}#{len(decoders)}") + suffix
            decoders[label] = build_decoder(target, "drafter", eos, mtp=drafter_mtp, drafter=drafter, name=label,
                                            cuda_graphs=graphs, compile=compile)

    workloads = embedded_prompts(tok, args.domains.split(","), args.num_prompts, args.prompt_tokens)
    runs = {mode: bench_sampling(decoders, workloads, SamplingConfig(temperature=args.temperature, verification=mode),
                                 args, title=f"decoding on {path} ({device}, {str(dtype).replace('torch.', '')}, "
                                             f"batch {args.batch_size}, T={args.temperature:g}, verification={mode})")
            for mode in modes}
    by_mode = {mode: figures for mode, (figures, _) in runs.items()}
    if len(modes) > 1:
        print("\n" + verification_table({mode: figures["methods"] for mode, figures in by_mode.items()},
                                        title=f"side by side, T={args.temperature:g} (tau per request, tok/s):"))
    first, metrics = runs[modes[0]]
    ar_tps = first["methods"]["ar"]["tokens_per_s"]
    identical_to_ar = None
    if args.temperature <= 0:   # greedy: every method must reproduce ar's tokens (exactly in float32; bf16 may flip ties)
        def outputs(method):
            return [t for wl in workloads for t in metrics["results"][(wl, method)].tokens]
        ar_out = outputs("ar")
        identical_to_ar = {m: sum(a == b for a, b in zip(ar_out, outputs(m))) for m in decoders if m != "ar"}
        print(f"greedy outputs identical to ar ({str(dtype).replace('torch.', '')}): "
              + ", ".join(f"{m} {n}/{len(ar_out)}" for m, n in identical_to_ar.items()))

    hf = None
    if not args.no_hf:
        prompts = [p for ps in workloads.values() for p in ps]
        hf = hf_generate(target, prompts, args.max_new_tokens, args.batch_size, eos)
        ours = [t for wl in workloads for t in metrics["results"][(wl, "ar")].tokens]
        same = sum(a == b for a, b in zip(ours, hf["tokens"]))
        print(f"AR runner {ar_tps:.1f} tok/s vs transformers generate() {hf['tokens_per_s']:.1f} tok/s "
              f"(x{ar_tps / hf['tokens_per_s']:.2f}); identical outputs {same}/{len(prompts)}")
        hf = {k: v for k, v in hf.items() if k != "tokens"} | {"identical_outputs": same, "requests": len(prompts)}

    if args.compile != "off":
        print("compile time (s, in the warm-ups, not in tok/s): "
              + ", ".join(f"{k} {d.compile_s:.1f}" for k, d in decoders.items() if d.compiled))
    report = {"target": path, "device": str(device), "dtype": str(dtype), "batch_size": args.batch_size,
              "compile_s": {k: d.compile_s for k, d in decoders.items() if d.compiled},
              "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "verification": modes,
              "identical_to_ar": identical_to_ar, "requests": sum(len(ps) for ps in workloads.values()),
              "random_drafter_size": size if args.random_drafters else None,
              **first, "hf_generate": hf, "by_verification": by_mode}
    write_report(args.out, report)
    return report


if __name__ == "__main__":
    main()
