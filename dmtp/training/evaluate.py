"""After training, decode the held-out workloads with the one loop under the evaluation protocol (README
"Evaluation protocol"): the trained drafter and, in the same process and on the same prompts, the baselines
(target-only AR and the target's own MTP415 chain), in each decoding mode asked for (greedy, and sampled at a
temperature with a verification rule).

The modules are the trained ones, in memory: only the decoders are built, by the one setup loader's `build_decoder`
(dmtp.inference.setup), as dmtp.infer and the benchmarks build theirs.

Returns the record metrics.json keeps under "eval" (per mode, workload and method: tau, each request's tau for
the bootstrap intervals, T1, P(L>=k), tok/s, speed-up vs AR) plus, for the first greedy mode's drafter, the flat
`<workload>/<metric>` keys the sweep's older tables read."""
from __future__ import annotations

from dmtp.data.corpora import corpus_of_target
from dmtp.decode import SamplingConfig
from dmtp.decode.sampling import draft_rules
from dmtp.inference.drafter_choice import greedy_correction_note
from dmtp.inference.prompt_choice import embedded_prompts, held_out_workloads
from dmtp.inference.setup import LoadedTarget, build_decoder, load_mtp
from dmtp.inference.workloads import add_comparisons, decode_workloads, pooled
from dmtp.models.draft_vocab import DraftVocab
from dmtp.models.provenance import weights_digest
from dmtp.reports.decode_report import request_taus
from dmtp.speed.profile import DEFAULT_PROFILE
from dmtp.speed.projection import PROJECTED_BATCHES
from dmtp.speed.recipe import round_recipe

DEFAULT_MODES = ({"temperature": 0.0}, {"temperature": 1.0, "verification": "rejection"})
EVAL_METHODS = ("ar", "mtp415", "drafter")


def mode_name(mode: dict) -> str:
    """`greedy`, or `T=<temperature> <verification>` (e.g. `T=1 rejection`)."""
    t = float(mode.get("temperature", 0.0))
    if t == 0:
        return "greedy"
    rule = mode.get("draft_rule") or {}
    drafts = "".join(f" {source}={rule[source]}" for source in ("mtp", "block") if source in rule)
    return f"T={t:g} {mode.get('verification', 'target_only')}{drafts}"


def sampling_of(mode: dict) -> SamplingConfig:
    unknown = set(mode) - {"temperature", "verification", "top_k", "top_p", "draft_rule"}
    if unknown:
        raise ValueError(f"decode_eval.modes: unknown key {sorted(unknown)[0]!r} "
                         f"(temperature, verification, top_k, top_p, draft_rule)")
    return SamplingConfig(temperature=float(mode.get("temperature", 0.0)), top_k=int(mode.get("top_k", 0)),
                          top_p=float(mode.get("top_p", 1.0)), verification=mode.get("verification", "target_only"),
                          **draft_rules(mode.get("draft_rule")))


def compact(summary: dict) -> dict:
    """What the record keeps of a decode summary."""
    return {"tau": summary["tau_per_request"], "tau_verify": summary["tau_per_verify"],
            "tau_requests": request_taus(summary), "t1_accept": summary["t1_accept"],
            "p_len_ge": summary["p_len_ge"], "tok_s": summary["tokens_per_s"],
            "speedup_vs_ar": summary.get("speedup_vs_ar"), "matches_ar": summary.get("matches_ar"),
            "ms_round": (summary.get("stage_ms_per_round") or {}).get("round")}


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


def _target_mtp(loaded: LoadedTarget):
    """The target's own MTP for the chain baseline, or None (one line) when it has none that loads."""
    from dmtp.families.mtp_loading import MTPLoadError

    try:
        return load_mtp(loaded)
    except (MTPLoadError, FileNotFoundError) as e:
        print(f"[dmtp] decode_eval: no MTP chain baseline ({e})")
        return None


def _draft_vocab(size: int | None, token_counts) -> DraftVocab | None:
    if size is None:
        return None
    if token_counts is None:
        raise ValueError(f"decode_eval.draft_vocab={size} needs the drafter data's token counts")
    return DraftVocab.most_frequent(token_counts, int(size))


def speed_section(profile: str, decoders: dict, drafter, vocab: DraftVocab | None, samplings: dict) -> dict:
    """The record's "speed": the profile its table projects to and, per mode, each method's round (dmtp.speed)."""
    size = vocab.size if vocab is not None else None
    return {"profile": profile, "batches": list(PROJECTED_BATCHES), "draft_vocab": size,
            "recipes": {name: {m: round_recipe(m, drafter if m == "drafter" else None, size,
                                               sampled=not s.greedy).as_dict() for m in decoders}
                        for name, s in samplings.items()}}


def decode_after_training(target, mtp, drafter, tokenizer,
                          domains=("code", "prose", "math", "code_tasks", "prose_tasks"), trained_domains=None,
                          num_prompts: int = 32, prompt_tokens: int = 64, max_new_tokens: int = 128,
                          batch_size: int = 8, methods=EVAL_METHODS, modes=DEFAULT_MODES, seed: int = 0,
                          throughput_batch_sizes=(), speed_profile: str | None = DEFAULT_PROFILE,
                          draft_vocab: int | None = None, token_counts=None) -> dict:
    """-> {"eval": the protocol's record, plus the flat keys of the first greedy mode's drafter}.
    `trained_domains`: the drafter data's corpus domains; the others, and every shipped prompt set, are labelled
    held out (`protocol.held_out`) and pooled apart from the in-distribution ones (the rows "in-distribution" and
    "held out" beside "all").
    `throughput_batch_sizes`: also decode all the workloads' prompts together greedily at each of these batch
    sizes and record `throughput/bs<b>/tok_s` (and `.../speedup_vs_ar`): the throughput-vs-batch plot.
    `speed_profile`: the profile the table projects each method's speed-up to (dmtp.speed; the record keeps each
    method's round per mode under "speed"). `draft_vocab`: every drafting head (the MTP chains' and the drafter's)
    over the `draft_vocab` most frequent tokens of `token_counts` (the run's data, dmtp.models.draft_vocab)."""
    methods = list(methods)
    if "drafter" not in methods:
        raise ValueError(f"decode_eval.methods must include drafter (the run's own), got {methods}")
    samplings = {mode_name(m): sampling_of(m) for m in modes}
    if not samplings:
        raise ValueError("decode_eval.modes is empty: name at least one mode, e.g. [{temperature: 0.0}]")
    drafter.eval()
    note = greedy_correction_note(drafter, "decode_eval") if any(not s.greedy for s in samplings.values()) else None
    if note:
        print(note)
    workloads = embedded_prompts(tokenizer, list(domains), num_prompts, prompt_tokens, corpus_of_target(target.path))
    loaded = LoadedTarget(target.path, target, tokenizer)
    eos = loaded.eos_token_id
    needs_mtp = [m for m in methods if m.startswith("mtp")]
    if needs_mtp and mtp is None:   # raw DFlash trains without the MTP; its table still has the MTP chain beside it
        mtp = _target_mtp(loaded)
    vocab = _draft_vocab(draft_vocab, token_counts)
    decoders = _decoders(target, methods, eos, mtp, drafter, vocab)
    record = {"protocol": {"workloads": {wl: len(p) for wl, p in workloads.items()}, "prompt_tokens": prompt_tokens,
                           "max_new_tokens": max_new_tokens, "batch_size": batch_size, "seed": seed,
                           "target": target.path, "target_digest": weights_digest(target.path),
                           "methods": list(decoders), "skipped": [m for m in needs_mtp if m not in decoders],
                           "held_out": held_out_workloads(workloads, trained_domains)},
              "modes": {}}
    if speed_profile:
        record["speed"] = speed_section(speed_profile, decoders, drafter, vocab, samplings)
    flat: dict = {}
    for name, sampling in samplings.items():
        out = decode_workloads(decoders, workloads, max_new_tokens=max_new_tokens, sampling=sampling,
                               batch_size=batch_size, seed=seed)
        add_comparisons(out, greedy=sampling.greedy)
        record["modes"][name] = {wl: {m: compact(s) for m, s in per.items()} for wl, per in out["workloads"].items()}
        record["modes"][name]["all"] = {m: compact(s) for m, s in out["overall"].items()}
        held_out = record["protocol"]["held_out"]
        if held_out and len(held_out) < len(workloads):   # both kinds decoded: each pooled on its own
            splits = {"in-distribution": [wl for wl in workloads if wl not in held_out], "held out": held_out}
            for split, wls in splits.items():
                record["modes"][name][split] = {m: compact(s) for m, s in pooled(out, wls).items()}
        if sampling.greedy and not flat:
            for wl, per in out["workloads"].items():
                flat.update(flat_decode_metrics(per["drafter"], wl))
                if "ar" in per:
                    flat[f"{wl}/speedup_vs_ar"] = per["drafter"]["tokens_per_s"] / per["ar"]["tokens_per_s"]
    flat.update(_throughput(decoders, workloads, throughput_batch_sizes, max_new_tokens))
    return {**flat, "eval": record}


def _decoders(target, methods, eos, mtp, drafter, vocab: DraftVocab | None) -> dict:
    """The loop's decoder of every method (the MTP chains skipped, never faked, for a target without an MTP)."""
    decoders = {}
    for m in methods:
        if m.startswith("mtp") and mtp is None:
            continue
        decoders[m] = build_decoder(target, m, eos, mtp=mtp, drafter=drafter if m == "drafter" else None,
                                    **({"draft_vocab": vocab} if vocab is not None else {}))
    return decoders


def _throughput(decoders: dict, workloads: dict, batch_sizes, max_new_tokens: int) -> dict:
    """`throughput/bs<b>/tok_s` (and its speed-up vs AR): every prompt decoded greedily at each batch size."""
    flat = {}
    everything = {"all": [p for prompts in workloads.values() for p in prompts]}
    for b in batch_sizes or ():
        run = decode_workloads(decoders, everything, max_new_tokens=max_new_tokens, sampling=SamplingConfig(),
                               batch_size=int(b))["overall"]
        flat[f"throughput/bs{b}/tok_s"] = run["drafter"]["tokens_per_s"]
        if "ar" in run:
            flat[f"throughput/bs{b}/speedup_vs_ar"] = run["drafter"]["tokens_per_s"] / run["ar"]["tokens_per_s"]
    return flat
