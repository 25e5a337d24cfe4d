"""Where a target sits among served models: the observables that decide a drafter's acceptance, per workload,
beside the band the DMTP blog publishes (`python -m dmtp.regime`; ../reference regime.md's definitions).

Everything is measured on the protocol's prompts along the text the target itself writes, through the one
decoding loop: MTP415 (its own MTP chained 4 steps) decodes greedily and at T = 1 with target-only verification,
which return the target's own greedy and sampled text (lossless), their tau and the MTP's T1 acceptance. One
teacher-forced forward over each prompt + continuation then gives, at every position that predicted a written
token, the target's top-1 probability and entropy, and the MTP's argmax beside the target's (agreement).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dmtp.decode import SamplingConfig, build_proposer
from dmtp.families.decoding import spec_decoder

# The band a served chat model sits in (DMTP blog; regime.md): (low, high) or a bound; None where unpublished.
BAND = {
    "top1_t1": (0.6, None),          # mean top-1 probability along its own T = 1 text (code, math)
    "rep4_greedy": (None, 0.25),     # share of repeated 4-grams in its greedy text
    "t1_accept_t1": (0.70, 0.90),    # the MTP's T1 under target-only verification at T = 1 (code 0.823, math ~0.84)
    "mtp415_tau_greedy": (3.53, 4.70),   # Qwen3.6-27B, five workloads, greedy
    "mtp415_tau_t1": (3.15, 4.20),   # Qwen3.6-35B-A3B, six workloads, T = 1, target-only (4-step MTP)
}
COLUMNS = [("top1_greedy", "top-1 greedy"), ("top1_t1", "top-1 T=1"), ("entropy_t1", "entropy T=1"),
           ("rep4_greedy", "rep 4-grams"), ("mtp_agree_greedy", "MTP agrees"), ("t1_accept_t1", "MTP T1 @T=1"),
           ("mtp415_tau_greedy", "MTP415 tau"), ("mtp415_tau_t1", "MTP415 tau @T=1")]


def repeated_4grams(tokens: list[int]) -> float:
    """Share of the 4-grams of `tokens` that repeat an earlier 4-gram of the same sequence (0 when none)."""
    grams = [tuple(tokens[i:i + 4]) for i in range(len(tokens) - 3)]
    seen: set[tuple[int, ...]] = set()
    repeats = 0
    for g in grams:
        repeats += g in seen
        seen.add(g)
    return repeats / len(grams) if grams else 0.0


@dataclass
class TextObservables:
    """Means over the positions that predicted a written token, pooled over one workload's requests."""
    top1: float
    entropy: float
    mtp_agree: float


@torch.no_grad()
def observe_text(target, mtp, prompts: list[list[int]], continuations: list[list[int]]) -> TextObservables:
    """The target's top-1 probability and entropy where it predicted each written token, and how often its
    MTP's argmax there equals the target's own argmax for the same token (the MTP at position t reads
    (x_t, h_{t-1}) and predicts x_{t+1}, as the target's logits at t do)."""
    top1, entropy, agree = [], [], []
    for prompt, new in zip(prompts, continuations):
        if not new:
            continue
        ids = torch.tensor([list(prompt) + list(new)], device=target.device)
        out = target(ids)
        positions = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(new), device=ids.device)
        p = torch.softmax(out.logits[0, positions].float(), dim=-1)
        top1.append(p.amax(-1))
        entropy.append(-(p * p.clamp_min(1e-30).log()).sum(-1))
        g = mtp.forward_teacher(ids, out.last_hidden)
        rows = positions[positions >= 1]
        agree.append((mtp.logits(g[0, rows]).argmax(-1) == out.logits[0, rows].argmax(-1)).float())
    mean = lambda xs: float(torch.cat(xs).mean()) if xs else float("nan")   # noqa: E731
    return TextObservables(mean(top1), mean(entropy), mean(agree))


def regime_of(target, mtp, workloads: dict[str, list[list[int]]], eos_token_id, max_new_tokens: int,
              batch_size: int, seed: int = 0) -> dict[str, dict[str, float]]:
    """{workload: {observable: value}} (COLUMNS' keys, plus the mean continuation lengths)."""
    decoder = spec_decoder(target, build_proposer("mtp415", target, mtp=mtp), eos_token_id)
    modes = {"greedy": SamplingConfig(), "t1": SamplingConfig(temperature=1.0, verification="target_only")}
    out = {}
    for name, prompts in workloads.items():
        row: dict[str, float] = {}
        for mode, sampling in modes.items():
            res = decoder.generate(prompts, max_new_tokens=max_new_tokens, sampling=sampling, batch_size=batch_size,
                                   seed=seed)
            summary = res.summary()
            seen = observe_text(target, mtp, prompts, res.tokens)
            row[f"top1_{mode}"], row[f"entropy_{mode}"] = seen.top1, seen.entropy
            row[f"mtp_agree_{mode}"] = seen.mtp_agree
            row[f"t1_accept_{mode}"] = float(summary["t1_accept"])
            row[f"mtp415_tau_{mode}"] = float(summary["tau_per_request"])
            row[f"rep4_{mode}"] = sum(repeated_4grams(t) for t in res.tokens) / max(1, len(res.tokens))
            row[f"new_tokens_{mode}"] = sum(len(t) for t in res.tokens) / max(1, len(res.tokens))
        out[name] = row
    return out


def in_band(key: str, value: float) -> str:
    """"" inside the published band, "<" under it, ">" over it, " " where none is published."""
    low, high = BAND.get(key, (None, None))
    if low is None and high is None:
        return " "
    if low is not None and value < low:
        return "<"
    if high is not None and value > high:
        return ">"
    return ""


def regime_table(rows: dict[str, dict[str, float]]) -> str:
    """One line per workload, each figure marked < or > where it falls outside the band, the band below."""
    head = f"{'workload':<11}" + "".join(f"{label:>16}" for _, label in COLUMNS)
    lines = [head, "-" * len(head)]
    for name, row in rows.items():
        cells = "".join(f"{row[k]:>15.3f}{in_band(k, row[k]) or ' ':1}" for k, _ in COLUMNS)
        lines.append(f"{name:<11}" + cells)
    band = "".join(f"{_band_text(k):>16}" for k, _ in COLUMNS)
    lines.append(f"{'band':<11}" + band)
    return "\n".join(lines)


def _band_text(key: str) -> str:
    low, high = BAND.get(key, (None, None))
    if low is None and high is None:
        return "-"
    if high is None:
        return f">= {low:g}"
    if low is None:
        return f"<= {high:g}"
    return f"{low:g}-{high:g}"


__all__ = ["BAND", "COLUMNS", "TextObservables", "in_band", "observe_text", "regime_of", "regime_table",
           "repeated_4grams"]
