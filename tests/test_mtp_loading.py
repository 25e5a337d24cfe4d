"""Strict native-MTP loading for every supported family, on tiny random checkpoints written here.

Each checkpoint uses the real layout of its family (config.json of the real model_type, real tensor
names, sharded index for Qwen3.5, `model.language_model.*` multimodal prefix, FP8 block scales for
DeepSeek-V3) plus some main-model tensors the loader must ignore. For each family the tests check:
strict loading (every MTP tensor consumed, none missing), key coverage by value, the forward against
an independent computation (Qwen: the equations written out below; DeepSeek/GLM: transformers' own
decoder layer called directly), and incremental rows with the cache == teacher-forced.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from dmtp.families.mtp_loading import MTPLoadError, load_native_mtp
from dmtp.models.mtp_checkpoint import dequantize_fp8

V = 50          # vocab of every tiny checkpoint
T = 8           # sequence length of the forward checks (MTP rows 1..T-1)




# ----------------------------------------------------------------------------------------------------
# Checkpoint writing
# ----------------------------------------------------------------------------------------------------

def _rand(*shape, scale=None):
    scale = scale if scale is not None else 1.0 / math.sqrt(shape[-1])
    return (torch.randn(*shape) * scale).contiguous()


def _norm_w(n, zero_centered):
    w = 0.1 * torch.randn(n)
    return w if zero_centered else 1.0 + w


def write_checkpoint(root, config: dict, tensors: dict, shards: int = 1):
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config))
    if shards == 1:
        save_file(tensors, str(root / "model.safetensors"))
        return root
    keys = sorted(tensors)
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: tensors[k] for k in keys[i::shards]}
        save_file(part, str(root / name))
        weight_map.update({k: name for k in part})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                   "weight_map": weight_map}))
    return root


def fp8_quantize(w: torch.Tensor, block: tuple[int, int]):
    """Block-wise float8_e4m3fn quantisation (DeepSeek-V3 style): returns (fp8 weight, scale_inv)."""
    br, bc = block
    rows, cols = w.shape
    nr, nc = -(-rows // br), -(-cols // bc)
    scale = torch.empty(nr, nc)
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    for i in range(nr):
        for j in range(nc):
            blk = w[i * br:(i + 1) * br, j * bc:(j + 1) * bc]
            s = blk.abs().max().clamp_min(1e-12) / 448.0
            scale[i, j] = s
            q[i * br:(i + 1) * br, j * bc:(j + 1) * bc] = (blk / s).to(torch.float8_e4m3fn)
    return q, scale


def fp8_reference_dequant(q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    out = q.float().clone()
    for r in range(q.shape[0]):
        for c in range(q.shape[1]):
            out[r, c] *= scale[r // block[0], c // block[1]]
    return out


def shared_modules(tensors, embed_key, head_key):
    embed = nn.Embedding.from_pretrained(tensors[embed_key].float().clone(), freeze=True)
    head = nn.Linear(embed.embedding_dim, embed.num_embeddings, bias=False)
    head.weight.data.copy_(tensors[head_key])
    return embed, head


# ----------------------------------------------------------------------------------------------------
# Qwen3.5 / Qwen3.6 / Qwen3-Next
# ----------------------------------------------------------------------------------------------------

QH, QNH, QNKV, QDH, QI = 32, 4, 2, 16, 48           # hidden, heads, kv heads, head_dim, dense intermediate
QE, QK, QIM, QIS = 6, 2, 12, 20                       # experts, top-k, expert / shared intermediate
Q_PARTIAL, Q_THETA, Q_EPS = 0.25, 10000.0, 1e-6


def qwen_text_config(model_type: str, moe: bool) -> dict:
    cfg = {"model_type": model_type, "hidden_size": QH, "num_attention_heads": QNH, "num_key_value_heads": QNKV,
           "head_dim": QDH, "num_hidden_layers": 4, "rms_norm_eps": Q_EPS, "vocab_size": V, "hidden_act": "silu",
           "attention_bias": False, "tie_word_embeddings": False, "max_position_embeddings": 256,
           "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"]}
    if model_type == "qwen3_next":
        cfg.update(rope_theta=Q_THETA, partial_rotary_factor=Q_PARTIAL, rope_scaling=None, num_nextn_predict_layers=1,
                   full_attention_interval=4, decoder_sparse_step=1, mlp_only_layers=[], intermediate_size=QI * 2)
    else:
        cfg.update(rope_parameters={"rope_type": "default", "rope_theta": Q_THETA, "partial_rotary_factor": Q_PARTIAL,
                                    "mrope_section": [1, 1, 0], "mrope_interleaved": True},
                   mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False)
        if not moe:
            cfg["intermediate_size"] = QI
    if moe:
        cfg.update(num_experts=QE, num_experts_per_tok=QK, moe_intermediate_size=QIM,
                   shared_expert_intermediate_size=QIS, norm_topk_prob=True)
    return cfg


def qwen_mtp_tensors(moe: bool, packed: bool) -> dict:
    L = "mtp.layers.0."
    t = {"mtp.fc.weight": _rand(QH, 2 * QH), "mtp.pre_fc_norm_embedding.weight": _norm_w(QH, True),
         "mtp.pre_fc_norm_hidden.weight": _norm_w(QH, True), "mtp.norm.weight": _norm_w(QH, True),
         L + "input_layernorm.weight": _norm_w(QH, True), L + "post_attention_layernorm.weight": _norm_w(QH, True),
         L + "self_attn.q_proj.weight": _rand(2 * QNH * QDH, QH), L + "self_attn.k_proj.weight": _rand(QNKV * QDH, QH),
         L + "self_attn.v_proj.weight": _rand(QNKV * QDH, QH), L + "self_attn.o_proj.weight": _rand(QH, QNH * QDH),
         L + "self_attn.q_norm.weight": _norm_w(QDH, True), L + "self_attn.k_norm.weight": _norm_w(QDH, True)}
    if not moe:
        t.update({L + "mlp.gate_proj.weight": _rand(QI, QH), L + "mlp.up_proj.weight": _rand(QI, QH),
                  L + "mlp.down_proj.weight": _rand(QH, QI)})
        return t
    t[L + "mlp.gate.weight"] = _rand(QE, QH, scale=1.0)
    if packed:
        t[L + "mlp.experts.gate_up_proj"] = _rand(QE, 2 * QIM, QH)
        t[L + "mlp.experts.down_proj"] = _rand(QE, QH, QIM)
    else:
        for e in range(QE):
            t[L + f"mlp.experts.{e}.gate_proj.weight"] = _rand(QIM, QH)
            t[L + f"mlp.experts.{e}.up_proj.weight"] = _rand(QIM, QH)
            t[L + f"mlp.experts.{e}.down_proj.weight"] = _rand(QH, QIM)
    t.update({L + "mlp.shared_expert.gate_proj.weight": _rand(QIS, QH), L + "mlp.shared_expert.up_proj.weight": _rand(QIS, QH),
              L + "mlp.shared_expert.down_proj.weight": _rand(QH, QIS), L + "mlp.shared_expert_gate.weight": _rand(1, QH)})
    return t


def write_qwen(root, model_type: str, moe: bool, packed: bool = False, multimodal: bool = True, shards: int = 2,
               seed: int = 0, mtp: bool = True):
    """Qwen3.5/3.6 multimodal layout (`model.language_model.*`, `model.visual.*`, text_config) or a
    Qwen3-Next text-only layout (`model.*`); MTP at top-level `mtp.*`."""
    torch.manual_seed(seed)
    text = qwen_text_config(model_type + ("_text" if multimodal else ""), moe)
    if multimodal:
        config = {"architectures": [("Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration")],
                  "model_type": model_type, "text_config": text, "tie_word_embeddings": False,
                  "vision_config": {"model_type": model_type + "_vision", "hidden_size": 16, "depth": 1}}
        prefix = "model.language_model."
        main = {"model.visual.patch_embed.proj.weight": _rand(16, 3, 2, 2, 2), "model.visual.blocks.0.norm1.weight": _rand(16)}
    else:
        config = dict(text, architectures=["Qwen3NextForCausalLM"])
        prefix, main = "model.", {}
    main.update({prefix + "embed_tokens.weight": _rand(V, QH, scale=1.0), prefix + "norm.weight": _norm_w(QH, True),
                 prefix + "layers.0.linear_attn.in_proj_qkv.weight": _rand(24, QH),
                 prefix + "layers.3.self_attn.q_proj.weight": _rand(2 * QNH * QDH, QH), "lm_head.weight": _rand(V, QH)})
    tensors = {**main, **(qwen_mtp_tensors(moe, packed) if mtp else {})}
    write_checkpoint(root, config, tensors, shards=shards)
    return config, text, tensors, prefix + "embed_tokens.weight"


def _zc_norm(x, w, eps=Q_EPS):
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w.double())


def _neox_rope(x, pos: int, rotary: int, theta: float):
    """Rotate the first `rotary` dims of a head vector (rotate_half pairing i <-> i + rotary/2)."""
    half = rotary // 2
    inv = theta ** (-torch.arange(0, rotary, 2, dtype=torch.float64) / rotary)
    c, s = torch.cos(pos * inv), torch.sin(pos * inv)
    x1, x2 = x[:half], x[half:rotary]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, x[rotary:]])


def _swiglu(x, gate, up, down):
    return down.double() @ (F.silu(gate.double() @ x) * (up.double() @ x))


def qwen_reference(t: dict, text: dict, embed_w, tokens, prev_hidden, positions):
    """The Qwen3.5 MTP equations, row by row in float64. tokens [R], prev_hidden [R,H], positions [R];
    row i attends causally to rows 0..i."""
    W = lambda n: t["mtp." + n].double()
    L = "layers.0."
    R = len(tokens)
    u = torch.cat([_zc_norm(embed_w[tokens], W("pre_fc_norm_embedding.weight")),
                   _zc_norm(prev_hidden, W("pre_fc_norm_hidden.weight"))], -1) @ W("fc.weight").T
    a = _zc_norm(u, W(L + "input_layernorm.weight"))
    qg = (a @ W(L + "self_attn.q_proj.weight").T).view(R, QNH, 2 * QDH)
    q, gate = qg[..., :QDH], qg[..., QDH:]
    q = _zc_norm(q, W(L + "self_attn.q_norm.weight"))
    k = _zc_norm((a @ W(L + "self_attn.k_proj.weight").T).view(R, QNKV, QDH), W(L + "self_attn.k_norm.weight"))
    v = (a @ W(L + "self_attn.v_proj.weight").T).view(R, QNKV, QDH)
    rotary = int(QDH * Q_PARTIAL)
    attn = torch.zeros(R, QNH, QDH, dtype=torch.float64)
    for i in range(R):
        for h in range(QNH):
            kvh = h // (QNH // QNKV)
            qi = _neox_rope(q[i, h], int(positions[i]), rotary, Q_THETA)
            scores = torch.stack([qi @ _neox_rope(k[j, kvh], int(positions[j]), rotary, Q_THETA) for j in range(i + 1)])
            p = torch.softmax(scores / math.sqrt(QDH), 0)
            attn[i, h] = (p[:, None] * v[: i + 1, kvh]).sum(0)
    gated = attn.reshape(R, -1) * torch.sigmoid(gate.reshape(R, -1))
    u1 = u + gated @ W(L + "self_attn.o_proj.weight").T
    m = _zc_norm(u1, W(L + "post_attention_layernorm.weight"))
    mlp = torch.zeros_like(m)
    for i in range(R):
        x = m[i]
        if "mtp." + L + "mlp.gate.weight" not in t:
            mlp[i] = _swiglu(x, W(L + "mlp.gate_proj.weight"), W(L + "mlp.up_proj.weight"), W(L + "mlp.down_proj.weight"))
            continue
        probs = torch.softmax(W(L + "mlp.gate.weight") @ x, 0)
        top_w, top_i = torch.topk(probs, QK)
        top_w = top_w / top_w.sum()
        for w, e in zip(top_w.tolist(), top_i.tolist()):
            if "mtp." + L + "mlp.experts.gate_up_proj" in t:
                gu, dn = W(L + "mlp.experts.gate_up_proj")[e], W(L + "mlp.experts.down_proj")[e]
                mlp[i] += w * _swiglu(x, gu[:QIM], gu[QIM:], dn)
            else:
                ex = L + f"mlp.experts.{e}."
                mlp[i] += w * _swiglu(x, W(ex + "gate_proj.weight"), W(ex + "up_proj.weight"), W(ex + "down_proj.weight"))
        se = L + "mlp.shared_expert."
        shared = _swiglu(x, W(se + "gate_proj.weight"), W(se + "up_proj.weight"), W(se + "down_proj.weight"))
        mlp[i] += torch.sigmoid(W(L + "mlp.shared_expert_gate.weight")[0] @ x) * shared
    return _zc_norm(u1 + mlp, W("norm.weight"))


# ----------------------------------------------------------------------------------------------------
# DeepSeek-V3 / GLM-4-MoE
# ----------------------------------------------------------------------------------------------------

DH, DLAYERS, DE, DIM = 32, 2, 8, 12                   # hidden, main layers (MTP = layer 2), experts, expert inter.
FP8_BLOCK = (16, 16)
# Quantised in the DeepSeek checkpoint: full blocks, ragged blocks on both axes, an expert and eh_proj.
FP8_KEYS = ("eh_proj.weight", "self_attn.q_b_proj.weight", "self_attn.kv_b_proj.weight",
            "mlp.experts.0.gate_proj.weight", "mlp.experts.5.down_proj.weight", "mlp.shared_experts.up_proj.weight")


def deepseek_config() -> dict:
    return {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": DH,
            "num_hidden_layers": DLAYERS, "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 24,
            "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "n_routed_experts": DE,
            "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "n_shared_experts": 1,
            "moe_intermediate_size": DIM, "intermediate_size": 40, "first_k_dense_replace": 1,
            "routed_scaling_factor": 2.5, "norm_topk_prob": True, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
            "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "beta_fast": 32,
                             "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
            "max_position_embeddings": 128, "vocab_size": V, "num_nextn_predict_layers": 1, "hidden_act": "silu",
            "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                    "weight_block_size": list(FP8_BLOCK)}}


def glm_config() -> dict:
    return {"architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "hidden_size": DH, "head_dim": 16,
            "num_hidden_layers": DLAYERS, "num_attention_heads": 4, "num_key_value_heads": 2,
            "partial_rotary_factor": 0.5, "use_qk_norm": True, "attention_bias": True, "n_routed_experts": DE,
            "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "n_shared_experts": 1,
            "moe_intermediate_size": DIM, "intermediate_size": 40, "first_k_dense_replace": 1,
            "routed_scaling_factor": 2.5, "norm_topk_prob": True, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0,
            "max_position_embeddings": 128, "vocab_size": V, "num_nextn_predict_layers": 1, "hidden_act": "silu",
            "tie_word_embeddings": False}


def _moe_tensors(packed: bool) -> dict:
    t = {"mlp.gate.weight": _rand(DE, DH, scale=1.0), "mlp.gate.e_score_correction_bias": 0.1 * torch.randn(DE),
         "mlp.shared_experts.gate_proj.weight": _rand(DIM, DH), "mlp.shared_experts.up_proj.weight": _rand(DIM, DH),
         "mlp.shared_experts.down_proj.weight": _rand(DH, DIM)}
    if packed:
        t["mlp.experts.gate_up_proj"] = _rand(DE, 2 * DIM, DH)
        t["mlp.experts.down_proj"] = _rand(DE, DH, DIM)
    else:
        for e in range(DE):
            t.update({f"mlp.experts.{e}.gate_proj.weight": _rand(DIM, DH), f"mlp.experts.{e}.up_proj.weight": _rand(DIM, DH),
                      f"mlp.experts.{e}.down_proj.weight": _rand(DH, DIM)})
    return t


def deepseek_layer_tensors(cfg: dict, family: str, packed: bool) -> dict:
    """The MTP layer's tensors relative to `model.layers.{L}.`, in the released naming."""
    t = {"embed_tokens.weight": _rand(V, DH, scale=1.0), "enorm.weight": _norm_w(DH, False),
         "hnorm.weight": _norm_w(DH, False), "eh_proj.weight": _rand(DH, 2 * DH),
         "shared_head.norm.weight": _norm_w(DH, False), "shared_head.head.weight": _rand(V, DH),
         "input_layernorm.weight": _norm_w(DH, False), "post_attention_layernorm.weight": _norm_w(DH, False)}
    nh = cfg["num_attention_heads"]
    if family == "deepseek_v3":
        qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
        t.update({"self_attn.q_a_proj.weight": _rand(cfg["q_lora_rank"], DH),
                  "self_attn.q_a_layernorm.weight": _norm_w(cfg["q_lora_rank"], False),
                  "self_attn.q_b_proj.weight": _rand(nh * qk, cfg["q_lora_rank"]),
                  "self_attn.kv_a_proj_with_mqa.weight": _rand(cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"], DH),
                  "self_attn.kv_a_layernorm.weight": _norm_w(cfg["kv_lora_rank"], False),
                  "self_attn.kv_b_proj.weight": _rand(nh * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]), cfg["kv_lora_rank"]),
                  "self_attn.o_proj.weight": _rand(DH, nh * cfg["v_head_dim"])})
    else:
        d, nkv = cfg["head_dim"], cfg["num_key_value_heads"]
        t.update({"self_attn.q_proj.weight": _rand(nh * d, DH), "self_attn.q_proj.bias": 0.1 * torch.randn(nh * d),
                  "self_attn.k_proj.weight": _rand(nkv * d, DH), "self_attn.k_proj.bias": 0.1 * torch.randn(nkv * d),
                  "self_attn.v_proj.weight": _rand(nkv * d, DH), "self_attn.v_proj.bias": 0.1 * torch.randn(nkv * d),
                  "self_attn.o_proj.weight": _rand(DH, nh * d),
                  "self_attn.q_norm.weight": _norm_w(d, False), "self_attn.k_norm.weight": _norm_w(d, False)})
    t.update(_moe_tensors(packed))
    return t


def write_deepseek(root, family: str, packed: bool = False, seed: int = 0):
    """Returns (config, checkpoint tensors, dequantised MTP-layer tensors relative to the layer prefix)."""
    torch.manual_seed(seed)
    cfg = deepseek_config() if family == "deepseek_v3" else glm_config()
    layer = deepseek_layer_tensors(cfg, family, packed)
    prefix = f"model.layers.{DLAYERS}."
    tensors = {"model.embed_tokens.weight": layer["embed_tokens.weight"].clone(), "model.norm.weight": _norm_w(DH, False),
               "lm_head.weight": layer["shared_head.head.weight"].clone(),
               "model.layers.0.input_layernorm.weight": _norm_w(DH, False),
               "model.layers.1.mlp.experts.0.gate_proj.weight": _rand(DIM, DH)}
    dequant = dict(layer)
    for name, w in layer.items():
        if family == "deepseek_v3" and name in FP8_KEYS:
            q, s = fp8_quantize(w, FP8_BLOCK)
            tensors[prefix + name], tensors[prefix + name + "_scale_inv"] = q, s
            dequant[name] = fp8_reference_dequant(q, s, FP8_BLOCK)
        else:
            tensors[prefix + name] = w
    if family == "deepseek_v3":  # a main-layer FP8 pair the MTP loader must ignore
        q, s = fp8_quantize(tensors["model.layers.1.mlp.experts.0.gate_proj.weight"], FP8_BLOCK)
        tensors["model.layers.1.mlp.experts.0.gate_proj.weight"] = q
        tensors["model.layers.1.mlp.experts.0.gate_proj.weight_scale_inv"] = s
    write_checkpoint(root, cfg, tensors, shards=2)
    return cfg, tensors, dequant


_DS_RENAMES = {"eh_proj.": "fc.", "enorm.": "pre_fc_norm_embedding.", "hnorm.": "pre_fc_norm_hidden.",
               "shared_head.norm.": "norm."}


def deepseek_param_name(rest: str) -> str | None:
    """Where a `model.layers.{L}.<rest>` tensor must land in NativeMTP (None: skipped duplicate)."""
    if rest.startswith(("embed_tokens.", "shared_head.head.")):
        return None
    for old, new in _DS_RENAMES.items():
        if rest.startswith(old):
            return new + rest[len(old):]
    return "layers.0." + rest


def hf_reference_layer(family: str, cfg: dict, layer: dict):
    """transformers' decoder layer + rotary embedding, loaded directly (experts packed as transformers wants)."""
    if family == "deepseek_v3":
        from transformers import DeepseekV3Config as C
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer as Layer
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding as Rotary
    else:
        from transformers import Glm4MoeConfig as C
        from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeDecoderLayer as Layer
        from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeRotaryEmbedding as Rotary
    config = C(**{k: v for k, v in cfg.items() if k != "quantization_config"})
    config._attn_implementation = "eager"
    hf = Layer(config, layer_idx=DLAYERS)
    state = {k: v for k, v in layer.items()
             if deepseek_param_name(k) and deepseek_param_name(k).startswith("layers.0.") and ".experts." not in k}
    if "mlp.experts.gate_up_proj" in layer:
        state["mlp.experts.gate_up_proj"] = layer["mlp.experts.gate_up_proj"]
        state["mlp.experts.down_proj"] = layer["mlp.experts.down_proj"]
    else:
        state["mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([layer[f"mlp.experts.{e}.gate_proj.weight"], layer[f"mlp.experts.{e}.up_proj.weight"]]) for e in range(DE)])
        state["mlp.experts.down_proj"] = torch.stack([layer[f"mlp.experts.{e}.down_proj.weight"] for e in range(DE)])
    hf.load_state_dict(state, strict=True)
    return hf.eval(), Rotary(config=config)


def _plain_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def deepseek_reference(family, cfg, layer, embed_w, ids, hidden):
    """eh_proj([enorm(e); hnorm(h)]) -> transformers layer (causal) -> shared_head.norm, rows 1..T-1."""
    hf, rotary = hf_reference_layer(family, cfg, layer)
    eps = cfg["rms_norm_eps"]
    e = _plain_norm(embed_w[ids[:, 1:]], layer["enorm.weight"], eps)
    h = _plain_norm(hidden[:, :-1], layer["hnorm.weight"], eps)
    u0 = torch.cat([e, h], -1) @ layer["eh_proj.weight"].T
    b, r = ids.shape[0], ids.shape[1] - 1
    positions = torch.arange(1, r + 1).expand(b, -1)
    causal = torch.ones(r, r, dtype=torch.bool).tril()
    mask = torch.zeros(1, 1, r, r).masked_fill(~causal, torch.finfo(torch.float32).min)
    with torch.no_grad():
        u2 = hf(u0, attention_mask=mask, position_ids=positions, position_embeddings=rotary(u0, positions))
    return _plain_norm(u2, layer["shared_head.norm.weight"], eps)


# ----------------------------------------------------------------------------------------------------
# Shared checks
# ----------------------------------------------------------------------------------------------------

def check_incremental(mtp, ids, hidden, vocab: int = V):
    """forward_rows with the cache == forward_teacher, with per-request positions and scratch rows that
    are written, then overwritten (draft/verify style)."""
    g_teacher = mtp.forward_teacher(ids, hidden)
    b = ids.shape[0]
    assert b == 2 and ids.shape[1] == T
    gen = torch.Generator().manual_seed(1)
    # (positions per request, is_scratch per request); row p consumes (x_p, h_{p-1}).
    schedule = [([[1, 2, 3], [1, 2, 3]], [[0, 0, 0], [0, 0, 0]]),
                ([[4, 5], [4, 5]], [[0, 0], [0, 1]]),
                ([[6, 7], [5, 6]], [[0, 1], [0, 0]]),
                ([[7], [7]], [[0], [0]])]
    cache = mtp.new_cache(b, T + 3)
    seen = torch.zeros(b, T, dtype=torch.bool)
    for pos, scratch in schedule:
        pos, scratch = torch.tensor(pos), torch.tensor(pos).new_tensor(scratch).bool()
        tokens = ids.gather(1, pos)
        prev = hidden.gather(1, (pos - 1)[..., None].expand(-1, -1, hidden.shape[-1]))
        junk_tokens = torch.randint(0, vocab, pos.shape, generator=gen)
        junk_hidden = torch.randn(*pos.shape, hidden.shape[-1], generator=gen)
        tokens = torch.where(scratch, junk_tokens, tokens)
        prev = torch.where(scratch[..., None], junk_hidden, prev)
        g = mtp.forward_rows(tokens, prev, pos, cache)
        for i in range(b):
            for j in range(pos.shape[1]):
                if not scratch[i, j]:
                    p = int(pos[i, j])
                    torch.testing.assert_close(g[i, j], g_teacher[i, p], atol=3e-5, rtol=1e-4,
                                               msg=lambda m: f"request {i} position {p}: {m}")
                    seen[i, p] = True
    assert seen[:, 1:].all()


def check_sync_free_experts(mtp, experts, embed):
    ids, hidden = target_inputs(embed, seed=4)
    with torch.no_grad():
        sparse = mtp.forward_teacher(ids, hidden)
        experts.sync_free = True
        try:
            dense = mtp.forward_teacher(ids, hidden)
        finally:
            del experts.sync_free
    torch.testing.assert_close(dense, sparse, atol=1e-5, rtol=1e-5)


def target_inputs(embed, seed=2):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (2, T), generator=gen)
    hidden = torch.randn(2, T, embed.embedding_dim, generator=gen)
    return ids, hidden


# ----------------------------------------------------------------------------------------------------
# Qwen3.5 / Qwen3.6 / Qwen3-Next tests
# ----------------------------------------------------------------------------------------------------

QWEN_CASES = {
    "qwen3_5-dense": dict(model_type="qwen3_5", moe=False),
    "qwen3_5_moe-packed": dict(model_type="qwen3_5_moe", moe=True, packed=True),
    "qwen3_5_moe-per_expert": dict(model_type="qwen3_5_moe", moe=True, packed=False),
    "qwen3_next-per_expert": dict(model_type="qwen3_next", moe=True, packed=False, multimodal=False, shards=1),
}


@pytest.fixture(scope="module", params=list(QWEN_CASES))
def qwen_case(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt") / request.param
    config, text, tensors, embed_key = write_qwen(root, **QWEN_CASES[request.param])
    embed, head = shared_modules(tensors, embed_key, "lm_head.weight")
    mtp = load_native_mtp(root, embed, head)
    return dict(root=root, config=config, text=text, tensors=tensors, embed=embed, head=head, mtp=mtp)


def test_qwen_loads_strictly_with_full_key_coverage(qwen_case):
    mtp, tensors = qwen_case["mtp"], qwen_case["tensors"]
    assert mtp.spec.zero_centered_norm and mtp.norm.zero_centered and mtp.pre_fc_norm_hidden.zero_centered
    state = mtp.state_dict()
    expected = {k[len("mtp."):]: v for k, v in tensors.items() if k.startswith("mtp.")}
    assert set(state) == set(expected)                      # every mtp.* tensor consumed, none missing
    for name, value in expected.items():
        assert torch.equal(state[name], value), name
    assert not any(p.requires_grad for p in mtp.parameters()) and not mtp.training
    assert mtp.embed_tokens is qwen_case["embed"] and mtp.lm_head is qwen_case["head"]


def test_qwen_forward_matches_equations(qwen_case):
    mtp, tensors, embed = qwen_case["mtp"], qwen_case["tensors"], qwen_case["embed"]
    ids, hidden = target_inputs(embed)
    with torch.no_grad():
        g = mtp.forward_teacher(ids, hidden)
    assert torch.equal(g[:, 0], torch.zeros_like(g[:, 0]))
    for b in range(ids.shape[0]):
        ref = qwen_reference(tensors, qwen_case["text"], embed.weight, ids[b, 1:], hidden[b, :-1], torch.arange(1, T))
        torch.testing.assert_close(g[b, 1:].double(), ref, atol=2e-5, rtol=1e-4)


def test_qwen_incremental_equals_teacher(qwen_case):
    ids, hidden = target_inputs(qwen_case["embed"], seed=3)
    with torch.no_grad():
        check_incremental(qwen_case["mtp"], ids, hidden)


def test_qwen_sync_free_experts_match(qwen_case):
    mlp = qwen_case["mtp"].layers[0].mlp
    if not hasattr(mlp, "experts"):
        assert qwen_case["text"].get("num_experts") is None     # the dense case has no experts
        return
    check_sync_free_experts(qwen_case["mtp"], mlp.experts, qwen_case["embed"])


def test_qwen_bf16_load_keeps_fp32_rope(qwen_case):
    embed = nn.Embedding.from_pretrained(qwen_case["embed"].weight.to(torch.bfloat16))
    mtp = load_native_mtp(qwen_case["root"], embed, qwen_case["head"].to(torch.bfloat16))
    assert mtp.fc.weight.dtype == torch.bfloat16
    assert mtp.layers[0].inv_freq.dtype == torch.float32
    ids, hidden = target_inputs(embed)
    with torch.no_grad():
        g = mtp.forward_teacher(ids, hidden.bfloat16())
        g32 = qwen_case["mtp"].forward_teacher(ids, hidden)
    assert g.dtype == torch.bfloat16 and torch.isfinite(g).all()
    assert (g.float() - g32).abs().max() < 0.1
    mtp.to(torch.device("meta"))        # the frequencies follow device moves, still fp32
    assert mtp.layers[0].inv_freq.device.type == "meta" and mtp.layers[0].inv_freq.dtype == torch.float32


# ----------------------------------------------------------------------------------------------------
# DeepSeek-V3 / GLM-4-MoE tests
# ----------------------------------------------------------------------------------------------------

DS_CASES = {
    "deepseek_v3-fp8": dict(family="deepseek_v3"),
    "glm4_moe": dict(family="glm4_moe"),
    "glm4_moe-packed": dict(family="glm4_moe", packed=True),
}


@pytest.fixture(scope="module", params=list(DS_CASES))
def ds_case(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt") / request.param
    case = DS_CASES[request.param]
    cfg, tensors, layer = write_deepseek(root, **case)
    embed, head = shared_modules(tensors, "model.embed_tokens.weight", "lm_head.weight")
    mtp = load_native_mtp(root, embed, head)
    return dict(root=root, family=case["family"], cfg=cfg, tensors=tensors, layer=layer, embed=embed, mtp=mtp)


def test_deepseek_family_loads_strictly_with_full_key_coverage(ds_case):
    mtp, tensors, layer = ds_case["mtp"], ds_case["tensors"], ds_case["layer"]
    assert not mtp.spec.zero_centered_norm and not mtp.norm.zero_centered
    prefix = f"model.layers.{DLAYERS}."
    state = mtp.state_dict()
    expected = {}
    for key in tensors:
        if key.startswith(prefix) and not key.endswith("_scale_inv"):
            rest = key[len(prefix):]
            if deepseek_param_name(rest) is not None:
                expected[deepseek_param_name(rest)] = layer[rest]   # dequantised where FP8
    assert set(state) == set(expected)                      # all consumed except the skipped duplicates
    for name, value in expected.items():
        assert torch.equal(state[name], value.float()), name


@pytest.fixture(scope="module")
def ds_fp8(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt") / "deepseek_v3-fp8"
    cfg, tensors, layer = write_deepseek(root, "deepseek_v3")
    embed, head = shared_modules(tensors, "model.embed_tokens.weight", "lm_head.weight")
    return dict(tensors=tensors, mtp=load_native_mtp(root, embed, head))


def test_deepseek_fp8_weights_dequantised(ds_fp8):
    state, tensors, prefix = ds_fp8["mtp"].state_dict(), ds_fp8["tensors"], f"model.layers.{DLAYERS}."
    for rest in FP8_KEYS:
        q, s = tensors[prefix + rest], tensors[prefix + rest + "_scale_inv"]
        assert q.dtype == torch.float8_e4m3fn and s.shape[0] == -(-q.shape[0] // FP8_BLOCK[0])
        expected = fp8_reference_dequant(q, s, FP8_BLOCK)
        got = state[deepseek_param_name(rest)]
        assert torch.equal(got, expected), rest
    # Sanity: the dequantised eh_proj is close to the original float weight (e4m3: ~3 mantissa bits).
    torch.manual_seed(0)
    w = _rand(DH, 2 * DH)
    q, s = fp8_quantize(w, FP8_BLOCK)
    assert ((dequantize_fp8(q, s, FP8_BLOCK) - w).abs() <= w.abs() / 8 + 1e-6).all()


def test_deepseek_family_forward_matches_transformers_layer(ds_case):
    mtp, embed = ds_case["mtp"], ds_case["embed"]
    ids, hidden = target_inputs(embed)
    with torch.no_grad():
        g = mtp.forward_teacher(ids, hidden)
    ref = deepseek_reference(ds_case["family"], ds_case["cfg"], ds_case["layer"], embed.weight, ids, hidden)
    torch.testing.assert_close(g[:, 1:], ref, atol=2e-5, rtol=1e-4)


def test_deepseek_family_incremental_equals_teacher(ds_case):
    ids, hidden = target_inputs(ds_case["embed"], seed=3)
    with torch.no_grad():
        check_incremental(ds_case["mtp"], ids, hidden)


def test_deepseek_family_sync_free_experts_match(ds_case):
    """The CUDA-graph-safe expert path (every expert on every token, zero weights) == the sparse one."""
    check_sync_free_experts(ds_case["mtp"], ds_case["mtp"].layers[0].mlp.experts, ds_case["embed"])


def test_deepseek_router_stays_fp32_in_bf16(ds_case):
    embed = nn.Embedding.from_pretrained(ds_case["embed"].weight.to(torch.bfloat16))
    head = nn.Linear(DH, V, bias=False).to(torch.bfloat16)
    mtp = load_native_mtp(ds_case["root"], embed, head)
    block = mtp.layers[0]
    assert mtp.fc.weight.dtype == torch.bfloat16 and block.input_layernorm.weight.dtype == torch.bfloat16
    assert block.mlp.gate.weight.dtype == torch.float32 and block.mlp.gate.e_score_correction_bias.dtype == torch.float32
    ids, hidden = target_inputs(embed)
    with torch.no_grad():
        g = mtp.forward_teacher(ids, hidden.bfloat16())
    assert g.dtype == torch.bfloat16 and torch.isfinite(g).all()
    mtp.to(torch.device("meta"))        # device moves take the router along, still fp32
    assert block.mlp.gate.weight.device.type == "meta" and block.mlp.gate.weight.dtype == torch.float32
    assert block._hf["rotary"].inv_freq.device.type == "meta" and block._hf["rotary"].inv_freq.dtype == torch.float32
    assert mtp.fc.weight.device.type == "meta" and block.self_attn.o_proj.weight.dtype == torch.bfloat16


def test_dequantize_fp8_default_128_blocks():
    """Released checkpoints use 128x128 blocks; a ragged 200x300 weight has 2x3 scales."""
    torch.manual_seed(0)
    w = torch.randn(200, 300)
    q, s = fp8_quantize(w, (128, 128))
    assert s.shape == (2, 3)
    assert torch.equal(dequantize_fp8(q, s), fp8_reference_dequant(q, s, (128, 128)))
    with pytest.raises(MTPLoadError, match="does not cover"):
        dequantize_fp8(q, s[:1])


# ----------------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------------

def _load_error(root, exc=MTPLoadError, match=None):
    embed = nn.Embedding(V, QH)
    with pytest.raises(exc) as info:
        load_native_mtp(root, embed, nn.Linear(QH, V, bias=False))
    message = str(info.value)
    assert "\n" not in message, message
    if match:
        assert match in message, message
    return message


def _qwen_variant(tmp_path, edit=None, **kwargs):
    root = tmp_path / "ckpt"
    config, text, tensors, _ = write_qwen(tmp_path / "orig", "qwen3_5", moe=False, shards=1, **kwargs)
    if edit:
        config, tensors = edit(config, tensors)
    return write_checkpoint(root, config, tensors)


def test_error_no_mtp_tensors(tmp_path):
    root = tmp_path / "nomtp"
    write_qwen(root, "qwen3_5", moe=False, mtp=False)
    _load_error(root, match="has no MTP layer")


def test_error_unsupported_family(tmp_path):
    def edit(config, tensors):
        return dict(config, model_type="mistral3", text_config=dict(config["text_config"], model_type="mistral")), tensors
    msg = _load_error(_qwen_variant(tmp_path, edit), match="'mistral' is not supported")
    assert "qwen3_5" in msg and "deepseek_v3" in msg


def test_error_multimodal_without_text_config(tmp_path):
    def edit(config, tensors):
        return {k: v for k, v in config.items() if k != "text_config"}, tensors
    _load_error(_qwen_variant(tmp_path, edit), match="has no text_config")


def test_error_missing_tensor(tmp_path):
    def edit(config, tensors):
        return config, {k: v for k, v in tensors.items() if k != "mtp.layers.0.self_attn.k_norm.weight"}
    _load_error(_qwen_variant(tmp_path, edit), match="missing MTP tensor(s): mtp.layers.0.self_attn.k_norm.weight")


def test_error_misnamed_tensor(tmp_path):
    def edit(config, tensors):
        t = dict(tensors)
        t["mtp.layers.0.self_attn.k_nrom.weight"] = t.pop("mtp.layers.0.self_attn.k_norm.weight")
        return config, t
    _load_error(_qwen_variant(tmp_path, edit), match="unexpected MTP tensor 'mtp.layers.0.self_attn.k_nrom.weight'")


def test_error_shape_mismatch(tmp_path):
    def edit(config, tensors):
        return config, dict(tensors, **{"mtp.fc.weight": torch.randn(QH, QH)})
    _load_error(_qwen_variant(tmp_path, edit), match="shape mismatch for MTP tensor 'mtp.fc.weight'")


def test_error_wrong_path(tmp_path):
    _load_error(tmp_path / "does-not-exist", FileNotFoundError, match="checkpoint directory not found")
    (tmp_path / "empty").mkdir()
    _load_error(tmp_path / "empty", FileNotFoundError, match="no config.json")
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text(json.dumps({"model_type": "qwen3_5_text"}))
    _load_error(tmp_path / "noweights", FileNotFoundError, match="no model.safetensors")


def test_error_fp8_weight_without_scale(tmp_path):
    root = tmp_path / "ds"
    write_deepseek(root, "deepseek_v3")
    index = json.loads((root / "model.safetensors.index.json").read_text())
    del index["weight_map"][f"model.layers.{DLAYERS}.eh_proj.weight_scale_inv"]
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    _load_error(root, match=f"FP8 MTP tensor 'model.layers.{DLAYERS}.eh_proj.weight' in")


# ----------------------------------------------------------------------------------------------------
# The repo's micro target (Qwen3 + mtp.*)
# ----------------------------------------------------------------------------------------------------

def test_micro_target_mtp_strict_and_incremental(micro_target_dir, micro_target, micro_mtp):
    from safetensors import safe_open

    with safe_open(str(Path(micro_target_dir) / "mtp.safetensors"), "pt") as f:
        ckpt = {k[len("mtp."):]: f.get_tensor(k) for k in f.keys() if k.startswith("mtp.")}
    state = micro_mtp.state_dict()
    assert set(state) == set(ckpt)
    for name, value in ckpt.items():
        assert torch.equal(state[name], value.to(state[name].dtype)), name
    vocab = micro_target.embed_tokens.num_embeddings
    ids = torch.randint(0, vocab, (2, T), generator=torch.Generator().manual_seed(0))
    hidden = micro_target(ids).last_hidden
    with torch.no_grad():
        check_incremental(micro_mtp, ids, hidden, vocab=vocab)


# ----------------------------------------------------------------------------------------------------
# The MTP in its own mtp.safetensors beside the causal LM's weights (the embedded dense targets)
# ----------------------------------------------------------------------------------------------------

def write_mtp_apart(root, config: dict, tensors: dict, mtp_extra: dict | None = None, index_lists_mtp: bool = False):
    """model.safetensors (the non-MTP tensors) with the index listing them, mtp.safetensors (the `mtp.*`
    ones and `mtp_extra`); `index_lists_mtp`: the index names mtp.safetensors too (a sharded release)."""
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config))
    main = {k: v for k, v in tensors.items() if not k.startswith("mtp.")}
    mtp = {**{k: v for k, v in tensors.items() if k.startswith("mtp.")}, **(mtp_extra or {})}
    save_file(main, str(root / "model.safetensors"))
    save_file(mtp, str(root / "mtp.safetensors"))
    weight_map = {k: "model.safetensors" for k in main}
    if index_lists_mtp:
        weight_map.update({k: "mtp.safetensors" for k in mtp})
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return root


@pytest.mark.parametrize("index_lists_mtp", [False, True])
def test_mtp_in_its_own_file_loads_the_same_tensors(tmp_path, index_lists_mtp):
    config, _, tensors, _ = write_qwen(tmp_path / "one_file", "qwen3_5", moe=False, shards=1)
    apart = write_mtp_apart(tmp_path / "apart", config, tensors, index_lists_mtp=index_lists_mtp)
    embed, head = nn.Embedding(V, QH), nn.Linear(QH, V, bias=False)
    reference = load_native_mtp(tmp_path / "one_file", embed, head).state_dict()
    loaded = load_native_mtp(apart, embed, head).state_dict()
    assert set(loaded) == set(reference)
    assert all(torch.equal(loaded[k], reference[k]) for k in reference)


def test_error_mtp_file_holds_other_tensors(tmp_path):
    config, _, tensors, _ = write_qwen(tmp_path / "orig", "qwen3_5", moe=False, shards=1)
    root = write_mtp_apart(tmp_path / "stray", config, tensors, mtp_extra={"model.norm.weight": torch.ones(QH)})
    _load_error(root, match="mtp.safetensors holds tensor model.norm.weight, which is not one of the checkpoint's MTP")


def test_error_mtp_tensor_stored_twice(tmp_path):
    config, _, tensors, _ = write_qwen(tmp_path / "orig", "qwen3_5", moe=False, shards=1)
    root = write_mtp_apart(tmp_path / "twice", config, tensors)
    save_file(tensors, str(root / "model.safetensors"))   # the MTP in the listed weights as well
    index = {"metadata": {}, "weight_map": {k: "model.safetensors" for k in tensors}}
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    _load_error(root, match="tensor mtp.fc.weight is stored both in")
