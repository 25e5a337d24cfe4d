"""DFlash2 block drafter: DFlash plus grouped dynamic causal convolutions and a candidate-path selector.

Backbone, context path, masks, block layout and checkpoint format are DFlash's (`dmtp.drafters.dflash`);
this file is the whole architecture: its config fields, their checks and config.json keys (`DFlash2Config`),
its modules, and its registration (`architecture=dflash2`, published as DFlash2DraftModel).
DFlash2 adds two things (reference/dflash.md §4):

* In every layer, `attention_conv` and `mlp_conv`: a per-position, per-channel-group causal
  convolution over the block stream. From a sublayer input u (the layer-norm output) at slot t,
  `kernel_projection(u_t)` gives, per side s in {0, 1}, tap o < K and channel group g, a correction
  d_t[s, o, g] to the learned `base_kernel[s, o, c]`. Side s mixes a stream z as
      conv_s(z)_t[c] = sum_o (base[s, o, c] + d_t[s, o, g(c)]) * z_{t-o}[c],
  with g(c) = c // conv_group_size (contiguous groups). Side 0 is applied to the sublayer's input and
  side 1 to its output, both with the coefficients from that one sublayer input:
      x1 = x  + conv_1(Attn(conv_0(LN1(x)), ctx))
      y  = x1 + conv'_1(MLP(conv'_0(LN2(x1))))
  Taps that reach before the first slot of the block or into another block (a different block id in
  a flattened multi-block layout) contribute zero, so blocks stay independent and slot t never sees a
  later slot through the convolution. The context rows are never convolved. A fresh conv is an exact
  identity: base tap 0 = 1, other taps 0, kernel_projection = 0.

* `candidate_selector`: a rank-r bilinear correction over the top-K candidates of the (transformed)
  unary logits at each predicted slot i,
      score_{i,k} = u_{i,k} + < E_p[prev_i] * (W_h h_i), E_s[c_{i,k}] >,
  where prev_i is the token chosen (decoding) or the gold token (training) before slot i. The
  successor codebook starts at zero, so a fresh selector proposes exactly DFlash's argmax.

Training (`auxiliary_loss`): alpha(step) * sum_i w_i * CE_K(score_i, gold_i) / sum_i w_i, the K-way
cross-entropy with teacher-forced predecessors. A gold token outside the unary top-K either replaces
the weakest candidate with its own unary score (`selector_gold_outside_topk: replace`, the SpecForge
PR #772 rule; every weighted slot is then trained) or gets no selector term (`skip`, the later strict
top-K rule; the denominator is still sum w, as in the joint loss [sum w CE + alpha sum w CE_sel] / sum w).
alpha is 0 for `selector_warmup_steps` optimizer steps, then ramps linearly to `selector_alpha` over
`selector_ramp_steps` steps.

Decoding (`propose`): greedy walks the slots in order, picking the best-scoring of the K candidates
given the previously chosen token (prev_1 = the token before the first predicted slot). At T > 0 each
slot samples from softmax(score / T) over its K candidates; the proposal distribution is returned
scattered back onto the full vocabulary, for rejection sampling.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from dmtp.drafters.dflash import DFlashConfig, DFlashDrafter, DFlashLayer, attend_block, default_sampler
from dmtp.drafters.registry import register_drafter

DFLASH2_ARCH = "DFlash2DraftModel"
# The published config's fields (a published config must name each): conv taps and channels per group;
# selector rank and top-K.
SHAPE_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
# Selector training (dmtp's own training schedule: never written to an export; read from older dmtp exports
# that carry it under dflash_config, else the defaults).
TRAINING_KEYS = ("selector_alpha", "selector_warmup_steps", "selector_ramp_steps", "selector_gold_outside_topk")


@dataclass
class DFlash2Config(DFlashConfig):
    """DFlash2's own fields; the defaults are a fresh drafter's (conf/drafter/dflash2.yaml repeats them)."""
    conv_kernel_size: int = 2
    conv_group_size: int = 16
    selector_rank: int = 32
    selector_top_k: int = 8
    selector_alpha: float = 1.0
    selector_warmup_steps: int = 0
    selector_ramp_steps: int = 0
    selector_gold_outside_topk: str = "replace"   # "replace" | "skip"
    training_options: ClassVar[tuple[str, ...]] = TRAINING_KEYS

    def check_options(self) -> None:
        missing = [k for k in SHAPE_KEYS if getattr(self, k) is None]
        if missing:
            raise ValueError(f"DFlash2 needs {', '.join(SHAPE_KEYS)}; missing {', '.join(missing)}")
        for k in SHAPE_KEYS:
            setattr(self, k, int(getattr(self, k)))
            if getattr(self, k) < 1:
                raise ValueError(f"{k} must be >= 1, got {getattr(self, k)}")
        if self.hidden_size % self.conv_group_size:
            raise ValueError(f"conv_group_size {self.conv_group_size} must divide hidden_size {self.hidden_size}")
        if self.selector_top_k > self.vocab_size:
            raise ValueError(f"selector_top_k {self.selector_top_k} exceeds vocab_size {self.vocab_size}")
        for k in TRAINING_KEYS:
            if getattr(self, k) is None:   # a config.json or a Hydra option that gives null: the default
                setattr(self, k, next(f.default for f in fields(self) if f.name == k))
        self.selector_alpha = float(self.selector_alpha)
        self.selector_warmup_steps = int(self.selector_warmup_steps)
        self.selector_ramp_steps = int(self.selector_ramp_steps)
        if self.selector_alpha < 0 or self.selector_warmup_steps < 0 or self.selector_ramp_steps < 0:
            raise ValueError("selector_alpha, selector_warmup_steps and selector_ramp_steps must be >= 0")
        if self.selector_gold_outside_topk not in ("replace", "skip"):
            raise ValueError("selector_gold_outside_topk must be 'replace' or 'skip', "
                             f"got {self.selector_gold_outside_topk!r}")

    def options_to_hf(self) -> dict:
        return {k: getattr(self, k) for k in SHAPE_KEYS}

    @classmethod
    def options_from_hf(cls, pick) -> dict:
        missing = [k for k in SHAPE_KEYS if pick(k) is None]
        if missing:
            raise ValueError(f"{DFLASH2_ARCH} config lacks dflash_config.{missing[0]}")
        return {k: pick(k) for k in (*SHAPE_KEYS, *TRAINING_KEYS)}


def causal_conv_taps(block_ids: torch.Tensor, kernel_size: int) -> torch.Tensor:
    """[B, T] block ids -> [B, T, K] bool: tap o of slot t is live iff slot t-o exists and is in the
    same block (so taps never cross a block boundary or reach before a block's first slot)."""
    b, t = block_ids.shape
    taps = torch.zeros(b, t, kernel_size, dtype=torch.bool, device=block_ids.device)
    taps[..., 0] = True
    for o in range(1, min(kernel_size, t)):
        taps[:, o:, o] = block_ids[:, o:] == block_ids[:, :-o]
    return taps


class GroupedDynamicCausalConv(nn.Module):
    """`base_kernel` [2, K, H] (side, tap, channel) + `kernel_projection` H -> 2*K*G (G = H / group)."""

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int):
        super().__init__()
        if hidden_size % group_size:
            raise ValueError(f"conv_group_size {group_size} must divide hidden_size {hidden_size}")
        self.hidden_size, self.kernel_size, self.group_size = hidden_size, kernel_size, group_size
        self.num_groups = hidden_size // group_size
        self.base_kernel = nn.Parameter(torch.empty(2, kernel_size, hidden_size))
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * self.num_groups, bias=False)
        if not self.base_kernel.is_meta:
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The identity: tap 0 weighs the current slot by 1, every other tap and the projection are 0."""
        self.base_kernel.zero_()
        self.base_kernel[:, 0] = 1.0
        nn.init.zeros_(self.kernel_projection.weight)

    def kernels(self, u: torch.Tensor) -> torch.Tensor:
        """u [B, T, H] (the sublayer input) -> per-slot kernels [B, T, 2, K, H]."""
        k, g, gs = self.kernel_size, self.num_groups, self.group_size
        d = self.kernel_projection(u).view(*u.shape[:-1], 2, k, g, 1)
        base = self.base_kernel.to(d.dtype).view(2, k, g, gs)
        return (base + d).flatten(-2)

    @staticmethod
    def mix(z: torch.Tensor, kernel: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
        """z [B, T, H], kernel [B, T, K, H] (one side), taps [B, T, K] -> sum_o kernel_o * z_{t-o}."""
        t = z.shape[1]
        out = kernel[:, :, 0] * z
        for o in range(1, min(kernel.shape[2], t)):
            shifted = F.pad(z[:, : t - o], (0, 0, o, 0))
            shifted = torch.where(taps[:, :, o, None], shifted, torch.zeros_like(shifted))
            out = out + kernel[:, :, o] * shifted
        return out


class DFlash2Layer(DFlashLayer):
    """A DFlash layer with dynamic causal convolutions on both sides of attention and of the MLP."""

    def __init__(self, hidden_size, num_heads, num_kv_heads, head_dim, intermediate_size, eps,
                 kernel_size: int, group_size: int):
        super().__init__(hidden_size, num_heads, num_kv_heads, head_dim, intermediate_size, eps)
        self.attention_conv = GroupedDynamicCausalConv(hidden_size, kernel_size, group_size)
        self.mlp_conv = GroupedDynamicCausalConv(hidden_size, kernel_size, group_size)

    def forward(self, x, cos, sin, ctx, mask, groups: int = 1, *, conv_taps):
        attn, conv = self.self_attn, self.attention_conv
        h = self.input_layernorm(x)
        kern = conv.kernels(h)
        h = conv.mix(h, kern[:, :, 0], conv_taps)
        q = attn.project_q(h, cos, sin)
        k, v = attn.project_kv(h, cos, sin)
        x = x + conv.mix(attn.output(attend_block(q, k, v, ctx, mask, groups)), kern[:, :, 1], conv_taps)
        conv = self.mlp_conv
        h = self.post_attention_layernorm(x)
        kern = conv.kernels(h)
        return x + conv.mix(self.mlp(conv.mix(h, kern[:, :, 0], conv_taps)), kern[:, :, 1], conv_taps)


class CandidateSelector(nn.Module):
    """`predecessor_codebook` E_p [V, r], `successor_codebook` E_s [V, r], `hidden_projection` W_h [r, H]."""

    def __init__(self, vocab_size: int, rank: int, hidden_size: int, init_std: float = 0.02):
        super().__init__()
        self.init_std = init_std
        self.predecessor_codebook = nn.Parameter(torch.empty(vocab_size, rank))
        self.successor_codebook = nn.Parameter(torch.empty(vocab_size, rank))
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)
        if not self.predecessor_codebook.is_meta:
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """E_p ~ N(0, std), W_h ~ N(0, std), E_s = 0: the selector starts as a no-op."""
        nn.init.normal_(self.predecessor_codebook, std=self.init_std)
        nn.init.normal_(self.hidden_projection.weight, std=self.init_std)
        nn.init.zeros_(self.successor_codebook)

    def query(self, hidden: torch.Tensor) -> torch.Tensor:
        """W_h h: [..., H] -> [..., r] (fp32)."""
        return self.hidden_projection(hidden).float()

    def scores(self, unary: torch.Tensor, candidates: torch.Tensor, prev: torch.Tensor,
               query: torch.Tensor) -> torch.Tensor:
        """unary/candidates [..., K], prev [...], query [..., r] -> u + <E_p[prev] * query, E_s[c]> [..., K]."""
        left = F.embedding(prev, self.predecessor_codebook).float() * query            # [..., r]
        right = F.embedding(candidates, self.successor_codebook).float()               # [..., K, r]
        return unary.float() + (right @ left[..., None]).squeeze(-1)


@register_drafter(name="dflash2", published=DFLASH2_ARCH, dmtp_published="DMTPDFlash2DraftModel",
                  config=DFlash2Config)
class DFlash2Drafter(DFlashDrafter):
    """DFlash2: DFlash2Layers (convolutions) and a candidate selector; same inputs, outputs and layout."""

    auxiliary_loss_name = "selector_loss"
    tensor_prefixes = (*DFlashDrafter.tensor_prefixes, "candidate_selector.")
    # The published names of the selector's codebooks are bare parameters; the reference package keeps them
    # in nn.Embedding modules, so its `save_pretrained` writes them with a `.weight` suffix.
    stored_aliases = {f"candidate_selector.{n}_codebook.weight": f"candidate_selector.{n}_codebook"
                      for n in ("predecessor", "successor")}

    def __init__(self, config: DFlash2Config):
        if not isinstance(config, DFlash2Config):
            raise ValueError(f"DFlash2Drafter needs a DFlash2Config, got {type(config).__name__}")
        super().__init__(config)
        c = config
        self.candidate_selector = CandidateSelector(c.vocab_size, c.selector_rank, c.hidden_size)
        if not self.fc.weight.is_meta:
            for layer in self.layers:  # init_linear_ in DFlashDrafter drew the projections: back to identity
                layer.attention_conv.reset_parameters()
                layer.mlp_conv.reset_parameters()

    def _make_layer(self, layer_idx: int) -> nn.Module:
        c = self.config
        return DFlash2Layer(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                            c.intermediate_size, c.rms_norm_eps, c.conv_kernel_size, c.conv_group_size)

    def _layer_inputs(self, noise_positions: torch.Tensor, block_ids: torch.Tensor) -> dict:
        return {"conv_taps": causal_conv_taps(block_ids, self.config.conv_kernel_size)}

    # -- selector ---------------------------------------------------------------------------------------
    def selector_alpha_at(self, step: int | None) -> float:
        """alpha: 0 during warm-up, then a linear ramp to `selector_alpha`; full alpha when step is None."""
        c = self.config
        if step is None:
            return c.selector_alpha
        step = int(step)
        if step < c.selector_warmup_steps:
            return 0.0
        if c.selector_ramp_steps > 0:
            return c.selector_alpha * min(1.0, (step - c.selector_warmup_steps + 1) / c.selector_ramp_steps)
        return c.selector_alpha

    def candidates(self, logits: torch.Tensor):
        """Top-K of the transformed unary logits [..., V] -> (scores [..., K] fp32, token ids [..., K])."""
        u, c = logits.float().topk(self.config.selector_top_k, dim=-1)
        return u, c

    def auxiliary_loss(self, hidden, lm_head_weight, labels, prev_tokens, weights, step=None, logits=None):
        """alpha(step) * sum w * CE_K(selector scores, gold) / sum w, predecessors teacher-forced."""
        alpha = self.selector_alpha_at(step)
        if alpha == 0.0:
            return torch.zeros((), device=hidden.device)
        if logits is None:
            logits = self.logits(hidden, lm_head_weight)
        logits = logits.float()
        u, cand = self.candidates(logits)                                    # [..., n, K]
        k = cand.shape[-1]
        hit = cand == labels[..., None]
        covered = hit.any(-1)
        target = hit.long().argmax(-1)                                       # gold's rank (0 when absent)
        if self.config.selector_gold_outside_topk == "replace":
            weakest = torch.zeros_like(hit)
            weakest[..., -1] = True
            swap = weakest & ~covered[..., None]
            cand = torch.where(swap, labels[..., None], cand)
            u = torch.where(swap, logits.gather(-1, labels[..., None]), u)
            target = torch.where(covered, target, torch.full_like(target, k - 1))
            live = torch.ones_like(covered)
        else:  # skip: no selector CE where the gold token is outside the unary top-K
            live = covered
        sel = self.candidate_selector
        scores = sel.scores(u, cand, prev_tokens, sel.query(hidden))
        ce = F.cross_entropy(scores.reshape(-1, k), target.reshape(-1), reduction="none").view_as(target)
        w = weights.float()
        return alpha * (ce * w * live).sum() / w.sum().clamp(min=1e-6)

    def propose(self, hidden, lm_head_weight, first_prev, temperature=0.0, generator=None, sampler=None,
                forced=None, vocab=None):
        """The selector's path over the top-K candidates (`walk_candidates`). hidden [..., n, H],
        first_prev [...] -> (tokens [..., n], q [..., n, V] fp32 or None when greedy). `sampler` as in
        DFlashDrafter.propose, applied to the K selector scores of each position in turn."""
        u, cand = self.candidates(self.logits(hidden, lm_head_weight, vocab))
        sel = self.candidate_selector
        query = sel.query(hidden)

        def score_at(i, prev_token, prev_rank):
            return sel.scores(u[..., i, :], cand[..., i, :], prev_token, query[..., i, :])

        tokens, probs = walk_candidates(cand, score_at, first_prev, sampler or default_sampler(temperature, generator),
                                        forced)
        if probs is None:
            return tokens, None
        full = torch.zeros(*probs.shape[:-1], self.config.vocab_size, dtype=probs.dtype, device=probs.device)
        return tokens, full.scatter(-1, cand, probs)


def walk_candidates(candidates: torch.Tensor, score_at, first_prev: torch.Tensor, sampler, forced=None):
    """DFlash2's one selector walk (dmtp's drafter and the vLLM proposer both take it): slot by slot over a
    block's top-K candidates [..., n, K], slot i's K scores are `score_at(i, prev_token, prev_rank)`, given
    the token chosen at slot i-1 (`first_prev`, the anchor's, before slot 1) and its rank among slot i-1's
    candidates (0 before slot 1: a score table indexed by rank holds the anchor's row there); `sampler(scores)`
    -> (rank [...], its K probabilities or None) picks one. `forced` (tokens [..., n], where [..., n]): slots
    whose token is given (the MTP's T1 in a DMTP block): the path goes through it.

    Returns (tokens [..., n], probabilities over each slot's candidates [..., n, K], or None when the sampler gives
    none)."""
    prev_token = first_prev
    prev_rank = torch.zeros_like(first_prev)
    tokens, probs = [], []
    for i in range(candidates.shape[-2]):
        prev_rank, p = sampler(score_at(i, prev_token, prev_rank))
        if p is not None:
            probs.append(p)
        prev_token = candidates[..., i, :].gather(-1, prev_rank[..., None]).squeeze(-1)
        if forced is not None:
            prev_token = torch.where(forced[1][..., i], forced[0][..., i], prev_token)
        tokens.append(prev_token)
    return torch.stack(tokens, dim=-1), (torch.stack(probs, dim=-2) if probs else None)


__all__ = ["CandidateSelector", "DFLASH2_ARCH", "DFlash2Config", "DFlash2Drafter", "DFlash2Layer",
           "GroupedDynamicCausalConv", "causal_conv_taps", "walk_candidates"]
