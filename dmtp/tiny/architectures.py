"""The embedded targets' architectures: transformers' own causal-LM class of the family, and the
family's native MTP layer built exactly as `dmtp.families.mtp_loading` builds it from the saved
config, so the MTP that is pretrained is the one the strict loader reads back.

    qwen3         Qwen3ForCausalLM, a plain Qwen3 decoder layer as the MTP block (`tiny`, `micro`)
    qwen3_5_text  Qwen3_5ForCausalLM, the Qwen3.5 MTP block (`tiny_hybrid`, `micro_hybrid`)
"""
from __future__ import annotations

from transformers import PreTrainedModel, Qwen3_5ForCausalLM, Qwen3_5TextConfig, Qwen3Config, \
    Qwen3ForCausalLM

from dmtp.families.catalogue import mtp_family_of
from dmtp.families.mtp_loading import build_native_mtp
from dmtp.models.mtp import NativeMTP
from dmtp.models.qwen3 import init_linear_
from dmtp.tiny.presets import HybridPreset, TinyPreset


def _common(preset: TinyPreset, vocab_size: int, eos_id: int) -> dict:
    return dict(vocab_size=vocab_size, hidden_size=preset.hidden_size, intermediate_size=preset.intermediate_size,
                num_hidden_layers=preset.num_layers, num_attention_heads=preset.num_heads,
                num_key_value_heads=preset.num_kv_heads, head_dim=preset.head_dim, max_position_embeddings=4096,
                rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=eos_id, eos_token_id=eos_id,
                pad_token_id=eos_id, attn_implementation="sdpa")


def _qwen3(preset: TinyPreset, vocab_size: int, eos_id: int) -> PreTrainedModel:
    return Qwen3ForCausalLM(Qwen3Config(**_common(preset, vocab_size, eos_id)))


def _qwen3_5_text(preset: HybridPreset, vocab_size: int, eos_id: int) -> PreTrainedModel:
    # layer_types, gating, partial rotary and norms: the config's defaults for the family.
    return Qwen3_5ForCausalLM(Qwen3_5TextConfig(
        **_common(preset, vocab_size, eos_id), linear_num_key_heads=preset.linear_num_key_heads,
        linear_num_value_heads=preset.linear_num_value_heads, linear_key_head_dim=preset.linear_key_head_dim,
        linear_value_head_dim=preset.linear_value_head_dim))


ARCHITECTURES = {"qwen3": _qwen3, "qwen3_5_text": _qwen3_5_text}


def build_model(preset: TinyPreset, vocab_size: int, eos_id: int) -> tuple[PreTrainedModel, NativeMTP]:
    """A freshly initialised target of the preset's architecture and its native MTP layer."""
    model = ARCHITECTURES[preset.architecture](preset, vocab_size, eos_id)
    cfg = model.config.to_dict()
    mtp = build_native_mtp(mtp_family_of(cfg["model_type"]), cfg, model.model.embed_tokens, model.lm_head)
    init_linear_(mtp)
    return model, mtp
