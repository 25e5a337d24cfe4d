"""What a prefix-cache hit costs a DMTP drafter inside vLLM: long prompts twice, prefix caching on.

The second pass (the prompts in the other order) is served from vLLM's cache up to each prompt's last full block
but one; vLLM then skips the target there, and dmtp's plug-in rebuilds the MTP's rows of those positions from
the target's hidden states it kept (dmtp/serving/vllm/mtp_prefix.py). For each drafter, one engine with caching
on and one with it off, in one process, each timed around its batch call (after one warm-up request): the first
pass, the second pass, tau, and for DMTP the store's hits and rebuilt rows. A raw DFlash drafter (vLLM's own
path: its cached blocks hold the drafter's context K/V, nothing to rebuild) gives the saving a hit could bring.

    .venv-vllm/bin/python tools/bench/bench_vllm_prefix.py --drafter RAW/drafter --drafter DMTP/drafter \\
        --num-prompts 16 --prompt-tokens 384 --out prefix.json
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

from dmtp.bench.args import add_machine_args, write_report  # noqa: E402
from dmtp.data.prompts import held_out_prompts  # noqa: E402
from dmtp.drafters.checkpoint import read_drafter_config  # noqa: E402
from dmtp.inference.setup import load_target, placement, target_config  # noqa: E402
from dmtp.reports.tables import format_table  # noqa: E402
from dmtp.serving.vllm.decoder import draft_sample_method  # noqa: E402
from dmtp.serving.vllm.engine import generate, make_llm, sampling_params, shutdown  # noqa: E402


def timed_pass(llm, prompts, params) -> dict:
    started = time.perf_counter()
    tokens, rounds = generate(llm, prompts, params)
    seconds = time.perf_counter() - started
    drafts = sum(len(r) for r in rounds)
    return {"seconds": seconds, "tokens": tokens, "tau": 1 + sum(map(sum, rounds)) / max(drafts, 1), "rounds": drafts}


def measure(target_dir: str, drafter_dir: str, caching: bool, prompts, params, block_size: int, max_model_len: int):
    spec = {"method": "dflash", "model": drafter_dir, "num_speculative_tokens": 7,
            "draft_sample_method": draft_sample_method(drafter_dir)}
    llm = make_llm(target_dir, {"enforce_eager": True, "max_model_len": max_model_len, "block_size": block_size,
                                "enable_prefix_caching": caching, "max_num_seqs": len(prompts)}, speculative_config=spec)
    try:
        generate(llm, [prompts[0][:block_size]], params)   # warm-up: one short request, nothing it could share
        first = timed_pass(llm, prompts, params)
        second = timed_pass(llm, prompts[::-1], params)
        second["tokens"] = second["tokens"][::-1]
        drafter = llm.llm_engine.model_executor.driver_worker.worker.model_runner.drafter
        store = getattr(drafter, "prefix_store", None)
        extra = {} if store is None else {"hits": store.hits, "misses": store.misses, "rebuilt_rows": store.rebuilt_rows}
    finally:
        shutdown(llm)
    return first, second, extra


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None, help="target checkpoint dir (default: the embedded --preset)")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--drafter", action="append", default=[], help="drafter dir (repeatable)")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=384)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--block-size", type=int, default=32, help="vLLM's KV block (its CPU default is 128)")
    add_machine_args(ap, device=None, dtype=None, threads=None)
    args = ap.parse_args(argv)

    device, dtype = placement("cpu", "float32")
    loaded = load_target(target_config(args.target, args.preset), device, dtype)
    prompts = held_out_prompts(loaded.tokenizer, "code", "test", args.num_prompts, args.prompt_tokens)
    params = sampling_params(args.max_new_tokens, [loaded.tokenizer.eos_token_id])
    max_model_len = args.prompt_tokens + args.max_new_tokens + 64
    rows, report = [], {"target": loaded.path, "prompts": len(prompts), "prompt_tokens": args.prompt_tokens,
                        "max_new_tokens": args.max_new_tokens, "block_size": args.block_size,
                        "torch_threads": torch.get_num_threads(),
                        "machine": platform.processor() or platform.machine(), "drafters": {}}
    for drafter_dir in args.drafter:
        name = (read_drafter_config(drafter_dir).get("architectures") or ["?"])[0]
        report["drafters"][drafter_dir] = figures = {}
        for caching in (False, True):
            first, second, extra = measure(str(loaded.path), drafter_dir, caching, prompts, params, args.block_size,
                                           max_model_len)
            same = second.pop("tokens") == first.pop("tokens")
            figures["on" if caching else "off"] = {"first": first, "second": second, "same_tokens": same, **extra}
            rows.append({"drafter": name, "prefix caching": "on" if caching else "off", "1st pass s": first["seconds"],
                         "2nd pass s": second["seconds"], "2nd / 1st": second["seconds"] / first["seconds"],
                         "tau 1st": first["tau"], "tau 2nd": second["tau"], "same tokens": "yes" if same else "NO",
                         "rebuilt rows": extra.get("rebuilt_rows", "-")})
    print(format_table(rows, ["drafter", "prefix caching", "1st pass s", "2nd pass s", "2nd / 1st", "tau 1st", "tau 2nd",
                              "same tokens", "rebuilt rows"],
                       title=f"prefix-cache hits inside vLLM ({len(prompts)} code prompts x {args.prompt_tokens} tokens, "
                             f"{args.max_new_tokens} new, greedy, KV blocks of {args.block_size}, CPU fp32)"))
    write_report(args.out, report)


if __name__ == "__main__":
    main()
