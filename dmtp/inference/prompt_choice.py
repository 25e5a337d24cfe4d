"""The prompts `python -m dmtp.infer` decodes: the embedded held-out documents, a named eval set, and
fitting them to the target's position limit."""
from __future__ import annotations


def embedded_prompts(tokenizer, domains, num_prompts: int, prompt_tokens: int,
                     corpus: str = "stdlib") -> dict[str, list[list[int]]]:
    """Held-out prompts per workload: for a corpus domain (code, prose, math) `num_prompts` prompts of
    `prompt_tokens` tokens from its test split in `corpus` (the target's: dmtp.data.corpora.corpus_of_target),
    spread over it (dmtp.data.prompts; whole requests in a corpus of exchanges); for a prompt set shipped with
    the package (dmtp.data.prompt_sets: code_tasks) its first `num_prompts` prompts, whole."""
    from dmtp.data.corpora import DOMAINS
    from dmtp.data.evalsets import build_turn_prompts, load_eval_set
    from dmtp.data.prompt_sets import PROMPT_SETS
    from dmtp.data.prompts import held_out_prompts

    unknown = [d for d in domains if d not in DOMAINS and d not in PROMPT_SETS]
    if unknown:
        raise ValueError(f"unknown workload {unknown[0]!r}: a corpus domain ({', '.join(DOMAINS)}) or a shipped prompt "
                         f"set ({', '.join(PROMPT_SETS)})")
    out = {}
    for domain in domains:
        if domain in DOMAINS:
            out[domain] = held_out_prompts(tokenizer, domain, "test", num_prompts, prompt_tokens, corpus)
        else:
            requests = load_eval_set("prompts", str(PROMPT_SETS[domain]), limit=num_prompts)
            out[domain] = [build_turn_prompts(tokenizer, r, [], use_raw_prompt=True) for r in requests]
    return out


def held_out_workloads(workloads, trained_domains) -> list[str]:
    """The workloads the drafter's data lacks: every shipped prompt set (held out as a set, as the seed's MT-Bench)
    and any corpus domain outside `trained_domains` (the drafter data's domains; None: unknown, none counted).

    The one rule behind every "in-distribution / held out" label the tables print."""
    from dmtp.data.prompt_sets import PROMPT_SETS

    trained = None if trained_domains is None else set(trained_domains)
    return [wl for wl in workloads if wl in PROMPT_SETS or (trained is not None and wl not in trained)]


def eval_set_prompts(tokenizer, name: str, path: str, num_prompts: int) -> tuple[list, dict[str, list[list[int]]]]:
    """A named eval set's first `num_prompts` requests and their first-turn prompts (completion-style sets,
    HumanEval and the plain `prompts` set, are continued as written; the others go through the chat template)."""
    from dmtp.data.evalsets import build_turn_prompts, load_eval_set

    if not path:
        raise ValueError(f"eval.name={name} needs eval.path (a local file or directory)")
    requests = load_eval_set(name, path, limit=num_prompts)
    if num_prompts is not None and len(requests) < num_prompts:   # decode what there is, and say so
        print(f"[dmtp] {path} holds {len(requests)} prompt(s), fewer than num_prompts={num_prompts}: "
              f"decoding {len(requests)}")
    prompts = [build_turn_prompts(tokenizer, r, [], use_raw_prompt=True) for r in requests]
    for request, prompt in zip(requests, prompts):
        if not prompt:
            raise ValueError(f"{request.source}: empty prompt ({request.id} encodes to no tokens); "
                             "give it text to continue, or remove the record")
    return requests, {name: prompts}


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
