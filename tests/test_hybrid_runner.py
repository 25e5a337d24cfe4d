"""The static-cache runner for hybrid Gated-DeltaNet targets (Qwen3-Next / Qwen3.5 / Qwen3.6, dense and MoE).

Against transformers' own cached greedy `generate()` for every method and batch size (with scripted
drafts that accept 0, K and in-between counts in the same round), against the recompute oracle round
by round, state-for-state against a fresh prefill of the committed tokens, in distribution at
temperature > 0, through the graph warm-up/restore protocol, and (GPU) CUDA graphs and the fla path.
"""
from collections import Counter

import pytest
import torch

from dmtp.decode import SamplingConfig, build_proposer
from dmtp.families.decoding import spec_decoder
from dmtp.drafters.block_drafter import fresh_drafter_for
from scripted_proposer import ScriptedProposer
from dmtp.decode.runners import RecomputeTargetRunner
from dmtp.families.catalogue import make_target_runner
from dmtp.families.hybrid import HybridTargetRunner, hybrid_runner_unsupported, text_model
from dmtp.families.mtp_loading import load_native_mtp
from dmtp.models import gdn_kernels
from dmtp.models.gated_deltanet import GDNCache
from dmtp.models.target import TargetModel
from test_decode_sampling import _chi2_pvalue, _exact_probs
from test_decode_stage_writes import check_rounds
from test_real_targets import write_qwen35

LAYERS = [1, 3]  # 3 is the last layer: its tap is the final-norm output
ATOL = 1e-4
NEW = 12
CHECKPOINTS = {"dense": dict(moe=False), "moe-packed": dict(moe=True, packed=True),
               "moe-per_expert": dict(moe=True, packed=False)}


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory, micro_target_dir):
    """name -> (target, its native MTP), written in the real multimodal layout by `write_qwen35`."""
    out = {}
    for name, kwargs in CHECKPOINTS.items():
        root = write_qwen35(tmp_path_factory.mktemp("hybrid") / name, micro_target_dir, **kwargs)
        target = TargetModel.from_pretrained(root)
        out[name] = (target, load_native_mtp(root, target.embed_tokens, target.lm_head))
    return out


def _prompts(vocab: int, lengths=(9, 14, 6, 3, 11, 7, 17, 5)) -> list[list[int]]:
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(5, vocab, (n,), generator=gen).tolist() for n in lengths]


def _hf_greedy(target: TargetModel, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = target.hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def _proposer(method, target, mtp, refs=None):
    if method == "scripted":  # per request: accept 0, all 7, 3, 1, all, 6, 0, 2 of 7 every round
        return ScriptedProposer(refs, 7, corrupt_at=[1, None, 4, 2, None, 7, 1, 3], vocab_size=target.config.vocab_size)
    if method in ("ar", "mtp415"):
        return build_proposer(method, target, mtp=mtp)
    drafter = fresh_drafter_for(target, method, mask_token_id=3, perturb=0.5).to(target.device, target.dtype)
    return build_proposer("drafter", target, mtp=mtp, drafter=drafter, name=method)


# -- greedy: identical to transformers' cached generate() ---------------------------------------------

ALL_METHODS = ("ar", "mtp415", "raw_dflash", "dual_anchor_zero_init", "scripted")
# The two MoE checkpoints hold the same main model and differ in the MTP's expert layout only, so the
# per-expert one runs the methods that use the MTP.
METHODS = {"dense": ALL_METHODS, "moe-packed": ALL_METHODS, "moe-per_expert": ("mtp415", "dual_anchor_zero_init")}
BATCHES = {1: 1, 2: 3, 4: 5, 8: 8}  # batch size -> prompts decoded (a short last chunk at 2 and 4)


@pytest.fixture(scope="module")
def greedy_refs(hybrid):
    """checkpoint name -> transformers' greedy continuation of each prompt (computed once per main model)."""
    by_main_model: dict = {}

    def refs(name):
        moe = CHECKPOINTS[name]["moe"]
        if moe not in by_main_model:
            target = hybrid[name][0]
            by_main_model[moe] = [_hf_greedy(target, p, NEW) for p in _prompts(target.config.vocab_size)]
        return by_main_model[moe]

    return refs


@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_every_method_equals_transformers_generate(hybrid, greedy_refs, name):
    target, mtp = hybrid[name]
    prompts = _prompts(target.config.vocab_size)
    refs = greedy_refs(name)
    for method in METHODS[name]:
        dec = spec_decoder(target, _proposer(method, target, mtp, refs), eos_token_id=None, time_stages=False)
        assert isinstance(dec.runner, HybridTargetRunner)
        for batch, count in BATCHES.items():
            res = dec.generate(prompts[:count], max_new_tokens=NEW, batch_size=batch)
            assert res.tokens == refs[:count], (name, method, batch)
            if method == "scripted":  # every round but the budget-cut last one accepted the scripted count
                for acc, want in zip(res.accepted, (0, 7, 3, 1, 7, 6, 0, 2)):
                    assert all(a == want for a in acc[:-1]), (acc, want)


# -- the oracle, round by round, and the committed state ----------------------------------------------

def _tiny_qwen3_next():
    """Qwen3-Next layout: grouped in_proj_qkvz / in_proj_ba, MoE layers mixed with a dense one, a
    non-renormalised top-k (norm_topk_prob=False)."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3NextConfig(vocab_size=97, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16, intermediate_size=40, linear_num_value_heads=4,
                          linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
                          num_experts=4, num_experts_per_tok=2, moe_intermediate_size=12,
                          shared_expert_intermediate_size=20, norm_topk_prob=False, mlp_only_layers=[1],
                          layer_types=["linear_attention"] * 3 + ["full_attention"], tie_word_embeddings=False)
    model = Qwen3NextForCausalLM(cfg).eval()
    with torch.no_grad():  # preferences, non-trivial norms and decays
        for pname, p in model.named_parameters():
            if p.dim() >= 2 and "embed" not in pname:
                p.mul_(4.0)
            else:
                p.add_(0.1 * torch.randn_like(p))
    return TargetModel(model)


def _padded(prompts):
    ids = torch.zeros(len(prompts), max(map(len, prompts)), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, :len(p)] = torch.tensor(p)
    return ids, torch.tensor([len(p) for p in prompts])


def _close(a, b, what):
    assert a.shape == b.shape, (what, a.shape, b.shape)
    assert torch.allclose(a, b, atol=ATOL, rtol=1e-4), (what, (a - b).abs().max().item())


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next"])
def test_rounds_equal_recompute_and_state_equals_fresh_prefill(hybrid, family):
    target = hybrid["moe-packed"][0] if family == "qwen3_5" else _tiny_qwen3_next()
    fast = make_target_runner(target, LAYERS)
    oracle = RecomputeTargetRunner(target, LAYERS)
    assert isinstance(fast, HybridTargetRunner) and hybrid_runner_unsupported(target) is None
    hf_layer = text_model(target.hf).layers[0]
    assert fast.layers[0].mixer.out_proj.weight is hf_layer.linear_attn.out_proj.weight  # bound, not copied
    vocab = target.config.vocab_size
    prompts = _prompts(vocab, lengths=(7, 70, 3, 12))  # 70 > one 64-row prompt chunk
    ids, lens = _padded(prompts)
    for runner in (fast, oracle):
        runner.allocate(len(prompts), 128)
    a, b = fast.prefill(ids, lens), oracle.prefill(ids, lens)
    for i, n in enumerate(lens.tolist()):
        _close(a.logits[i, :n], b.logits[i, :n], "prefill logits")
        _close(a.layer_hidden[i, :n], b.layer_hidden[i, :n], "prefill features")
    gen = torch.Generator().manual_seed(1)
    committed = [list(p) for p in prompts]
    counts = [[0, 8, 3, 1], [5, 0, 8, 2], [1, 4, 0, 8]]
    for rnd, n in enumerate(counts):
        block = torch.randint(5, vocab, (len(prompts), 8), generator=gen)
        a, b = fast.verify(block), oracle.verify(block)
        _close(a.logits, b.logits, f"round {rnd} logits")
        _close(a.layer_hidden, b.layer_hidden, f"round {rnd} features")
        _close(a.last_hidden, b.last_hidden, f"round {rnd} last hidden")
        n = torch.tensor(n)
        fast.advance(n)
        oracle.advance(n)
        for i in range(len(prompts)):
            committed[i] += block[i, :n[i]].tolist()
    assert fast.lengths.tolist() == [len(c) for c in committed]

    fresh = HybridTargetRunner(target, LAYERS)
    fresh.allocate(len(prompts), 128)
    fresh.prefill(*_padded(committed))
    for cache, ref in zip(fast.caches, fresh.caches):
        if isinstance(cache, GDNCache):
            _close(cache.conv, ref.conv, "conv state")
            _close(cache.state, ref.state, "recurrent state")
        else:
            for i, n in enumerate(fast.lengths.tolist()):
                _close(cache.k[i, :, :n], ref.k[i, :, :n], "keys")
                _close(cache.v[i, :, :n], ref.v[i, :, :n], "values")


# -- sampling keeps the target's distribution -----------------------------------------------------------

@pytest.mark.parametrize("method", ["mtp415", "dual_anchor_zero_init"])
def test_rejection_sampling_matches_target_distribution(hybrid, method):
    target, mtp = hybrid["dense"]
    # The MTP is random: with this prompt its top-4 meets the target's top-4 on some paths, so drafts
    # get accepted in some rounds and rejected in others (asserted below).
    prompt = torch.randint(5, target.config.vocab_size, (10,), generator=torch.Generator().manual_seed(22)).tolist()
    sampling = SamplingConfig(temperature=1.0, top_k=4, verification="rejection")
    dec = spec_decoder(target, _proposer(method, target, mtp), eos_token_id=[], time_stages=False)
    assert isinstance(dec.runner, HybridTargetRunner)
    n = 1000
    res = dec.generate([prompt] * n, max_new_tokens=3, sampling=sampling, batch_size=n, seed=123)
    counts = Counter(tuple(t) for t in res.tokens)
    probs = _exact_probs(target, prompt, list(counts), sampling)
    assert all(p > 0 for p in probs.values())  # never outside the top-k
    pvalue = _chi2_pvalue(counts, probs, n)
    assert pvalue > 1e-3, (pvalue, counts.most_common(8))
    assert any(a > 0 for acc in res.accepted for a in acc)  # drafts were accepted: speculation happened


# -- catalogue: uncovered configs -------------------------------------------------------------------------

def test_uncovered_hybrid_config_is_one_line_error_and_auto_falls_back():
    target = _tiny_qwen3_next()
    target.config.layer_types = ["linear_attention", "sliding_attention", "linear_attention", "full_attention"]
    assert hybrid_runner_unsupported(target) == "layer type 'sliding_attention'"
    with pytest.raises(ValueError) as err:
        make_target_runner(target, LAYERS, kind="fast")
    assert "\n" not in str(err.value) and "hybrid: layer type 'sliding_attention'" in str(err.value)
    with pytest.warns(UserWarning, match="recompute runner.*sliding_attention"):
        assert isinstance(make_target_runner(target, LAYERS), RecomputeTargetRunner)
    with pytest.raises(ValueError, match="hybrid target runner cannot drive this model"):
        HybridTargetRunner(target, LAYERS)


# -- the CUDA-graph capture protocol, eagerly on CPU ---------------------------------------------------

class _EagerGraphs:
    """RoundGraphs' protocol (warm-up rounds that advance the recurrent states, then `reset`), eager replay."""

    def __init__(self, stages, granularity="stage"):
        self.stages = stages

    def capture(self, reset):
        for _ in range(3):
            for stage in self.stages:
                stage.run()
        reset()
        return self

    def replay(self, timer=None):
        for stage in self.stages:
            stage.run()


def test_graph_warmup_restores_recurrent_state(hybrid, monkeypatch):
    target, mtp = hybrid["dense"]
    prompts = _prompts(target.config.vocab_size)[:3]
    ref = spec_decoder(target, _proposer("mtp415", target, mtp), eos_token_id=[]).generate(prompts, NEW, batch_size=3)

    import dmtp.decode.execution.graphs as graphs

    monkeypatch.setattr(graphs, "RoundGraphs", _EagerGraphs)
    fake = spec_decoder(target, _proposer("mtp415", target, mtp), eos_token_id=[], time_stages=False)
    fake.use_graphs = True  # bucket 4 with a padding row, snapshot/restore around the warm-up
    out = fake.generate(prompts, NEW, batch_size=3)
    assert out.tokens == ref.tokens and out.accepted == ref.accepted


@pytest.mark.parametrize("method", ["mtp415", "context_fusion"])
def test_stages_declare_the_recurrent_state_they_commit(hybrid, method):
    """The verify stage's writes include every GDN layer's committed conv/recurrent state (advance), its
    scratch the per-row block buffers and the attention K/V."""
    target, mtp = hybrid["dense"]
    dec = spec_decoder(target, _proposer(method, target, mtp), eos_token_id=[], time_stages=False)
    assert check_rounds(dec, SamplingConfig()) > 0
    gdn = [c for c in dec.runner.caches if isinstance(c, GDNCache)]
    verify = next(s for s in dec.stages(dec.st) if s.name == "verify")
    assert gdn and all(any(t is c.state for t in verify.writes) and any(t is c.conv for t in verify.writes)
                       for c in gdn)


# -- GPU -------------------------------------------------------------------------------------------------

def _on_cuda(target: TargetModel, dtype):
    gpu = TargetModel.from_pretrained(target.path, dtype=dtype, device="cuda")
    return gpu, load_native_mtp(target.path, gpu.embed_tokens, gpu.lm_head).to("cuda", dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", ["dense", "moe-packed"])
def test_cuda_graphs_equal_eager(hybrid, name, dtype):
    target, mtp = _on_cuda(hybrid[name][0], dtype)
    prompts = _prompts(target.config.vocab_size)
    res = {}
    for graphs in (False, True):
        dec = spec_decoder(target, _proposer("dual_anchor_zero_init", target, mtp), eos_token_id=[], cuda_graphs=graphs)
        assert isinstance(dec.runner, HybridTargetRunner) and dec.use_graphs == graphs
        res[graphs] = dec.generate(prompts, max_new_tokens=32, batch_size=6)
    assert res[True].tokens == res[False].tokens
    assert res[True].accepted == res[False].accepted


@pytest.mark.gpu
@pytest.mark.skipif(not gdn_kernels.available(), reason="flash-linear-attention / causal-conv1d not installed")
def test_fla_kernels_equal_torch_path(hybrid):
    target, _ = _on_cuda(hybrid["dense"][0], torch.bfloat16)
    runners = {k: HybridTargetRunner(target, LAYERS, kernels=k) for k in ("torch", "fla")}
    assert runners["fla"].kernels == "fla"
    prompts = _prompts(target.config.vocab_size, lengths=(7, 70, 3, 12))
    ids, lens = (t.cuda() for t in _padded(prompts))
    block = torch.randint(5, target.config.vocab_size, (len(prompts), 8), device="cuda")
    outs = {}
    for k, runner in runners.items():
        runner.allocate(len(prompts), 128)
        first = runner.prefill(ids, lens)
        v1 = runner.verify(block)
        runner.advance(torch.tensor([0, 8, 3, 1], device="cuda"))
        outs[k] = (first.logits, v1.logits, runner.verify(block.flip(1)).logits)
    for a, b in zip(outs["torch"], outs["fla"]):  # bf16: the two paths round differently
        assert torch.allclose(a.float(), b.float(), atol=5e-2, rtol=5e-2), (a.float() - b.float()).abs().max()
    for ct, cf in zip(runners["torch"].caches, runners["fla"].caches):
        if isinstance(ct, GDNCache):
            assert torch.allclose(ct.conv.float(), cf.conv.float(), atol=1e-2, rtol=1e-2)
            assert torch.allclose(ct.state, cf.state, atol=1e-2, rtol=1e-2)
