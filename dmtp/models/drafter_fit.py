"""Whether a drafter fits what it is paired with: the target's width (it runs on the target's hidden
states, embedding and LM head) and the injection's context width (its fc reads what the injection
builds). One message per mismatch, wherever a drafter is paired (training, decoding, init_from)."""
from __future__ import annotations


def require_target_width(drafter_config, target, what: str = "drafter") -> None:
    if drafter_config.hidden_size != target.hidden_size:
        raise ValueError(f"{what} has hidden size {drafter_config.hidden_size}, but the target's is "
                         f"{target.hidden_size}")


def require_context_width(drafter_config, injection, what: str = "drafter") -> None:
    if drafter_config.context_dim != injection.context_dim:
        raise ValueError(f"{what} has context width {drafter_config.context_dim} (its fc input), but the "
                         f"injection {type(injection).__name__} builds {injection.context_dim}")
