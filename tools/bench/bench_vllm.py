"""dmtp's loop against vLLM on the same target, drafters and prompts, in one process (issue 23's speed table).

For each batch size: the target alone (ar) and every drafter given, decoded by dmtp's loop and by vLLM
(raw DFlash natively, DMTP variants through dmtp's plug-in), greedy, over the same held-out prompts.
Per engine and batch size: tau, tok/s, speed-up over that engine's own AR, and every drafter's tok/s over
the first drafter's (give raw DFlash first: DMTP / raw DFlash inside each engine). Every output is checked
equal to dmtp's AR (lossless in both engines). The engines alternate per batch size, so a drift of the
machine spreads over both; vLLM is timed around its batch call after one warm-up call per engine.

    .venv-vllm/bin/python tools/bench/bench_vllm.py --drafter RAW/drafter --drafter DMTP/drafter \\
        --batch-sizes 1 8 32 --num-prompts 32 --out vllm_bench.json

Runs in the vLLM environment (bash tools/env/vllm_env.sh). vLLM's batch size is its max_num_seqs (all prompts
are submitted at once: continuous batching up to the cap); dmtp's is the loop's static batch.
"""
from __future__ import annotations

import argparse
import os
import platform
import time

for _key, _value in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                     "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}.items():
    os.environ.setdefault(_key, _value)   # read by vLLM when it is imported


import torch  # noqa: E402

from dmtp.bench.args import add_machine_args, write_report
from dmtp.data.prompts import held_out_prompts  # noqa: E402
from dmtp.decode.sampling import SamplingConfig  # noqa: E402
from dmtp.serving.base import DecoderRequest  # noqa: E402
from dmtp.serving.catalogue import engine_named  # noqa: E402
from dmtp.inference.setup import load_drafter, load_mtp, load_target, placement, target_config  # noqa: E402
from dmtp.inference.workloads import decode_workloads  # noqa: E402
from dmtp.reports.tables import format_table  # noqa: E402


def engine_decoders(name: str, loaded, drafters, mtp, dtype, options: dict) -> dict:
    """{label: decoder}: the target alone and every drafter, from the engine registered as `name`."""
    engine = engine_named(name)
    out = engine.decoders(DecoderRequest(["ar"], {"ar"}, loaded, None, mtp, dtype, options))
    for d in drafters:
        out.update(engine.decoders(DecoderRequest(["drafter"], {"drafter"}, loaded, d, mtp, dtype, options)))
    return out


def timed_run(decoders: dict, prompts, args, sampling, batch: int, close: bool) -> dict:
    """{method: tau, tok/s, tokens} and the seconds of one engine's run over the prompts."""
    started = time.perf_counter()
    run = decode_workloads(decoders, {"all": prompts}, max_new_tokens=args.max_new_tokens, sampling=sampling,
                           batch_size=batch, warmup=True)
    if close:   # vLLM's processes stop before the next engine starts
        for d in decoders.values():
            d.close()
    figures = {name: {"tau": s["tau_per_request"], "tokens_per_s": s["tokens_per_s"],
                      "tokens": run["results"][("all", name)].tokens}
               for name, s in run["overall"].items()}
    figures["seconds"] = time.perf_counter() - started
    return figures


def table_rows(figures: dict, methods: list[str], first: str | None, batch: int, temperature: float) -> list[dict]:
    """The printed rows of one batch size and temperature; adds the ratios to `figures` (greedy outputs are
    checked equal to dmtp's AR: lossless in both engines)."""
    rows, reference = [], figures["dmtp"]["ar"]["tokens"]
    for engine in ("dmtp", "vllm"):
        ar_tps = figures[engine]["ar"]["tokens_per_s"]
        for name in methods:
            f = figures[engine][name]
            f["speedup_vs_ar"] = f["tokens_per_s"] / ar_tps
            f["vs_first_drafter"] = (f["tokens_per_s"] / figures[engine][first]["tokens_per_s"]
                                     if first and name != "ar" else None)
            tokens = f.pop("tokens")
            f["matches_dmtp_ar"] = tokens == reference if not temperature else None
            rows.append({"batch": batch, "T": temperature, "engine": engine, "method": name, "tau": f["tau"],
                         "tok/s": f["tokens_per_s"], "x AR": f["speedup_vs_ar"], "x first": f["vs_first_drafter"],
                         "= AR": "-" if temperature else ("yes" if f["matches_dmtp_ar"] else "NO")})
    for name in methods:
        rows.append({"batch": batch, "T": temperature, "engine": "vllm / dmtp", "method": name,
                     "tok/s": figures["vllm"][name]["tokens_per_s"] / figures["dmtp"][name]["tokens_per_s"]})
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None, help="target checkpoint dir (default: the embedded --preset)")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--drafter", action="append", default=[], help="drafter dir (repeatable; raw DFlash first)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0],
                    help="0 = greedy; T > 0 samples (rejection sampling in both engines)")
    ap.add_argument("--domains", default="code,math,prose")
    ap.add_argument("--num-prompts", type=int, default=32, help="in all, spread over the domains")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--max-model-len", type=int, default=512)
    add_machine_args(ap, device=None, dtype=None, threads=None)
    args = ap.parse_args(argv)

    device, dtype = placement("cpu", "float32")
    loaded = load_target(target_config(args.target, args.preset), device, dtype)
    mtp = load_mtp(loaded)
    domains = args.domains.split(",")
    per_domain = -(-args.num_prompts // len(domains))
    prompts = [p for d in domains
               for p in held_out_prompts(loaded.tokenizer, d, "test", per_domain, args.prompt_tokens)][:args.num_prompts]
    drafters = [load_drafter(loaded, p, device, dtype, native_mtp=mtp) for p in args.drafter]
    engine_args = {"enforce_eager": True, "max_model_len": args.max_model_len}

    rows, report = [], {"target": loaded.path, "drafters": args.drafter, "prompts": len(prompts),
                        "max_new_tokens": args.max_new_tokens, "torch_threads": torch.get_num_threads(),
                        "machine": platform.processor() or platform.machine(), "by_batch": {}}
    ours = engine_decoders("dmtp", loaded, drafters, mtp, dtype, {})
    first = drafters[0].label if drafters else None
    for batch in args.batch_sizes:
        report["by_batch"][batch] = {}
        for temperature in args.temperatures:
            # vLLM's sampled verification is rejection sampling: dmtp's loop runs the same rule
            sampling = SamplingConfig(temperature=temperature, verification="rejection" if temperature else "target_only")
            theirs = engine_decoders("vllm", loaded, drafters, mtp, dtype, engine_args)   # a fresh engine each time
            figures = {engine: timed_run(decoders, prompts, args, sampling, batch, close=engine == "vllm")
                       for engine, decoders in (("dmtp", ours), ("vllm", theirs))}
            rows += table_rows(figures, list(ours), first, batch, temperature)
            report["by_batch"][batch][temperature] = figures
    print(format_table(rows, ["batch", "T", "engine", "method", "tau", "tok/s", "x AR", "x first", "= AR"],
                       title=f"dmtp's loop vs vLLM ({len(prompts)} prompts x {args.max_new_tokens} new tokens, CPU fp32; "
                             f"T > 0: rejection sampling in both; x first = tok/s over the first drafter, {first})"))
    write_report(args.out, report)


if __name__ == "__main__":
    main()
