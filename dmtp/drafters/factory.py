"""Build a fresh drafter backbone of any registered architecture sized to a target
(`dmtp.drafters.block_drafter.build_block_drafter` pairs it with its injection; conf/drafter/*.yaml configure both)."""
from __future__ import annotations

from dmtp.drafters.dflash import DFlashDrafter, build_target_layer_ids
from dmtp.drafters.registry import architecture_named, build_drafter_from_config
from dmtp.models.rope_config import rope_theta


def mask_token_id_of(tokenizer, vocab_size: int) -> int:
    """The tokenizer's mask token, else the first unused embedding row (the SpecForge order)."""
    if getattr(tokenizer, "mask_token_id", None) is not None:
        return int(tokenizer.mask_token_id)
    if len(tokenizer) < vocab_size:
        return len(tokenizer)
    raise ValueError("the target has no mask token and no unused embedding row; set drafter.mask_token_id")


def build_drafter(target, context_dim: int, mask_token_id: int, num_layers: int = 1,
                  target_layer_ids: list[int] | None = None, num_target_features: int | None = None,
                  block_size: int = 8, layer_types: list[str] | None = None, sliding_window: int | None = None,
                  is_causal: bool | None = None, intermediate_size: int | None = None,
                  architecture: str = "dflash", output_multiplier: float = 1.0, final_logit_softcapping: float = 0.0,
                  init_from_target_layers: bool = False, **architecture_options) -> DFlashDrafter:
    """Same width and heads as the target (its embedding and LM head are reused); `num_layers` deep.
    `architecture`: a registered drafter architecture's name (dmtp.drafters.registry.ARCHITECTURES);
    `architecture_options`: its own config fields (e.g.

    DFlash2's conv_*/selector_*), which its config class checks. `init_from_target_layers`: start each draft layer
    from one of the target's last `num_layers` decoder layers (same names and shapes; the context path starts
    fresh)."""
    arch = architecture_named(architecture)
    unknown = sorted(set(architecture_options) - set(arch.config.option_names()))
    if unknown:
        own = ", ".join(arch.config.option_names()) or "none"
        raise ValueError(f"drafter architecture {architecture!r} has no option {unknown[0]} (its options: {own})")
    cfg = target.config
    n_target = cfg.num_hidden_layers
    target_layer_ids = target_layer_ids_for(target, target_layer_ids, num_target_features)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    # MoE targets have no dense intermediate size; the drafter's MLP stays dense, 3x the width.
    intermediate_size = intermediate_size or getattr(cfg, "intermediate_size", None) or 3 * cfg.hidden_size
    config = arch.config(
        hidden_size=cfg.hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=head_dim, vocab_size=cfg.vocab_size,
        num_target_layers=n_target, target_layer_ids=list(target_layer_ids), mask_token_id=mask_token_id,
        block_size=block_size, context_dim=context_dim, rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=rope_theta(cfg),
        max_position_embeddings=cfg.max_position_embeddings, layer_types=layer_types,
        sliding_window=sliding_window, is_causal=is_causal, output_multiplier=float(output_multiplier),
        final_logit_softcapping=float(final_logit_softcapping or 0.0), **architecture_options)
    drafter = build_drafter_from_config(config)
    if init_from_target_layers:
        copy_target_layers_(drafter, target)
    return drafter


def target_layer_ids_for(target, target_layer_ids: list[int] | None = None,
                         num_target_features: int | None = None) -> list[int]:
    """The target layers a drafter taps: the given ones, else DFlash's spread of `num_target_features`
    (default min(5, target layers - 3)) over the target's depth."""
    if target_layer_ids is not None:
        return list(target_layer_ids)
    n_target = target.config.num_hidden_layers
    return build_target_layer_ids(n_target, num_target_features or min(5, max(1, n_target - 3)))


def copy_target_layers_(drafter, target) -> None:
    """Draft layer i <- target layer (L - n + i): every tensor of the draft layer must exist in the target
    layer under the same name and shape (dense Qwen3/Llama-style targets)."""
    base = getattr(target.hf, "model", None)
    layers = getattr(base, "layers", None)
    n = len(drafter.layers)
    if layers is None or len(layers) < n:
        raise ValueError(f"init_from_target_layers: the target has no {n} decoder layers to copy")
    for draft_layer, source in zip(drafter.layers, list(layers)[-n:]):
        src = source.state_dict()
        own = draft_layer.state_dict()
        bad = [k for k, v in own.items() if k not in src or src[k].shape != v.shape]
        if bad:
            raise ValueError(f"init_from_target_layers: the target's {type(source).__name__} has no tensor {bad[0]} "
                             f"of shape {tuple(own[bad[0]].shape)}")
        draft_layer.load_state_dict({k: src[k].detach().clone() for k in own}, strict=True)
