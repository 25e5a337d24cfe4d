"""Whether a drafter fits what it is paired with: the target (it runs on the target's hidden states,
embedding and LM head, and its target_layer_ids index the target's layers) and the injection (its fc
reads the context the injection builds).

One rule and one message per mismatch, wherever a drafter meets a target or an injection (building, training,
init_from, loading for decoding)."""
from __future__ import annotations


def require_target_fit(drafter_config, target, what: str = "drafter") -> None:
    """The same width, vocabulary and depth as the target it runs on."""
    mine = (drafter_config.hidden_size, drafter_config.vocab_size, drafter_config.num_target_layers)
    theirs = (target.hidden_size, target.config.vocab_size, target.num_layers)
    if mine != theirs:
        describe = "hidden size {}, vocab {}, {} layers".format
        raise ValueError(f"{what} was built for a different target ({describe(*mine)}) than "
                         f"{getattr(target, 'path', 'this one')} ({describe(*theirs)})")


def require_context_width(drafter_config, injection, what: str = "drafter") -> None:
    if drafter_config.context_dim != injection.context_dim:
        raise ValueError(f"{what} has context width {drafter_config.context_dim} (its fc input), but the "
                         f"injection {type(injection).__name__} builds {injection.context_dim}")


def require_block_fit(drafter_config, injection, what: str = "drafter") -> None:
    """The injection's blocks are at most the width the drafter was trained with (a shorter verified
    block is allowed at decoding time, as the reference package's block_size= allows; a longer one
    would put slots at offsets the drafter never saw)."""
    if injection.block_size > drafter_config.block_size:
        raise ValueError(f"{what} was trained with block_size {drafter_config.block_size}: it can verify a "
                         f"block of 2..{drafter_config.block_size}, not {injection.block_size}")
