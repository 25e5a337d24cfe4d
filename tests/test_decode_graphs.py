"""CUDA-graph decoding == eager decoding (tokens and acceptance), the flash-attn path, and (on CPU) the
capture protocol itself: warm-up rounds followed by a state restore leave decoding unchanged."""
import pytest
import torch

from dmtp.decode import SamplingConfig, build_proposer
from dmtp.families.decoding import spec_decoder
from dmtp.decode.runners import flash_attn_available
from dmtp.drafters.block_drafter import fresh_drafter_for
from dmtp.families.dense import FastTargetRunner

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

PROMPTS = [[17, 45, 300, 12, 9, 81, 77, 5, 40], [210, 11, 61, 400, 8], [33, 90, 120, 7, 64, 15, 300],
           [5, 6, 7], [250, 251, 252, 253, 254, 255, 256, 257, 258, 259, 260, 261], [99, 100]]


def _drafter(target, name, device="cpu", dtype=torch.float32, block_size=8):
    return fresh_drafter_for(target, name, 3, perturb=0.05, block_size=block_size).to(device, dtype)


def _proposer(target, mtp, method, device="cpu", dtype=torch.float32):
    """`method`: ar, mtp415, or a variant, `<variant>@<B>` for a drafter with blocks of B (default 8)."""
    if method in ("ar", "mtp415"):
        return build_proposer(method, target, mtp=mtp)
    name, _, block = method.partition("@")
    drafter = _drafter(target, name, device, dtype, int(block or 8))
    return build_proposer("drafter", target, mtp=mtp, drafter=drafter, name=name)


# -- CPU: the capture protocol (warm-up + restore) with an eager stand-in for the graphs -------------

class _EagerGraphs:
    """Same protocol as RoundGraphs (warm-up passes that mutate the state, then `reset`), eager replay."""

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


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("method", ["mtp415", "context_fusion", "dual_anchor_zero_init", "multi_mtp_zero_init",
                                    "dual_anchor_zero_init@16"])
def test_warmup_restore_leaves_decoding_unchanged(micro_target, micro_mtp, method, monkeypatch, one_thread):
    eager = spec_decoder(micro_target, _proposer(micro_target, micro_mtp, method), eos_token_id=[])
    ref = eager.generate(PROMPTS, max_new_tokens=20, batch_size=3)

    import dmtp.decode.execution.graphs as graphs

    monkeypatch.setattr(graphs, "RoundGraphs", _EagerGraphs)
    fake = spec_decoder(micro_target, _proposer(micro_target, micro_mtp, method), eos_token_id=[], time_stages=False)
    fake.use_graphs = True  # exercise buckets (3 requests -> 4 rows), snapshot/restore, graph reuse
    for _ in range(2):  # the second call reuses the captured "graphs" and the state buffers
        out = fake.generate(PROMPTS, max_new_tokens=20, batch_size=3)
        assert out.tokens == ref.tokens
        assert out.accepted == ref.accepted
    assert len(fake._graphs) == 1


# -- GPU ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cuda_models(micro_target_dir):
    from dmtp.families.mtp_loading import load_native_mtp
    from dmtp.models.target import TargetModel

    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        t = TargetModel.from_pretrained(micro_target_dir, dtype=dtype, device="cuda")
        out[dtype] = (t, load_native_mtp(micro_target_dir, t.embed_tokens, t.lm_head))
    return out


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("method", ["ar", "mtp415", "raw_dflash", "dual_anchor_zero_init", "context_fusion",
                                    "hidden_residual_t1", "multi_mtp_zero_init", "raw_dflash@16",
                                    "dual_anchor_zero_init@16"])
def test_cuda_graphs_equal_eager(cuda_models, method, dtype):
    target, mtp = cuda_models[dtype]
    res = {}
    for graphs in (False, True):
        dec = spec_decoder(target, _proposer(target, mtp, method, "cuda", dtype), eos_token_id=[], cuda_graphs=graphs)
        assert dec.use_graphs == graphs
        for batch in (3, 6):  # bucket 4 with a padding row; bucket 8
            res[(graphs, batch)] = dec.generate(PROMPTS, max_new_tokens=40, batch_size=batch)
    for batch in (3, 6):
        eager, graph = res[(False, batch)], res[(True, batch)]
        assert graph.tokens == eager.tokens
        assert graph.accepted == eager.accepted
        assert graph.summary()["stage_ms_per_round"]["verify"] > 0


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("method", ["ar", "mtp415", "dual_anchor_zero_init"])
def test_cuda_graphs_fp32_lossless(cuda_models, method):
    target, mtp = cuda_models[torch.float32]
    eos = 0  # the embedded tokenizer's <|endoftext|>
    dec = spec_decoder(target, _proposer(target, mtp, method, "cuda"), eos_token_id=eos, cuda_graphs=True)
    out = dec.generate(PROMPTS, max_new_tokens=32, batch_size=4)
    with torch.no_grad():
        for p, toks in zip(PROMPTS, out.tokens):
            ref = target.hf.generate(torch.tensor([p], device="cuda"), max_new_tokens=32, do_sample=False,
                                     eos_token_id=eos, pad_token_id=eos)
            assert toks == ref[0, len(p):].tolist()


@pytest.mark.gpu
@gpu
def test_cuda_graphs_sampling_runs(cuda_models):
    target, mtp = cuda_models[torch.bfloat16]
    for mode in ("target_only", "rejection"):
        dec = spec_decoder(target, _proposer(target, mtp, "dual_anchor_zero_init", "cuda", torch.bfloat16),
                          eos_token_id=[], cuda_graphs=True)
        out = dec.generate(PROMPTS, max_new_tokens=24, batch_size=8,
                           sampling=SamplingConfig(temperature=0.8, top_p=0.9, verification=mode))
        assert all(len(t) == 24 for t in out.tokens)


@pytest.mark.gpu
@gpu
@pytest.mark.skipif(not flash_attn_available(), reason="flash-attn not installed")
def test_flash_attention_runner_matches_sdpa(cuda_models):
    target, mtp = cuda_models[torch.bfloat16]
    flash, sdpa = FastTargetRunner(target, [1, 3], attention="flash"), FastTargetRunner(target, [1, 3], attention="sdpa")
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 0, 0, 0]], device="cuda")
    lens = torch.tensor([6, 3], device="cuda")
    block = torch.tensor([[20, 21, 22, 23], [30, 31, 32, 33]], device="cuda")
    outs = []
    for r in (flash, sdpa):
        r.allocate(2, 64)
        pre = r.prefill(ids, lens, last_logits_only=True)
        outs.append((pre.logits, r.verify(block).logits))
    for a, b in zip(*outs):
        torch.testing.assert_close(a.float(), b.float(), atol=5e-2, rtol=5e-2)
    # decoding through the flash path, eager and graphs agree
    res = []
    for graphs in (False, True):
        dec = spec_decoder(target, _proposer(target, mtp, "mtp415"), eos_token_id=[], cuda_graphs=graphs,
                          attention="flash")
        assert dec.runner.attention == "flash"
        res.append(dec.generate(PROMPTS, max_new_tokens=32, batch_size=4))
    assert res[0].tokens == res[1].tokens
