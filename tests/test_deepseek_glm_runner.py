"""Static-cache runners for DeepSeek-V3 (MLA + MoE) and GLM-4-MoE (GQA, partial rotary, MoE), and their
MTP blocks' latent-space / static-cache attention.

Oracles: transformers' own cached greedy `generate()` (lossless decoding of every method at several
batch sizes, and with scripted per-request accepted lengths), the exact `RecomputeTargetRunner` (logits
round by round; caches after rollback = a fresh prefill of the committed tokens), transformers' MTP
decoder layer (the block the MTP used before) and the target's own sampling distribution.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dmtp.decode import SamplingConfig, build_proposer
from dmtp.families.decoding import spec_decoder
from dmtp.drafters.block_drafter import fresh_drafter_for
from scripted_proposer import ScriptedProposer
from dmtp.decode.runners import RecomputeTargetRunner
from dmtp.families.catalogue import make_target_runner
from dmtp.families.deepseek_v3 import DeepseekV3TargetRunner, deepseek_runner_unsupported
from dmtp.families.glm4_moe import Glm4MoeTargetRunner, glm_runner_unsupported
from dmtp.families.mtp_loading import load_native_mtp
from dmtp.models.moe import PerExpertSwiGLU
from dmtp.models.target import TargetModel
from test_decode_sampling import _chi2_pvalue, _exact_probs
from test_real_targets import DS_COMMON, _hf_greedy, _sharpen_, write_deepseek_family

FAMILIES = ("deepseek_v3", "glm4_moe")
RUNNERS = {"deepseek_v3": DeepseekV3TargetRunner, "glm4_moe": Glm4MoeTargetRunner}
LAYERS = [0, 1]            # two main layers: the dense one and the MoE one (its tap is post-norm)
PROMPT_LENGTHS = (9, 14, 6, 11, 3, 17, 8, 12)
NEW = 16


def _perturb_routing_biases(root: Path) -> None:
    """Random-init routers have e_score_correction_bias = 0; make it matter for the choice (main layers and
    the MTP layer), so that 'bias for selection only' is exercised."""
    f = next(root.glob("*.safetensors"))
    tensors = load_file(str(f))
    gen = torch.Generator().manual_seed(7)
    for k, v in tensors.items():
        if k.endswith("e_score_correction_bias"):
            tensors[k] = 0.3 * torch.randn(v.shape, generator=gen)
    save_file(tensors, str(f), metadata={"format": "pt"})


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory, micro_target_dir):
    root = write_deepseek_family(tmp_path_factory.mktemp("moe") / request.param, micro_target_dir, request.param)
    _perturb_routing_biases(root)
    target = TargetModel.from_pretrained(root)
    mtp = load_native_mtp(root, target.embed_tokens, target.lm_head)
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(5, target.config.vocab_size, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]
    refs = [_hf_greedy(target, p, NEW) for p in prompts]
    return dict(name=request.param, root=root, target=target, mtp=mtp, prompts=prompts, refs=refs)


# ---------------------------------------------------------------------------------------------------
# targets built in memory (config variants the checkpoints do not cover)
# ---------------------------------------------------------------------------------------------------

VARIANTS = {
    "deepseek_v3": dict(),
    "deepseek_v3-q_proj-yarn-rotate_half-bias": dict(q_lora_rank=None, rope_interleave=False, attention_bias=True,
                                                     rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0,
                                                                      "factor": 4.0, "original_max_position_embeddings": 128,
                                                                      "beta_fast": 32, "beta_slow": 1, "mscale": 0.8,
                                                                      "mscale_all_dim": 1.0}),
    "deepseek_v3-per_expert": dict(per_expert=True),
    "glm4_moe": dict(),
    "glm4_moe-no_qk_norm-groups-yarn": dict(use_qk_norm=False, n_group=2, topk_group=1,
                                            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0,
                                                             "original_max_position_embeddings": 256,
                                                             "partial_rotary_factor": 0.5}),
}


def _memory_target(name: str, vocab: int = 97) -> TargetModel:
    family = name.split("-")[0]
    overrides = dict(VARIANTS[name])
    per_expert = overrides.pop("per_expert", False)
    if family == "deepseek_v3":
        from transformers import DeepseekV3Config as Config, DeepseekV3ForCausalLM as Model

        extra = dict(num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
                     v_head_dim=8, n_group=2, topk_group=1)
    else:
        from transformers import Glm4MoeConfig as Config, Glm4MoeForCausalLM as Model

        extra = dict(num_key_value_heads=2, head_dim=16, partial_rotary_factor=0.5, use_qk_norm=True,
                     attention_bias=True, n_group=1, topk_group=1)
    torch.manual_seed(0)
    model = Model(Config(**{**DS_COMMON, "vocab_size": vocab, **extra, **overrides}))
    _sharpen_(model)
    with torch.no_grad():
        for n, t in [*model.named_parameters(), *model.named_buffers()]:
            if "norm" in n or n.endswith((".bias", "e_score_correction_bias")):
                t.add_(0.3 * torch.randn_like(t))
    if per_expert:  # experts held one by one (as some checkpoints / remote code keep them), same weights
        for layer in model.model.layers:
            packed = getattr(layer.mlp, "experts", None)
            if packed is None:
                continue
            e, two_im, h = packed.gate_up_proj.shape
            experts = PerExpertSwiGLU(e, h, two_im // 2)
            with torch.no_grad():
                for i in range(e):
                    gate, up = packed.gate_up_proj[i].chunk(2)
                    mlp = experts._modules[str(i)]
                    mlp.gate_proj.weight.copy_(gate)
                    mlp.up_proj.weight.copy_(up)
                    mlp.down_proj.weight.copy_(packed.down_proj[i])
            layer.mlp.experts = experts
    return TargetModel(model.eval())


def _padded(prompts):
    ids = torch.zeros(len(prompts), max(map(len, prompts)), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, :len(p)] = torch.tensor(p)
    return ids, torch.tensor([len(p) for p in prompts])


def _close(a, b, what):
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, msg=lambda m: f"{what}: {m}")


def _cache_rows(runner, b: int, n: int) -> list[torch.Tensor]:
    """Every layer's cached rows 0..n-1 of request b (MLA: latent and roped key; GQA: keys and values)."""
    out = []
    for c in runner.caches:
        if hasattr(c, "c_kv"):
            out += [c.c_kv[b, :n], c.k_pe[b, :n]]
        else:
            out += [c.k[b, :, :n], c.v[b, :, :n]]
    return out


@pytest.mark.parametrize("name", list(VARIANTS))
def test_runner_equals_recompute_round_by_round(name):
    """Prefill + verify/advance rounds with mixed committed counts (0 .. K+1): logits, tapped features and
    the last hidden equal the exact recompute runner's; after the last advance every request's cache rows
    up to its length equal a fresh prefill of its committed tokens (rejected rows never leak)."""
    target = _memory_target(name)
    family = name.split("-")[0]
    fast = make_target_runner(target, LAYERS, kind="fast")
    assert isinstance(fast, RUNNERS[family])
    oracle = RecomputeTargetRunner(target, LAYERS)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(5, 97, (n,), generator=gen).tolist() for n in (5, 11, 3, 8)]
    ids, lens = _padded(prompts)
    for r in (fast, oracle):
        r.allocate(len(prompts), 64)
    a, b = fast.prefill(ids, lens), oracle.prefill(ids, lens)
    for i, p in enumerate(prompts):
        for field in ("logits", "layer_hidden", "last_hidden"):
            _close(getattr(a, field)[i, :len(p)], getattr(b, field)[i, :len(p)], f"prefill {field} request {i}")
    history = [list(p) for p in prompts]
    commits = [[0, 8, 3, 1], [5, 0, 8, 2], [1, 4, 0, 8], [8, 8, 2, 0]]
    for rnd, n in enumerate(commits):
        block = torch.randint(5, 97, (len(prompts), 8), generator=gen)
        a, b = fast.verify(block), oracle.verify(block)
        for field in ("logits", "layer_hidden", "last_hidden"):
            _close(getattr(a, field), getattr(b, field), f"round {rnd} {field}")
        n = torch.tensor(n)
        fast.advance(n)
        oracle.advance(n)
        for i in range(len(prompts)):
            history[i] += block[i, :n[i]].tolist()
    assert fast.lengths.tolist() == [len(h) for h in history]
    fresh = make_target_runner(target, LAYERS, kind="fast")
    fresh.allocate(len(prompts), 64)
    ids, lens = _padded(history)
    fresh.prefill(ids, lens)
    for i, h in enumerate(history):
        for got, want in zip(_cache_rows(fast, i, len(h)), _cache_rows(fresh, i, len(h))):
            _close(got, want, f"cache of request {i}")


def test_runner_binds_the_hf_parameters(family):
    target = family["target"]
    runner = make_target_runner(target, LAYERS)          # auto picks the family's static-cache runner
    assert type(runner) is RUNNERS[family["name"]] and runner.supports_graphs
    why = deepseek_runner_unsupported if family["name"] == "deepseek_v3" else glm_runner_unsupported
    assert why(target) is None
    hf, ours = target.hf.model.layers[1], runner.layers[1]
    assert ours.mlp.gate.weight is hf.mlp.gate.weight and ours.mlp.gate.weight.dtype == torch.float32
    assert ours.mlp.gate.e_score_correction_bias is hf.mlp.gate.e_score_correction_bias
    assert ours.mlp.experts.gate_up_proj is hf.mlp.experts.gate_up_proj
    assert ours.mlp.shared_experts.down_proj.weight is hf.mlp.shared_experts.down_proj.weight
    assert runner.layers[0].mlp.up_proj.weight is target.hf.model.layers[0].mlp.up_proj.weight
    attn = "kv_b_proj" if family["name"] == "deepseek_v3" else "k_proj"
    assert getattr(ours.self_attn, attn).weight is getattr(hf.self_attn, attn).weight


# ---------------------------------------------------------------------------------------------------
# lossless decoding against transformers' cached generate()
# ---------------------------------------------------------------------------------------------------

def _proposer(family, method):
    target, mtp = family["target"], family["mtp"]
    if method in ("ar", "mtp415"):
        return build_proposer(method, target, mtp=mtp)
    drafter = fresh_drafter_for(target, method, mask_token_id=3, perturb=0.5)
    return build_proposer("drafter", target, mtp=mtp, drafter=drafter, name=method)


@pytest.mark.parametrize("method,batches", [("ar", (1, 8)), ("mtp415", (2, 8)), ("raw_dflash", (4, 8)),
                                            ("dual_anchor_zero_init", (1, 2, 4, 8))])
def test_greedy_equals_transformers_generate(family, method, batches):
    dec = spec_decoder(family["target"], _proposer(family, method), eos_token_id=None)
    assert dec.runner.kind == family["name"]
    for batch in batches:
        res = dec.generate(family["prompts"], max_new_tokens=NEW, batch_size=batch)
        assert res.tokens == family["refs"], f"{method} at batch {batch}"


def test_mixed_accepted_lengths_in_one_round(family):
    """ScriptedProposer proposes the reference continuation with a per-request corrupted candidate: in every
    round the eight requests accept 0, 7 and lengths in between, side by side in the same verify."""
    corrupt = [1, None, 4, 2, None, 7, 3, 1]
    expected = [0, 7, 3, 1, 7, 6, 2, 0]
    proposer = ScriptedProposer(family["refs"], 7, corrupt_at=corrupt, vocab_size=family["target"].config.vocab_size)
    res = spec_decoder(family["target"], proposer, eos_token_id=None).generate(family["prompts"], max_new_tokens=NEW,
                                                                              batch_size=8)
    assert res.tokens == family["refs"]
    for acc, k in zip(res.accepted, expected):
        assert acc[:-1] == [k] * (len(acc) - 1)          # the last round is cut by the budget


def test_graph_capture_protocol_leaves_decoding_unchanged(family, monkeypatch):
    """On CPU, the CUDA-graph capture protocol with eager stand-ins (warm-up rounds that write the caches
    past the committed lengths, then the state restore; bucketed batch, 256-rounded caches) decodes the same."""
    import dmtp.decode.execution.graphs as graphs
    from test_decode_graphs import _EagerGraphs

    monkeypatch.setattr(graphs, "RoundGraphs", _EagerGraphs)
    prompts, refs = family["prompts"][:6], family["refs"][:6]
    proposer = ScriptedProposer(refs, 7, corrupt_at=[1, None, 4, 2, None, 7],
                                vocab_size=family["target"].config.vocab_size)
    dec = spec_decoder(family["target"], proposer, eos_token_id=None, time_stages=False)
    dec.use_graphs = True
    res = dec.generate(prompts, max_new_tokens=NEW, batch_size=3)
    assert res.tokens == refs and res.accepted[1][0] == 7 and res.accepted[2][0] == 3


# ---------------------------------------------------------------------------------------------------
# MTP block: latent-space / static-cache attention == transformers' decoder layer (the old block)
# ---------------------------------------------------------------------------------------------------

def _hf_mtp_layer(family):
    """transformers' decoder layer at index num_hidden_layers holding the MTP block's weights (experts packed
    as transformers wants), with its rotary embedding: what the MTP block ran before it had its own."""
    cfg = family["target"].hf.config
    if family["name"] == "deepseek_v3":
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer as Layer
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding as Rotary
    else:
        from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeDecoderLayer as Layer
        from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeRotaryEmbedding as Rotary
    block = family["mtp"].layers[0]
    state = {k: v for k, v in block.state_dict().items() if ".experts." not in k}
    experts = block.mlp.experts
    e = experts.num_experts
    state["mlp.experts.gate_up_proj"] = torch.stack([torch.cat([experts._modules[str(i)].gate_proj.weight,
                                                                experts._modules[str(i)].up_proj.weight]) for i in range(e)])
    state["mlp.experts.down_proj"] = torch.stack([experts._modules[str(i)].down_proj.weight for i in range(e)])
    layer = Layer(cfg, layer_idx=cfg.num_hidden_layers)
    layer.load_state_dict(state, strict=True)
    return layer.eval(), Rotary(config=cfg)


def test_mtp_block_equals_transformers_layer_teacher_and_incremental(family):
    mtp, target = family["mtp"], family["target"]
    assert isinstance(mtp.layers[0].mlp.experts, PerExpertSwiGLU)   # the checkpoint stores experts one by one
    layer, rotary = _hf_mtp_layer(family)
    gen = torch.Generator().manual_seed(5)
    b, t = 3, 12
    ids = torch.randint(5, target.config.vocab_size, (b, t), generator=gen)
    hidden = torch.randn(b, t, target.hidden_size, generator=gen)
    with torch.no_grad():
        u0 = mtp.fuse(ids[:, 1:], hidden[:, :-1])
        positions = torch.arange(1, t).expand(b, -1)
        causal = torch.ones(t - 1, t - 1, dtype=torch.bool).tril()
        additive = torch.zeros(1, 1, t - 1, t - 1).masked_fill(~causal, torch.finfo(torch.float32).min)
        ref = mtp.norm(layer(u0, attention_mask=additive, position_ids=positions,
                             position_embeddings=rotary(u0, positions)))
        teacher = mtp.forward_teacher(ids, hidden)
        _close(teacher[:, 1:], ref, "forward_teacher")
        # incremental rows, per-request positions, with scratch rows that a later call overwrites
        cache = mtp.new_cache(b, 24)
        done = torch.ones(b, dtype=torch.long)            # next position to write per request
        for width, steps in ((3, [3, 1, 2]), (4, [4, 4, 0]), (2, [1, 2, 2]), (4, [3, 4, 4])):
            pos = (done[:, None] + torch.arange(width)).clamp(max=t - 1)
            g = mtp.forward_rows(ids.gather(1, pos), hidden.gather(1, (pos - 1)[..., None].expand(-1, -1, hidden.shape[-1])),
                                 pos, cache)
            for i in range(b):
                for j in range(steps[i]):
                    _close(g[i, j], teacher[i, int(pos[i, j])], f"row {int(pos[i, j])} of request {i}")
            done += torch.tensor(steps)
            # scratch: junk rows right after the committed ones (overwritten by the next call)
            junk_pos = (done[:, None] + torch.arange(2)).clamp(max=t - 1)
            mtp.forward_rows(torch.randint(5, 90, (b, 2), generator=gen), torch.randn(b, 2, target.hidden_size, generator=gen),
                             junk_pos, cache)


# ---------------------------------------------------------------------------------------------------
# sampling, unsupported configs, CUDA graphs
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["deepseek_v3"], indirect=True)   # one target is enough here
def test_rejection_sampling_keeps_the_target_distribution(family):
    target, mtp = family["target"], family["mtp"]
    sampling = SamplingConfig(temperature=1.0, top_k=4, verification="rejection")
    n = 600
    prompt = family["prompts"][0]
    dec = spec_decoder(target, build_proposer("mtp415", target, mtp=mtp), eos_token_id=[])
    res = dec.generate([prompt] * n, max_new_tokens=3, sampling=sampling, batch_size=300, seed=123)
    counts = Counter(tuple(t) for t in res.tokens)
    probs = _exact_probs(target, prompt, list(counts), sampling)
    assert all(p > 0 for p in probs.values())
    assert _chi2_pvalue(counts, probs, n) > 1e-3, counts.most_common(8)
    assert any(a > 0 for acc in res.accepted for a in acc)          # drafts really were accepted


@pytest.mark.parametrize("name", ["deepseek_v3", "glm4_moe"])
def test_unsupported_rope_is_one_line(name):
    target = _memory_target(name)
    target.config.rope_parameters = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    with pytest.raises(ValueError, match=r"runner=fast: no static-cache runner .*rope type 'dynamic'") as err:
        make_target_runner(target, LAYERS, kind="fast")
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=f"{name} target runner cannot drive this model: rope type 'dynamic'"):
        RUNNERS[name](target, LAYERS)
    with pytest.warns(UserWarning, match="recompute runner") as warned:
        runner = make_target_runner(target, LAYERS)
    assert isinstance(runner, RecomputeTargetRunner)
    (fallback,) = [w for w in warned if "recompute runner" in str(w.message)]
    assert "\n" not in str(fallback.message)


def test_mla_runner_has_no_flash_path():
    with pytest.raises(ValueError, match="not available for MLA"):
        DeepseekV3TargetRunner(_memory_target("deepseek_v3"), LAYERS, attention="flash")


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("method", ["ar", "mtp415", "dual_anchor_zero_init"])
def test_cuda_graphs_equal_eager(family, method, dtype):
    target = TargetModel.from_pretrained(family["root"], dtype=dtype, device="cuda")
    mtp = load_native_mtp(family["root"], target.embed_tokens, target.lm_head)
    prompts = family["prompts"][:6]
    res = {}
    for graphs in (False, True):
        if method in ("ar", "mtp415"):
            proposer = build_proposer(method, target, mtp=mtp)
        else:
            drafter = fresh_drafter_for(target, method, 3, perturb=0.5)
            proposer = build_proposer("drafter", target, mtp=mtp, drafter=drafter.to("cuda", dtype))
        dec = spec_decoder(target, proposer, eos_token_id=[], cuda_graphs=graphs)
        assert dec.use_graphs == graphs and dec.runner.kind == family["name"]
        res[graphs] = dec.generate(prompts, max_new_tokens=NEW, batch_size=4)
        if graphs:
            (graphs_obj,) = dec._graphs.values()
            # the MLA/MoE verify and the MoE MTP really are captured (no stage fell back to eager)
            assert not {"verify", "mtp"} & set(graphs_obj.eager_stages), graphs_obj.eager_stages
    assert res[True].tokens == res[False].tokens
    assert res[True].accepted == res[False].accepted
    if dtype == torch.float32:   # and lossless against transformers' cached generate() on the same device
        for p, toks in zip(prompts, res[False].tokens):
            ids = torch.tensor([p], device="cuda")
            ref = target.hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False,
                                     eos_token_id=None, pad_token_id=0)
            assert toks == ref[0, len(p):].tolist()
