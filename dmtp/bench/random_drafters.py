"""Untrained drafters sized like published ones, for timing at real shapes (acceptance meaningless):
the presets, the options that size them, the mask token they use, and a sliding-window copy of a drafter."""
from __future__ import annotations

import argparse
import copy

from dmtp.drafters.block_drafter import fresh_drafter_for
from dmtp.drafters.dflash import SLIDING


def random_drafter_mask_id(tok, target) -> int:
    """The mask token of an untrained drafter: the tokenizer's `<|mask|>` where it has one, else the last id."""
    return tok.convert_tokens_to_ids("<|mask|>") if "<|mask|>" in tok.get_vocab() else target.config.vocab_size - 1


# Random drafters sized like published ones (timings real, acceptance meaningless): layers, tapped target
# layers, block. dflash-qwen3-8b is z-lab's Qwen3-8B DFlash drafter (reference/real-scale.md); plumbing is
# the old fixed size (1 layer, 1 tap, block 8).
RANDOM_DRAFTER_PRESETS = {
    "dflash-qwen3-8b": {"num_layers": 5, "num_target_features": 5, "block_size": 16},
    "plumbing": {"num_layers": 1, "num_target_features": 1, "block_size": 8},
}


def add_random_drafter_size_args(ap: argparse.ArgumentParser) -> None:
    """The options that size random drafters (bench_decode and bench_peer)."""
    ap.add_argument("--random-drafter-preset", default="plumbing", choices=sorted(RANDOM_DRAFTER_PRESETS),
                    help="size of random drafters: a published drafter's (dflash-qwen3-8b: 5 layers, 5 taps, "
                         "block 16) or plumbing (1, 1, 8); the three options below override it")
    ap.add_argument("--random-drafter-layers", type=int, default=None, help="drafter layers of random drafters")
    ap.add_argument("--random-drafter-taps", type=int, default=None, help="tapped target layers of random drafters")
    ap.add_argument("--random-block-size", type=int, default=None, help="block size of random drafters")


def random_drafter_size(args, ap: argparse.ArgumentParser, target_layers: int | None = None) -> dict:
    """The preset's size with the explicit options applied; a bad value is a one-line usage error."""
    size = dict(RANDOM_DRAFTER_PRESETS[args.random_drafter_preset])
    for key, value in (("num_layers", args.random_drafter_layers), ("num_target_features", args.random_drafter_taps),
                       ("block_size", args.random_block_size)):
        if value is not None:
            size[key] = value
    if size["num_layers"] < 1 or size["num_target_features"] < 1:
        ap.error(f"random drafters need at least 1 layer and 1 tap, got {size['num_layers']} and {size['num_target_features']}")
    if not 2 <= size["block_size"] <= 64:
        ap.error(f"--random-block-size must be in 2..64, got {size['block_size']}")
    if target_layers is not None and size["num_target_features"] > target_layers:
        ap.error(f"--random-drafter-taps {size['num_target_features']} exceeds the target's {target_layers} layers")
    return size


def random_drafter(target, name: str, mask_token_id: int, device, dtype, seed: int = 0, size: dict | None = None):
    """A freshly initialised `name` drafter for `target` (same seed, same weights), and its label."""
    return fresh_drafter_for(target, name, mask_token_id, seed=seed, **(size or {})).to(device, dtype), name


def windowed(drafter, window: int):
    """A copy of `drafter` (same weights) whose every layer is a sliding-window layer of `window`, its block
    attention as before (bidirectional unless the drafter was causal)."""
    out = copy.deepcopy(drafter)
    c = out.backbone.config
    causal = [c.is_causal_for(i) for i in range(c.num_hidden_layers)]
    c.layer_types = [SLIDING] * c.num_hidden_layers
    c.sliding_window = window
    c.is_causal = causal[0] if len(set(causal)) == 1 else None
    return out
