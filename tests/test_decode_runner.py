"""Target runners: our static-cache forward on the HF weights == transformers, incl. batched prompts of
different lengths, verify blocks, rollback (not advancing) and the generic recompute fallback."""
import pytest
import torch

from dmtp.decode.runners import RecomputeTargetRunner
from dmtp.families.catalogue import make_target_runner
from dmtp.families.dense import FastTargetRunner, fast_runner_unsupported
from dmtp.models.target import TargetModel

LAYERS = [1, 3]  # 3 is the last layer: its tap is post-norm, as transformers' hidden_states[-1]
ATOL = 2e-5


def _ref(target, seq, layer_ids=LAYERS):
    return target(torch.tensor([seq]), layer_ids=layer_ids)


def _close(a, b):
    assert a.shape == b.shape, (a.shape, b.shape)
    assert torch.allclose(a, b, atol=ATOL, rtol=1e-4), (a - b).abs().max().item()


def _prompts():
    g = torch.Generator().manual_seed(0)
    lens = [5, 11, 3, 8]
    return [torch.randint(5, 500, (n,), generator=g).tolist() for n in lens]


def _padded(prompts):
    t = max(map(len, prompts))
    ids = torch.zeros(len(prompts), t, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, :len(p)] = torch.tensor(p)
    return ids, torch.tensor([len(p) for p in prompts])


@pytest.mark.parametrize("kind", ["fast", "recompute"])
def test_runner_matches_transformers(micro_target, kind):
    runner = make_target_runner(micro_target, LAYERS, kind=kind)
    assert runner.kind == kind
    prompts = _prompts()
    ids, lens = _padded(prompts)
    runner.allocate(len(prompts), 48)
    out = runner.prefill(ids, lens)
    for b, p in enumerate(prompts):
        ref = _ref(micro_target, p)
        n = len(p)
        _close(out.logits[b, :n], ref.logits[0])
        _close(out.layer_hidden[b, :n], ref.layer_hidden[0])
        _close(out.last_hidden[b, :n], ref.last_hidden[0])
    assert runner.lengths.tolist() == [len(p) for p in prompts]
    last = runner.prefill(ids, lens, last_logits_only=True)
    for b, p in enumerate(prompts):
        _close(last.logits[b, 0], _ref(micro_target, p).logits[0, -1])

    g = torch.Generator().manual_seed(1)
    block1 = torch.randint(5, 500, (len(prompts), 4), generator=g)
    block2 = torch.randint(5, 500, (len(prompts), 4), generator=g)
    v1 = runner.verify(block1)
    for b, p in enumerate(prompts):
        ref = _ref(micro_target, p + block1[b].tolist())
        _close(v1.logits[b], ref.logits[0, -4:])
        _close(v1.layer_hidden[b], ref.layer_hidden[0, -4:])
        _close(v1.last_hidden[b], ref.last_hidden[0, -4:])
    # rollback: nothing committed, a different block at the same positions overwrites the rows
    v2 = runner.verify(block2)
    for b, p in enumerate(prompts):
        _close(v2.logits[b], _ref(micro_target, p + block2[b].tolist()).logits[0, -4:])
    # commit a different number of rows per request, then verify again
    n = torch.tensor([1, 4, 0, 2])
    runner.advance(n)
    block3 = torch.randint(5, 500, (len(prompts), 3), generator=g)
    v3 = runner.verify(block3)
    for b, p in enumerate(prompts):
        seq = p + block2[b, :n[b]].tolist() + block3[b].tolist()
        _close(v3.logits[b], _ref(micro_target, seq).logits[0, -3:])


def test_fast_runner_binds_hf_parameters(micro_target):
    runner = FastTargetRunner(micro_target, LAYERS)
    hf_layer = micro_target.hf.model.layers[2]
    ours = runner.layers[2]
    assert ours.self_attn.q_proj.weight is hf_layer.self_attn.q_proj.weight
    assert ours.mlp.down_proj.weight.data_ptr() == hf_layer.mlp.down_proj.weight.data_ptr()
    assert ours.self_attn.k_norm.weight is hf_layer.self_attn.k_norm.weight
    assert runner.embed is micro_target.hf.model.embed_tokens
    assert fast_runner_unsupported(micro_target) is None
    assert runner.attention == "sdpa"  # CPU / fp32: no flash-attn


def _tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=97, n_positions=128, n_embd=32, n_layer=2, n_head=2, eos_token_id=1, bos_token_id=1)
    return TargetModel(GPT2LMHeadModel(cfg))


def test_generic_fallback_for_other_architectures():
    target = _tiny_gpt2()
    assert "gpt2" in fast_runner_unsupported(target)
    with pytest.warns(UserWarning, match="recompute runner.*gpt2"):
        runner = make_target_runner(target, [0])
    assert isinstance(runner, RecomputeTargetRunner)
    with pytest.raises(ValueError, match="runner=fast: no static-cache runner covers this gpt2 target"):
        make_target_runner(target, [0], kind="fast")
    with pytest.raises(ValueError, match="fast target runner"):
        FastTargetRunner(target, [0])
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12]]
    ids, lens = _padded(prompts)
    runner.allocate(2, 32)
    runner.prefill(ids, lens)
    block = torch.tensor([[20, 21, 22], [30, 31, 32]])
    out = runner.verify(block)
    for b, p in enumerate(prompts):
        ref = target(torch.tensor([p + block[b].tolist()]), layer_ids=[0])
        _close(out.logits[b], ref.logits[0, -3:])
        _close(out.layer_hidden[b], ref.layer_hidden[0, -3:])


def test_generic_fallback_decodes_losslessly():
    from dmtp.decode import build_proposer
    from dmtp.families.decoding import spec_decoder

    target = _tiny_gpt2()
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [40]]
    dec = spec_decoder(target, build_proposer("ar", target), eos_token_id=[])
    res = dec.generate(prompts, max_new_tokens=12, batch_size=2)
    for p, out in zip(prompts, res.tokens):
        seq = list(p)
        for _ in range(12):
            seq.append(int(target(torch.tensor([seq])).logits[0, -1].argmax()))
        assert out == seq[len(p):]


def _tiny_family(kind):
    import transformers

    torch.manual_seed(0)
    common = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False)
    if kind == "llama":  # Llama-3 RoPE scaling and biases everywhere
        cfg = transformers.LlamaConfig(**common, attention_bias=True, mlp_bias=True,
                                       rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                        "original_max_position_embeddings": 16})
        model = transformers.LlamaForCausalLM(cfg)
    else:  # Qwen2: q/k/v biases, no q/k norms
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    with torch.no_grad():  # non-trivial norms and biases
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return TargetModel(model.eval())


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_fast_runner_other_dense_families(family):
    target = _tiny_family(family)
    assert fast_runner_unsupported(target) is None
    runner = FastTargetRunner(target, [0, 2])
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14]]
    ids, lens = _padded(prompts)
    runner.allocate(2, 32)
    out = runner.prefill(ids, lens)
    block = torch.tensor([[20, 21, 22], [30, 31, 32]])
    ver = runner.verify(block)
    for b, p in enumerate(prompts):
        ref = _ref(target, p + block[b].tolist(), [0, 2])
        _close(out.logits[b, :len(p)], ref.logits[0, :len(p)])
        _close(ver.logits[b], ref.logits[0, -3:])
        _close(ver.layer_hidden[b], ref.layer_hidden[0, -3:])
