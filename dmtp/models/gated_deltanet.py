"""Gated DeltaNet, the linear-attention layer of Qwen3-Next / Qwen3.5 / Qwen3.6, over per-request state.

Per value head, with a state S [d_k, d_v] kept in fp32 (as transformers keeps it):

    S_t = exp(g_t) S_{t-1};   u_t = beta_t (v_t - S_t^T k_t);   S_t = S_t + k_t u_t^T;   o_t = S_t^T q_t

q, k, v come out of a depthwise causal conv1d (kernel K, SiLU) whose state is the last K-1 inputs;
q and k are L2-normalised per head (q also scaled by 1/sqrt(d_k)); each key head serves
`num_v_heads / num_k_heads` consecutive value heads; beta = sigmoid(b); g = -exp(A_log) softplus(a + dt_bias).
The output is RMSNorm(o) * SiLU(z) (a plain-weight gated norm), then out_proj.

Chunk form, one rule for the prompt's chunks and for the K+1 verify rows: inside a chunk with
cumulative log-decay G_t = g_1 + ... + g_t, the corrections u solve a unit lower-triangular system

    (I + A) U = beta V - (beta e^G K) S_0,      A[t, s] = beta_t e^{G_t - G_s} k_t.k_s   (s < t)

and then   o_t = e^{G_t} S_0^T q_t + sum_{s<=t} e^{G_t - G_s} (q_t.k_s) u_s
           S_t = e^{G_t} S_0       + sum_{s<=t} e^{G_t - G_s} k_s u_s^T.

A prompt runs chunk by chunk carrying only the state; a verify block keeps S_t after EVERY row
(`GDNCache.rows`) and the conv window it read (`GDNCache.window`), so `GDNCache.commit(n)` can take
each request's state after its own accepted rows with device indices: no re-run, no host sync.
Right-padded prompt rows get g = 0 and beta = 0, which leaves the state untouched, so the state kept
is the one after each request's own last token.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dmtp.models import gdn_kernels

PROMPT_CHUNK = 64


# ---------------------------------------------------------------------------------------------------
# the gated delta rule in plain torch (fp32, head-first [B, H, T, d])
# ---------------------------------------------------------------------------------------------------

def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _decays(gamma: torch.Tensor) -> torch.Tensor:
    """[..., T] cumulative log-decays -> [..., T, T] with e^{G_t - G_s} where s <= t, else 0."""
    t = gamma.shape[-1]
    above = torch.ones(t, t, dtype=torch.bool, device=gamma.device).triu(1)
    # Masked before exp: above the diagonal G_t - G_s > 0 and could overflow.
    return (gamma[..., :, None] - gamma[..., None, :]).masked_fill(above, float("-inf")).exp()


def _chunk(q, k, v, g, beta, state):
    """One chunk from `state`: its outputs o [B,H,T,dv], corrections u [B,H,T,dv], cumulative
    log-decays G [B,H,T] and decay matrix [B,H,T,T] (see module docstring)."""
    gamma = g.cumsum(-1)
    decay = _decays(gamma)
    a = (k @ k.transpose(-1, -2)) * decay.tril(-1) * beta[..., None]
    rhs = torch.cat([v * beta[..., None], k * (beta * gamma.exp())[..., None]], dim=-1)
    # unitriangular: the (zero) diagonal of `a` is read as ones, i.e. this solves (I + A) X = rhs.
    sol = torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)
    w, k_cum = sol.split([v.shape[-1], k.shape[-1]], dim=-1)
    u = w - k_cum @ state
    out = (q * gamma.exp()[..., None]) @ state + ((q @ k.transpose(-1, -2)) * decay) @ u
    return out, u, gamma, decay


def delta_rule_prompt(q, k, v, g, beta, chunk: int = PROMPT_CHUNK):
    """Whole prompts from a zero state: q/k/v [B,H,T,d], g/beta [B,H,T] (fp32, q/k normalised and q
    scaled) -> (o [B,H,T,dv], final state [B,H,dk,dv])."""
    b, h, t, dk = k.shape
    chunk = min(chunk, t)
    pad = (-t) % chunk  # zero rows (g = 0, beta = 0) leave the state as it is
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    state = q.new_zeros(b, h, dk, v.shape[-1])
    outs = []
    for s in range(0, t + pad, chunk):
        ck = k[:, :, s:s + chunk]
        out, u, gamma, _ = _chunk(q[:, :, s:s + chunk], ck, v[:, :, s:s + chunk], g[:, :, s:s + chunk],
                                  beta[:, :, s:s + chunk], state)
        outs.append(out)
        last = gamma[..., -1:]
        state = last.exp()[..., None] * state + (ck * (last - gamma).exp()[..., None]).transpose(-1, -2) @ u
    return torch.cat(outs, dim=2)[:, :, :t], state


def delta_rule_rows(q, k, v, g, beta, state):
    """A few rows continuing `state` [B,H,dk,dv]: -> (o [B,H,T,dv], the state after every row [B,H,T,dk,dv])."""
    out, u, gamma, decay = _chunk(q, k, v, g, beta, state)
    weighted_k = decay[..., None] * k[:, :, None]                                     # [B,H,T(t),T(s),dk]
    rows = gamma.exp()[..., None, None] * state[:, :, None] + weighted_k.transpose(-1, -2) @ u[:, :, None]
    return out, rows


# ---------------------------------------------------------------------------------------------------
# per-request state
# ---------------------------------------------------------------------------------------------------

class GDNCache:
    """One GDN layer's decoding state: `conv` [B, C, K-1] (model dtype) and `state` [B, H, dk, dv]
    (fp32), both as of each request's committed length; plus what the last verify block saw:
    `window` [B, C, K-1+S] (the old conv state followed by the S rows' conv inputs) and `rows`
    [B, S, H, dk, dv] (the recurrent state after each row).

    Rows are buffers allocated once per block width and kept per width (a round may verify fewer rows than the
    block: verify_length), outside any CUDA-graph capture (the first verify of a width runs eagerly); `window` /
    `rows` are the last verify's, which `commit` reads."""

    def __init__(self, batch, channels, kernel, heads, head_k_dim, head_v_dim, dtype, device):
        self.conv = torch.zeros(batch, channels, kernel - 1, dtype=dtype, device=device)
        self.state = torch.zeros(batch, heads, head_k_dim, head_v_dim, dtype=torch.float32, device=device)
        self.window: torch.Tensor | None = None
        self.rows: torch.Tensor | None = None
        self._by_width: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._taps = torch.arange(kernel - 1, device=device)
        self._batch = torch.arange(batch, device=device)

    def block_buffers(self, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        if width not in self._by_width:
            b, c, k1 = self.conv.shape
            self._by_width[width] = (
                torch.zeros(b, c, k1 + width, dtype=self.conv.dtype, device=self.conv.device),
                torch.zeros(b, width, *self.state.shape[1:], dtype=torch.float32, device=self.conv.device))
        self.window, self.rows = self._by_width[width]
        return self.window, self.rows

    def commit(self, n: torch.Tensor) -> None:
        """Keep each request's state after its first n[b] rows of the last block (n = 0: unchanged)."""
        if self.rows is None:
            raise RuntimeError("GDNCache.commit before any verify block")
        b, c, k1 = self.conv.shape
        width = self.rows.shape[1]
        n = n.clamp(0, width)
        self.conv.copy_(self.window.gather(2, (n[:, None, None] + self._taps).expand(b, c, k1)))
        after = self.rows.flatten(0, 1).index_select(0, self._batch * width + (n - 1).clamp(min=0))
        self.state.copy_(torch.where((n > 0)[:, None, None, None], after, self.state))


# ---------------------------------------------------------------------------------------------------
# the layer
# ---------------------------------------------------------------------------------------------------

class GatedRMSNorm(nn.Module):
    """RMSNorm(x) * SiLU(z) with a plain weight, in transformers' order of casts."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        x = self.weight * x.to(dtype)
        return (x * F.silu(z.float())).to(dtype)


class GatedDeltaNet(nn.Module):
    """Parameter names as transformers': Qwen3.5/3.6 (`in_proj_qkv`, `in_proj_z`, `in_proj_b`,
    `in_proj_a`) or Qwen3-Next (`in_proj_qkvz`, `in_proj_ba`, grouped per key head). `use_kernels`
    routes the conv and the recurrence through `gdn_kernels` (fla / causal-conv1d on CUDA)."""

    def __init__(self, hidden_size: int, num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int,
                 kernel: int, eps: float, grouped_projections: bool = False, conv_bias: bool = False):
        super().__init__()
        self.num_k_heads, self.num_v_heads = num_k_heads, num_v_heads
        self.head_k_dim, self.head_v_dim, self.kernel = head_k_dim, head_v_dim, kernel
        self.key_dim, self.value_dim = num_k_heads * head_k_dim, num_v_heads * head_v_dim
        self.channels = 2 * self.key_dim + self.value_dim
        self.grouped_projections = grouped_projections
        if grouped_projections:
            self.in_proj_qkvz = nn.Linear(hidden_size, 2 * self.key_dim + 2 * self.value_dim, bias=False)
            self.in_proj_ba = nn.Linear(hidden_size, 2 * num_v_heads, bias=False)
        else:
            self.in_proj_qkv = nn.Linear(hidden_size, self.channels, bias=False)
            self.in_proj_z = nn.Linear(hidden_size, self.value_dim, bias=False)
            self.in_proj_b = nn.Linear(hidden_size, num_v_heads, bias=False)
            self.in_proj_a = nn.Linear(hidden_size, num_v_heads, bias=False)
        self.conv1d = nn.Conv1d(self.channels, self.channels, kernel, groups=self.channels, bias=conv_bias)
        self.dt_bias = nn.Parameter(torch.ones(num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(num_v_heads))
        self.norm = GatedRMSNorm(head_v_dim, eps)
        self.out_proj = nn.Linear(self.value_dim, hidden_size, bias=False)
        self.use_kernels = False

    def new_cache(self, batch: int, dtype, device) -> GDNCache:
        return GDNCache(batch, self.channels, self.kernel, self.num_v_heads, self.head_k_dim, self.head_v_dim,
                        dtype, device)

    # -- pieces ---------------------------------------------------------------------------------------
    def _project(self, x):
        """x [B,T,H] -> conv inputs [B,T,C] (channels q|k|v), z [B,T,Hv,dv], b and a [B,T,Hv]."""
        b_, t, _ = x.shape
        if not self.grouped_projections:
            return (self.in_proj_qkv(x), self.in_proj_z(x).view(b_, t, self.num_v_heads, self.head_v_dim),
                    self.in_proj_b(x), self.in_proj_a(x))
        hk, per = self.num_k_heads, self.num_v_heads // self.num_k_heads
        qkvz = self.in_proj_qkvz(x).view(b_, t, hk, -1)
        q, k, v, z = qkvz.split([self.head_k_dim, self.head_k_dim, per * self.head_v_dim, per * self.head_v_dim], -1)
        b, a = self.in_proj_ba(x).view(b_, t, hk, 2 * per).split([per, per], -1)
        mixed = torch.cat([q.reshape(b_, t, -1), k.reshape(b_, t, -1), v.reshape(b_, t, -1)], dim=-1)
        return (mixed, z.reshape(b_, t, self.num_v_heads, self.head_v_dim), b.reshape(b_, t, -1),
                a.reshape(b_, t, -1))

    def _conv(self, window: torch.Tensor) -> torch.Tensor:
        """SiLU(causal conv) of the last T columns of `window` [B, C, K-1+T] -> [B, T, C]."""
        if self.use_kernels:
            out = gdn_kernels.conv_silu(window, self.conv1d.weight, self.conv1d.bias)
        else:
            out = F.silu(F.conv1d(window, self.conv1d.weight, self.conv1d.bias, groups=self.channels))
        return out.transpose(1, 2)

    def _heads(self, conv_out, a, b):
        bsz, t, _ = conv_out.shape
        q, k, v = conv_out.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(bsz, t, self.num_k_heads, self.head_k_dim)
        k = k.reshape(bsz, t, self.num_k_heads, self.head_k_dim)
        v = v.reshape(bsz, t, self.num_v_heads, self.head_v_dim)
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        return q, k, v, g, b.sigmoid()

    def _head_first(self, q, k, v, g, beta):
        """[B,T,heads,d] -> fp32 [B,Hv,T,d] with q/k normalised, q scaled and key heads shared out."""
        rep = self.num_v_heads // self.num_k_heads
        q, k = (l2norm(x.float()).repeat_interleave(rep, dim=2) for x in (q, k))
        q = q * self.head_k_dim ** -0.5
        return (q.transpose(1, 2), k.transpose(1, 2), v.float().transpose(1, 2), g.transpose(1, 2),
                beta.float().transpose(1, 2))

    def _finish(self, o, z):
        """o [B,T,Hv,dv] -> out_proj(RMSNorm(o) * SiLU(z))."""
        b, t = o.shape[:2]
        return self.out_proj(self.norm(o.to(z.dtype), z).reshape(b, t, -1))

    # -- prompts and verify blocks ----------------------------------------------------------------------
    def forward_prompt(self, x: torch.Tensor, lengths: torch.Tensor, cache: GDNCache) -> torch.Tensor:
        """Right-padded prompts x [B,T,H] with valid lengths [B]; sets `cache` to the state after each
        request's last valid row."""
        bsz, t, _ = x.shape
        mixed, z, b, a = self._project(x)
        window = F.pad(mixed.transpose(1, 2), (self.kernel - 1, 0))           # zero initial conv state
        q, k, v, g, beta = self._heads(self._conv(window), a, b)
        valid = (torch.arange(t, device=x.device)[None, :] < lengths[:, None])[..., None]
        g, beta = g * valid, beta * valid                                       # padding: state untouched
        if self.use_kernels:
            o, state = gdn_kernels.delta_rule_prompt(q, k, v, g, beta)
        else:
            o, state = delta_rule_prompt(*self._head_first(q, k, v, g, beta))
            o = o.transpose(1, 2)
        taps = lengths[:, None, None] + torch.arange(self.kernel - 1, device=x.device)
        cache.conv.copy_(window.gather(2, taps.expand(bsz, self.channels, -1)))
        cache.state.copy_(state)
        return self._finish(o, z)

    def forward_rows(self, x: torch.Tensor, cache: GDNCache) -> torch.Tensor:
        """Rows x [B,S,H] right after each request's committed state; `cache` keeps the window and the
        state after every row for `GDNCache.commit`, its committed state is left as it is."""
        mixed, z, b, a = self._project(x)
        window, rows = cache.block_buffers(x.shape[1])
        k1 = self.kernel - 1
        window[:, :, :k1].copy_(cache.conv)
        window[:, :, k1:].copy_(mixed.transpose(1, 2))
        q, k, v, g, beta = self._heads(self._conv(window), a, b)
        if self.use_kernels:
            o, states = gdn_kernels.delta_rule_rows(q, k, v, g, beta, cache.state)
            rows.copy_(states)
        else:
            o, states = delta_rule_rows(*self._head_first(q, k, v, g, beta), cache.state)
            rows.copy_(states.transpose(1, 2))
            o = o.transpose(1, 2)
        return self._finish(o, z)


__all__ = ["GatedDeltaNet", "GatedRMSNorm", "GDNCache", "delta_rule_prompt", "delta_rule_rows", "l2norm",
           "PROMPT_CHUNK"]
