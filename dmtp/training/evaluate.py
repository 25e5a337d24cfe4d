"""After training, decode the embedded held-out prompts with the one loop (sweep jobs): the trained
drafter and, for comparison in the same process, target-only AR. Returns flat `<domain>/<metric>` keys
for metrics.json. The modules are the trained ones, in memory: only the decoders are built, by the one
setup loader's `build_decoder` (dmtp.inference.setup), as dmtp.infer and the benchmarks build theirs."""
from __future__ import annotations

from dmtp.decode import SamplingConfig
from dmtp.inference.prompt_sets import embedded_prompts
from dmtp.inference.setup import LoadedTarget, build_decoder
from dmtp.inference.workloads import decode_workloads


def flat_decode_metrics(summary: dict, prefix: str) -> dict:
    out = {f"{prefix}/tau": summary["tau_per_request"], f"{prefix}/tau_verify": summary["tau_per_verify"],
           f"{prefix}/t1_accept": summary["t1_accept"], f"{prefix}/tok_s": summary["tokens_per_s"]}
    for k, p in enumerate(summary["p_len_ge"], 1):
        out[f"{prefix}/p_len_ge_{k}"] = p
    for k, p in enumerate(summary["p_cond"], 1):
        out[f"{prefix}/p_cond_{k}"] = p
    for stage, ms in (summary.get("stage_ms_per_round") or {}).items():
        out[f"{prefix}/ms_{stage}"] = ms
    return out


def decode_after_training(target, mtp, drafter, tokenizer, domains=("code", "prose", "math"),
                          num_prompts: int = 8, prompt_tokens: int = 64, max_new_tokens: int = 64,
                          batch_size: int = 4, compare_ar: bool = True, throughput_batch_sizes=()) -> dict:
    """`throughput_batch_sizes`: also decode all the domains' prompts together at each of these batch
    sizes and record `throughput/bs<b>/tok_s` (and `.../speedup_vs_ar`): the throughput-vs-batch plot."""
    drafter.eval()
    workloads = embedded_prompts(tokenizer, list(domains), num_prompts, prompt_tokens)
    eos = LoadedTarget(target.path, target, tokenizer).eos_token_id
    decoders = {"drafter": build_decoder(target, "drafter", eos, mtp=mtp, drafter=drafter)}
    if compare_ar:
        decoders["ar"] = build_decoder(target, "ar", eos)
    out = decode_workloads(decoders, workloads, max_new_tokens=max_new_tokens, sampling=SamplingConfig(),
                           batch_size=batch_size)
    metrics = {}
    for domain, per_method in out["workloads"].items():
        metrics.update(flat_decode_metrics(per_method["drafter"], domain))
        if compare_ar:
            metrics[f"{domain}/speedup_vs_ar"] = per_method["drafter"]["tokens_per_s"] / per_method["ar"]["tokens_per_s"]
    everything = {"all": [p for prompts in workloads.values() for p in prompts]}
    for b in throughput_batch_sizes or ():
        run = decode_workloads(decoders, everything, max_new_tokens=max_new_tokens, sampling=SamplingConfig(),
                               batch_size=int(b))["overall"]
        metrics[f"throughput/bs{b}/tok_s"] = run["drafter"]["tokens_per_s"]
        if compare_ar:
            metrics[f"throughput/bs{b}/speedup_vs_ar"] = run["drafter"]["tokens_per_s"] / run["ar"]["tokens_per_s"]
    return metrics
