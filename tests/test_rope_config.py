"""One reading of a Hugging Face config's rotary settings (transformers 5 `rope_parameters`, older
`rope_scaling` + top-level `rope_theta`), with transformers' own default."""
from __future__ import annotations

import pytest
from transformers import AutoConfig

from dmtp.drafters.dflash import DFlashConfig
from dmtp.families.catalogue import mtp_family_of
from dmtp.models.rope_config import DEFAULT_ROPE_THETA, rope_parameters, rope_theta, rope_type


@pytest.mark.parametrize("config,theta,kind", [
    ({"rope_parameters": {"rope_theta": 5e5, "rope_type": "yarn", "factor": 4.0}}, 5e5, "yarn"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}, "rope_theta": 1e6}, 1e6, "linear"),
    ({"rope_theta": 2e4}, 2e4, "default"),
    ({}, DEFAULT_ROPE_THETA, "default"),
    ({"rope_parameters": None, "rope_scaling": None}, DEFAULT_ROPE_THETA, "default"),
])
def test_rope_settings_from_a_config_dict(config, theta, kind):
    assert rope_theta(config) == theta and rope_type(config) == kind


@pytest.mark.parametrize("model_type", ["qwen3", "qwen3_next", "deepseek_v3", "glm4_moe"])
def test_default_base_is_transformers_own(model_type):
    """A config that names no base gets the one transformers gives the family, from the object or its dict."""
    hf = AutoConfig.for_model(model_type)
    assert rope_theta(hf) == hf.rope_parameters["rope_theta"] == DEFAULT_ROPE_THETA
    assert rope_parameters(hf) == hf.rope_parameters
    bare = {k: v for k, v in hf.to_dict().items() if k not in ("rope_parameters", "rope_scaling", "rope_theta")}
    assert rope_theta(bare) == DEFAULT_ROPE_THETA


def test_mtp_spec_and_drafter_config_read_the_same_base():
    cfg = {"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128,
           "rope_parameters": {"rope_theta": 123456.0, "rope_type": "default"}}
    assert mtp_family_of("qwen3").mtp_spec(cfg).rope_theta == 123456.0
    drafter = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
               "num_key_value_heads": 4, "head_dim": 16, "vocab_size": 100, "num_target_layers": 4,
               "dflash_config": {"mask_token_id": 3, "target_layer_ids": [1]}, "block_size": 8}
    assert DFlashConfig.from_hf_config({**drafter, "rope_parameters": cfg["rope_parameters"]}).rope_theta == 123456.0
    assert DFlashConfig.from_hf_config(drafter).rope_theta == DEFAULT_ROPE_THETA
