"""Named real models' shapes for random-weight benchmark targets (`dmtp.tiny.random_target`), and the
small versions of each that tests write on CPU.

Each shape is a transformers config of the family (`model_type`, read by transformers' own class) plus
how the family stores its native MTP:
    mtp_apart   `mtp.*` in mtp.safetensors beside the shards, unlisted by the index (the embedded dense
                targets' layout: engines loading the causal LM alone see no MTP tensor)
    mtp_listed  `mtp.*` inside the shards, listed by the index (the Qwen3.5 / Qwen3.6 releases)
    next_layer  `model.layers.{num_hidden_layers}.*` (DeepSeek-V3 / GLM-4.5: one decoder layer past the
                last, plus eh_proj / enorm / hnorm / shared_head), listed by the index

Shapes: Qwen3-8B from its release config (the one reference/real-scale.md measured). The Qwen3.5/3.6
hybrid is the 27B dense hybrid as recalled from its release (hidden 5120, 64 layers, 3 gated-DeltaNet
: 1 gated-attention, 24/4 heads x 256, DeltaNet 16 key / 48 value heads x 128, vocab 248320): check it
against the release's config.json before quoting a figure as "Qwen3.6-27B". DeepSeek-V3 is its release
width (MLA, 256 routed experts + 1 shared, 8 per token, yarn x40) reduced in depth: 3 dense layers + 1
MoE layer by default (the MTP layer alone is a full MoE layer, ~11.5B parameters).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RealShape:
    name: str
    model_type: str
    mtp_layout: str                 # mtp_apart | mtp_listed | next_layer
    config: dict
    tiny: dict = field(default_factory=dict)   # overrides for the CPU-sized version (--tiny)
    note: str = ""


QWEN3_8B = RealShape(
    "qwen3-8b", "qwen3", "mtp_apart",
    dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
         intermediate_size=12288, vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0,
         rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False, hidden_act="silu"),
    tiny=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              intermediate_size=128, vocab_size=4096),
    note="Qwen3-8B (release config); MTP: one Qwen3 decoder layer of the same width, as the embedded targets'")

QWEN3_5_27B = RealShape(
    "qwen3.5-27b", "qwen3_5_text", "mtp_listed",
    dict(hidden_size=5120, num_hidden_layers=64, num_attention_heads=24, num_key_value_heads=4, head_dim=256,
         intermediate_size=17408, vocab_size=248320, max_position_embeddings=262144, rms_norm_eps=1e-6,
         tie_word_embeddings=False, linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128,
         linear_value_head_dim=128, linear_conv_kernel_dim=4, hidden_act="silu"),
    tiny=dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              intermediate_size=128, vocab_size=4096, linear_num_key_heads=2, linear_num_value_heads=4,
              linear_key_head_dim=16, linear_value_head_dim=16),
    note="Qwen3.5/3.6 27B-class dense hybrid (shapes as recalled; check the release config); MTP: the Qwen3.5 block")

DEEPSEEK_V3 = RealShape(
    "deepseek-v3", "deepseek_v3", "next_layer",
    dict(hidden_size=7168, num_hidden_layers=4, num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536,
         kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, intermediate_size=18432,
         moe_intermediate_size=2048, n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8,
         first_k_dense_replace=3, n_group=8, topk_group=4, routed_scaling_factor=2.5, norm_topk_prob=True,
         vocab_size=129280, max_position_embeddings=163840, rms_norm_eps=1e-6, tie_word_embeddings=False,
         num_nextn_predict_layers=1, hidden_act="silu",
         rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                          "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
                          "mscale": 1.0, "mscale_all_dim": 1.0}),
    tiny=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=24,
              kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, intermediate_size=40,
              moe_intermediate_size=12, n_routed_experts=8, num_experts_per_tok=2, first_k_dense_replace=1,
              n_group=2, topk_group=1, vocab_size=4096, max_position_embeddings=4096,
              rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                               "original_max_position_embeddings": 512, "beta_fast": 32, "beta_slow": 1,
                               "mscale": 1.0, "mscale_all_dim": 1.0}),
    note="DeepSeek-V3 width (MLA + 256-expert MoE), depth reduced to 3 dense + 1 MoE layer; MTP at model.layers.{L}")

SHAPES = {s.name: s for s in (QWEN3_8B, QWEN3_5_27B, DEEPSEEK_V3)}


def shape_config(name: str, tiny: bool = False, layers: int | None = None, overrides: dict | None = None) -> dict:
    """The config dict of shape `name`: its real values, the small ones with `tiny`, then `layers`
    (num_hidden_layers) and any other `overrides` (config keys)."""
    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}; known: {', '.join(SHAPES)}")
    shape = SHAPES[name]
    cfg = dict(shape.config)
    if tiny:
        cfg.update(shape.tiny)
    if layers is not None:
        if layers < 1:
            raise ValueError(f"--layers must be at least 1, got {layers}")
        cfg["num_hidden_layers"] = layers
    cfg.update(overrides or {})
    return cfg


__all__ = ["RealShape", "SHAPES", "shape_config"]
