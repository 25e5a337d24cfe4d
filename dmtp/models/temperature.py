"""Temperature scaling of logits: the one rule every sampler uses (the decoding loop's, the drafters' own)."""
from __future__ import annotations

import torch
from torch import Tensor

_FLOAT32_TINY = torch.finfo(torch.float32).tiny


def scale_logits(logits: Tensor, temperature: float) -> Tensor:
    """``logits / temperature`` (float32) for any ``temperature > 0``, however small.

    The largest logit is subtracted first, so every scaled value is <= 0 and the largest is exactly 0:
    a tiny temperature sends the others to ``-inf`` (probability 0) instead of overflowing to ``+inf``
    (``inf - inf`` = NaN in the softmax, which sampled the last vocabulary id). The distribution is then
    the greedy one-hot on the argmax (shared equally by exact ties), the limit of softmax(x / T) as T -> 0.
    A temperature below float32's smallest normal number divides as that number (one that rounds to 0 in
    float32 would give 0/0 at the argmax); the result is the same one-hot.
    """
    x = logits.float()
    return (x - x.amax(dim=-1, keepdim=True)) / max(float(temperature), _FLOAT32_TINY)
