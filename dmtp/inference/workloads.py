"""Run several decoders over several prompt workloads and summarise them side by side."""
from __future__ import annotations

from dataclasses import replace

from dmtp.decode.loop import DecodeResult
from dmtp.decode.sampling import SamplingConfig
from dmtp.serving.base import Decoder


def decode_workloads(decoders: dict[str, Decoder], workloads: dict[str, list[list[int]]], *, max_new_tokens: int,
                     sampling: SamplingConfig, batch_size: int, seed: int = 0, warmup: bool = True,
                     progress: bool = False, previous: dict | None = None) -> dict:
    """Run every decoder on every workload.

    Returns {"workloads": {wl: {method: summary}}, "overall": {method: summary}, "results": {(wl, method):
    DecodeResult}}. With `previous` (an earlier return value), the new workloads are added to it and "overall"
    covers all of them."""
    per_wl: dict[str, dict] = dict(previous["workloads"]) if previous else {}
    results = dict(previous["results"]) if previous else {}
    general = sampling
    if general.schedules_verification and not any(d.predicts_confidence for d in decoders.values()):
        raise ValueError(f"confidence_threshold={general.confidence_threshold} needs a drafter with a confidence "
                         f"head (drafter=dspark); none of {', '.join(decoders)} predicts acceptance")
    if general.chooses_length and not any(d.signals_acceptance for d in decoders.values()):
        raise ValueError(f"verify_length=auto needs a method with an acceptance signal (a drafter with a confidence "
                         f"head, an MTP-led drafter, mtp415); none of {', '.join(decoders)} has one")
    samplings = {name: _sampling_for(general, dec, name) for name, dec in decoders.items()}   # refused before decoding
    for name, dec in decoders.items():
        sampling = samplings[name]
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


def pooled(out: dict, workloads) -> dict:
    """{method: summary} over the given workloads of a `decode_workloads` return value (requests pooled)."""
    workloads = [wl for wl in workloads if wl in out["workloads"]]
    if not workloads:
        return {}
    methods = {m for (_, m) in out["results"]}
    return {m: _merge([out["results"][(wl, m)] for wl in workloads]) for m in sorted(methods)
            if all((wl, m) in out["results"] for wl in workloads)}


def _sampling_for(general: SamplingConfig, dec: Decoder, name: str = "the proposer") -> SamplingConfig:
    """The run's sampling as one method decodes it: confidence-scheduled verification applies to the drafters
    that predict acceptance, a length chosen per batch to those with an acceptance signal, a fixed length to
    those that draft (K > 0; one longer than K is refused here, in one line); the baselines beside them verify
    their whole block."""
    sampling = general if dec.predicts_confidence else replace(general, confidence_threshold=0.0)
    if (general.chooses_length and not dec.signals_acceptance) or dec.num_candidates == 0:
        sampling = replace(sampling, verify_length="full")
    sampling.fixed_length(dec.num_candidates, name)
    return sampling


def _merge(results) -> dict:
    """One summary over several workloads' results (acceptance pooled over requests, times summed)."""
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
                          sum(r.batches for r in results), first.sampling, {**first.extra, **_pooled_verified(results)})
    return merged.summary()


def _pooled_verified(results) -> dict:
    """verified_per_round over all the workloads' rounds (each result's is over its own)."""
    rounds = [sum(map(len, r.accepted_raw)) for r in results]
    if not sum(rounds) or any("verified_per_round" not in r.extra for r in results):
        return {}
    verified = sum(r.extra["verified_per_round"] * n for r, n in zip(results, rounds))
    return {"verified_per_round": verified / sum(rounds)}


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
