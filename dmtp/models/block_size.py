"""The verified block's width: the one bound every layer checks (the drafters' configs, the injection
variants' slot layouts, the decoding loop's buffers)."""
from __future__ import annotations

# The block widths the code honours: B = 2 (one candidate) up to 32 slots (K = B - 1 candidates verified
# per round). The width itself is each drafter's `block_size` (its config and checkpoint), never a constant.
BLOCK_SIZE_RANGE = (2, 32)


def require_block_size(value, what: str = "block_size") -> int:
    """`value` as the block width, or one line saying why the code cannot honour it."""
    low, high = BLOCK_SIZE_RANGE
    if type(value) is not int or not low <= value <= high:
        raise ValueError(f"{what} must be an integer in {low}..{high} (the verified block: A and {low - 1}.."
                         f"{high - 1} candidates), got {value!r}")
    return value


__all__ = ["BLOCK_SIZE_RANGE", "require_block_size"]
