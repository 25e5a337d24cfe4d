"""Mixture-of-experts pieces shared by the MTP families and the MoE target runners.

* Routed SwiGLU experts in both checkpoint layouts: `PerExpertSwiGLU` (`{e}.gate_proj / up_proj /
  down_proj`, the released per-expert naming) and `PackedSwiGLU` (`gate_up_proj` [E, 2*Im, H] with the
  gate rows first, `down_proj` [E, H, Im]: transformers' in-memory layout). Both run inside CUDA-graph
  capture (on CUDA they never sync with the host; see `_SwiGLUExperts`).
* `GroupLimitedRouter` + `SigmoidMoE`: the DeepSeek-V3 / GLM-4-MoE MoE block. Router: sigmoid scores
  (fp32); `e_score_correction_bias` is added for the choice only; experts are split into `n_group`
  groups, each scored by the sum of its two best biased scores, and only the `topk_group` best groups
  compete for the top-k; the chosen experts' unbiased scores are renormalised if `norm_topk_prob` and
  multiplied by `routed_scaling_factor`. The block adds its shared experts (one SwiGLU) to the routed output.

Every shape is fixed by the config (no host values), so routing itself is graph-safe.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dmtp.models.qwen3 import Qwen3MLP


class _SwiGLUExperts(nn.Module):
    """Routed SwiGLU experts; call signature as transformers' experts: (hidden [N,H], top_k_index [N,K],
    top_k_weights [N,K]) -> sum_k w[n,k] * expert_{idx[n,k]}(hidden[n]).

    On CUDA (or with `sync_free = True`) every expert runs on every token with a zero weight where it is
    not routed: exact, no host sync, fixed shapes, so the same kernels run eagerly and inside a captured
    CUDA graph (identical numerics; the loop's graph warm-up rejects any stage that syncs), at E / top-k
    times the routed FLOPs. On CPU, where a host sync costs nothing, each expert runs on its own tokens
    only (one sync to list the hit experts). Both paths add the experts in ascending index order."""

    sync_free = False
    num_experts: int

    def _expert(self, e: int, h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(hidden)
        if self.sync_free or hidden.is_cuda:
            dense = torch.zeros(hidden.shape[0], self.num_experts, dtype=top_k_weights.dtype, device=hidden.device)
            dense.scatter_(1, top_k_index, top_k_weights)
            for e in range(self.num_experts):
                out += (self._expert(e, hidden) * dense[:, e, None]).to(out.dtype)
            return out
        for e in torch.unique(top_k_index).tolist():
            token, slot = torch.where(top_k_index == e)
            y = self._expert(e, hidden[token]) * top_k_weights[token, slot, None]
            out.index_add_(0, token, y.to(out.dtype))
        return out


class PerExpertSwiGLU(_SwiGLUExperts):
    """Experts as `{e}.gate_proj / up_proj / down_proj` (the per-expert checkpoint layout)."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.num_experts = num_experts
        for e in range(num_experts):
            self.add_module(str(e), Qwen3MLP(hidden_size, intermediate_size))

    def _expert(self, e: int, h: torch.Tensor) -> torch.Tensor:
        return self._modules[str(e)](h)


class PackedSwiGLU(_SwiGLUExperts):
    """Experts as `gate_up_proj` [E, 2*Im, H] (rows 0..Im-1 = gate) and `down_proj` [E, H, Im]."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.num_experts = num_experts
        self.gate_up_proj = nn.Parameter(torch.zeros(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.zeros(num_experts, hidden_size, intermediate_size))

    def _expert(self, e: int, h: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(h, self.gate_up_proj[e]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.down_proj[e])


def packed_experts(keys: list[str] | None, prefix: str = "mlp.experts.") -> bool:
    """Whether a checkpoint's block tensor names use the packed expert layout."""
    return keys is not None and any(k.startswith(prefix + "gate_up_proj") for k in keys)


class GroupLimitedRouter(nn.Module):
    """DeepSeek-V3 / GLM-4-MoE router (see module docstring). `weight` [E, H] and `e_score_correction_bias`
    [E] stay fp32 when the module is cast (as transformers keeps them); device moves take them along."""

    def __init__(self, num_experts: int, hidden_size: int, top_k: int, n_group: int, topk_group: int,
                 norm_topk_prob: bool, routed_scaling_factor: float):
        super().__init__()
        if num_experts % n_group:
            raise ValueError(f"n_routed_experts {num_experts} is not divisible by n_group {n_group}")
        self.num_experts, self.top_k = num_experts, top_k
        self.n_group, self.topk_group = n_group, topk_group
        self.norm_topk_prob, self.routed_scaling_factor = norm_topk_prob, float(routed_scaling_factor)
        self.weight = nn.Parameter(torch.zeros(num_experts, hidden_size, dtype=torch.float32))
        self.register_buffer("e_score_correction_bias", torch.zeros(num_experts, dtype=torch.float32))

    def _apply(self, fn, recurse=True):
        def keep_dtype(t):
            out = fn(t)
            return out if out.dtype == t.dtype else t.to(out.device)

        return super()._apply(keep_dtype, recurse)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, H] -> (weights [N, top_k] fp32, expert indices [N, top_k])."""
        scores = F.linear(x.float(), self.weight.float()).sigmoid()
        biased = scores + self.e_score_correction_bias
        n = x.shape[0]
        grouped = biased.view(n, self.n_group, self.num_experts // self.n_group)
        group_scores = grouped.topk(2, dim=-1).values.sum(-1)
        best_groups = group_scores.topk(self.topk_group, dim=-1, sorted=False).indices
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best_groups, True)
        keep = keep[:, :, None].expand_as(grouped).reshape(n, self.num_experts)
        index = biased.masked_fill(~keep, float("-inf")).topk(self.top_k, dim=-1, sorted=False).indices
        weights = scores.gather(1, index)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return weights * self.routed_scaling_factor, index


class SigmoidMoE(nn.Module):
    """`gate` (GroupLimitedRouter) + routed `experts` + `shared_experts` (checkpoint naming)."""

    def __init__(self, gate: GroupLimitedRouter, experts: _SwiGLUExperts, shared_experts: nn.Module):
        super().__init__()
        self.gate, self.experts, self.shared_experts = gate, experts, shared_experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, index = self.gate(flat)
        return self.experts(flat, index, weights).view(x.shape) + self.shared_experts(x)


def sigmoid_moe_from_config(config, packed: bool) -> SigmoidMoE:
    """A DeepSeek-V3 / GLM-4-MoE MoE block with zero weights; dimensions from transformers' config object
    (its class defaults fill what a checkpoint's config.json leaves out)."""
    h, e, im = config.hidden_size, config.n_routed_experts, config.moe_intermediate_size
    gate = GroupLimitedRouter(e, h, config.num_experts_per_tok, config.n_group, config.topk_group,
                              bool(config.norm_topk_prob), config.routed_scaling_factor)
    experts = (PackedSwiGLU if packed else PerExpertSwiGLU)(e, h, im)
    return SigmoidMoE(gate, experts, Qwen3MLP(h, im * config.n_shared_experts))


__all__ = ["PerExpertSwiGLU", "PackedSwiGLU", "packed_experts", "GroupLimitedRouter", "SigmoidMoE",
           "sigmoid_moe_from_config"]
