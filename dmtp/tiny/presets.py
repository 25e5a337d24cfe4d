"""Sizes of the embedded targets. `tiny` is the default; `micro` is for tests (built in seconds),
`micro_vllm` its twin that vLLM's CPU build can serve (head_dim 32).
`tiny_hybrid` / `micro_hybrid` are the same recipe on the Qwen3.5 text architecture (gated-DeltaNet
and gated full-attention layers, 3:1), the architecture DMTP is for.

The target is several times deeper than the 1-2 layer drafters trained on it, so that drafting
is cheaper than verifying on any machine, as it is for real models.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class TinyPreset:
    # A class attribute, not a field: the cache directory is named after the fields (build.py), and a
    # new field would rename, i.e. rebuild, every target already built.
    architecture: ClassVar[str] = "qwen3"
    # The native MTP in its own mtp.safetensors, beside the causal LM's weights (no real dense Qwen3 ships
    # an MTP; engines that load the causal LM alone, vLLM's dense Qwen3 included, then load the target as is).
    mtp_apart: ClassVar[bool] = True
    # What the target reads (dmtp.data.corpora's families: the standard library's code and documentation
    # and generated math, or generated assistant exchanges) and how many chained MTP steps its loss spans.
    corpus: ClassVar[str] = "stdlib"
    mtp_chain_depth: ClassVar[int] = 1

    name: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    seq_len: int
    batch_size: int
    steps: int
    lr: float
    mtp_loss_weight: float = 0.3
    warmup_steps: int = 50
    tokenizer_chars: int = 4_000_000   # corpus characters sampled to train the BPE
    docs_per_domain: int | None = None  # cap on training documents read per domain (micro)
    domain_weights: tuple[float, float, float] = (0.4, 0.3, 0.3)  # code, prose, math
    seed: int = 0


@dataclass(frozen=True)
class HybridPreset(TinyPreset):
    """Qwen3.5 text model (`Qwen3_5ForCausalLM`): the family's config defaults (3 linear-attention :
    1 full-attention layers, gated attention, partial rotary, x*(1+w) norms) at these sizes."""

    architecture: ClassVar[str] = "qwen3_5_text"
    # As the Qwen3.5 releases: `mtp.*` among the model's own weights, where vLLM's Qwen3.5 expects them.
    mtp_apart: ClassVar[bool] = False

    # Gated-DeltaNet heads in Qwen3.5's proportions: twice as many value heads as key heads, keys
    # half the width, values the whole width (Qwen3.5-9B: 16 x 128 keys, 32 x 128 values at 4096).
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    linear_key_head_dim: int = 16
    linear_value_head_dim: int = 16


@dataclass(frozen=True)
class AssistantPreset(TinyPreset):
    """The chat-model testbed: a dense Qwen3 target on the assistant corpus (requests answered as a served
    model answers them), its MTP trained over chained steps as it drafts."""

    corpus: ClassVar[str] = "assistant"
    mtp_chain_depth: ClassVar[int] = 4


@dataclass(frozen=True)
class AssistantHybridPreset(HybridPreset):
    """`AssistantPreset`'s corpus and chained MTP loss on the Qwen3.5 text architecture."""

    corpus: ClassVar[str] = "assistant"
    mtp_chain_depth: ClassVar[int] = 4


PRESETS = {
    "micro": TinyPreset(name="micro", vocab_size=512, hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2,
                        head_dim=16, intermediate_size=192, seq_len=128, batch_size=8, steps=250, lr=4e-3,
                        warmup_steps=20, tokenizer_chars=400_000, docs_per_domain=100),
    # `micro` with head_dim 32, the smallest attention head vLLM's CPU build runs (its attention kernels
    # take 32, 64, 80, ...; micro's 16 is refused): the target the vLLM interop tests serve (tests/vllm_interop).
    "micro_vllm": TinyPreset(name="micro_vllm", vocab_size=512, hidden_size=64, num_layers=4, num_heads=2,
                             num_kv_heads=1, head_dim=32, intermediate_size=192, seq_len=128, batch_size=8,
                             steps=250, lr=4e-3, warmup_steps=20, tokenizer_chars=400_000, docs_per_domain=100),
    # Narrow and deep. At a CPU budget of ten minutes the compute-optimal model is far smaller than
    # the data allows: measured at about equal build time, width 64 (0.7M parameters, 4.5M tokens) beat
    # width 96 (1.3M, 2.0M tokens), which beat width 128 (2.1M, 1.8M tokens), on every held-out
    # domain's top-1. Depth is what makes a 1-3 layer drafter cheap relative to verification. Small
    # batches, many steps: in a run this short, updates matter more than tokens per update.
    # 1500 steps of 6 sequences, not the 2200 x 8 first chosen: on a 2-core host ~1.6x slower per step
    # than the one the budget was set on, the quick start took 19 min (2200 x 8), then 18 (1500 x 8),
    # over its 15. A step costs about its batch (6: 0.78x of 8); at equal cost, fewer sequences per step
    # beat fewer steps (1500 x 5 vs 1000 x 8: math top-1 0.695 vs 0.648, code and prose equal).
    "tiny": TinyPreset(name="tiny", vocab_size=2048, hidden_size=64, num_layers=8, num_heads=2, num_kv_heads=1,
                       head_dim=32, intermediate_size=192, seq_len=256, batch_size=6, steps=1500, lr=3e-3),
    # `micro`'s sizes in the hybrid layout; a step costs ~1.5x a `micro` step, so 200 steps instead of 250
    # (150 left the MTP's held-out top-1 at 0.29, under what tests/test_tiny_hybrid.py asks).
    "micro_hybrid": HybridPreset(name="micro_hybrid", vocab_size=512, hidden_size=64, num_layers=4, num_heads=4,
                                 num_kv_heads=2, head_dim=16, intermediate_size=192, seq_len=128, batch_size=8,
                                 steps=200, lr=4e-3, warmup_steps=20, tokenizer_chars=400_000, docs_per_domain=100),
    # `tiny`'s width, depth (6 gated-DeltaNet + 2 full-attention layers), data and schedule. A joint
    # step (target + MTP) costs ~1.6x a `tiny` step on the CPU (transformers' torch chunked delta rule;
    # measured side by side), so 2200 / 1.6 ~ 1400 steps gave about the build time of `tiny`'s former 2200
    # steps (BENCHMARKS.md); it is not in the quick start.
    "tiny_hybrid": HybridPreset(name="tiny_hybrid", vocab_size=2048, hidden_size=64, num_layers=8, num_heads=2,
                                num_kv_heads=1, head_dim=32, intermediate_size=192, seq_len=256, batch_size=8,
                                steps=1400, lr=3e-3),
    # `micro` on the assistant corpus: the chat-model testbed's build, data and decoding in tests.
    "micro_assistant": AssistantPreset(name="micro_assistant", vocab_size=512, hidden_size=64, num_layers=4,
                                       num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=192, seq_len=128,
                                       batch_size=8, steps=250, lr=4e-3, warmup_steps=20, tokenizer_chars=400_000,
                                       docs_per_domain=300),
    # `tiny`'s and `tiny_hybrid`'s sizes and schedules on the assistant corpus; the 4 chained MTP steps make a
    # step ~1.6x theirs. In the published regime on code and math (docs/results.md §10).
    "assistant": AssistantPreset(name="assistant", vocab_size=2048, hidden_size=64, num_layers=8, num_heads=2,
                                 num_kv_heads=1, head_dim=32, intermediate_size=192, seq_len=256, batch_size=6,
                                 steps=1500, lr=3e-3),
    # `assistant` stopped early (200 of its 1500 steps, the schedule over those 200): the same corpus and chained MTP
    # loss, a target between the base-model regime of `tiny` and the chat-model regime of `assistant` on the
    # quantities that decide acceptance (docs/results.md §11's map across targets).
    "assistant_early": AssistantPreset(name="assistant_early", vocab_size=2048, hidden_size=64, num_layers=8,
                                       num_heads=2, num_kv_heads=1, head_dim=32, intermediate_size=192, seq_len=256,
                                       batch_size=6, steps=200, lr=3e-3),
    "assistant_hybrid": AssistantHybridPreset(name="assistant_hybrid", vocab_size=2048, hidden_size=64, num_layers=8,
                                              num_heads=2, num_kv_heads=1, head_dim=32, intermediate_size=192,
                                              seq_len=256, batch_size=8, steps=1400, lr=3e-3),
}


def get_preset(name: str) -> TinyPreset:
    if name not in PRESETS:
        raise ValueError(f"unknown tiny-target preset {name!r}; choose from {', '.join(PRESETS)}")
    return PRESETS[name]
