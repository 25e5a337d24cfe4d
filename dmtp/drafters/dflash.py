"""DFlash v1 block drafter: a small Qwen3-style decoder that fills a block of MASK slots in one pass.

The drafter owns no embedding table and no LM head: callers embed the block with the target's frozen
embedding (`embed_noise`) and turn hidden states into logits with the target's LM head (`logits`).
What it adds is the context path: the target's hidden states at `target_layer_ids`, concatenated,
go through `fc` and `hidden_norm` once, and every draft layer projects that context with its own
k_proj/k_norm/v_proj into extra keys/values in front of the block's own keys.

One mask builder, `dflash_attention_mask`, serves training (many blocks flattened into one sequence,
each with its own anchor) and decoding (one block): a block query sees
  * context keys strictly before its anchor (`ctx_positions < ctx_limit`), within the window on
    sliding layers, and
  * keys of its own block (all of them, or only earlier ones on causal layers, within the window).
Blocks never see each other, so running N blocks in one call equals N calls with one block each.

Decoding (one block per request) has its context K/V in static per-layer caches whose slot index is
the absolute position (`CachedContext`). There the layers do not copy the cache in front of the block's
keys (training's layout, `torch.cat`): each layer writes its block's K/V into its own cache at the
block's positions (scratch rows at or after the anchor, which the next context append overwrites) and
attends the cache in place under `cached_block_mask`, the same visibility folded onto the slot axis.

Parameter names equal the published DFlash tensor names, so `state_dict()` keys are the checkpoint keys.

A drafter architecture is one registered file, as an injection variant is: its module class carries
`@register_drafter(name=..., published=..., dmtp_published=..., config=...)`, and its config class (a
`DFlashConfig` subclass) holds the architecture's own fields, their checks (`check_options`) and their
config.json keys (`options_to_hf` / `options_from_hf`; an option that only configures training is named
in `training_options` and never written to an export). DFlash v1 registers here, DFlash2 in
`dmtp.drafters.dflash2`, DSpark in `dmtp.drafters.dspark`. Everything else reads the registry
(`dmtp.drafters.registry.ARCHITECTURES`): the factory (`architecture=<name>`), and `save_drafter` /
`load_drafter` (`dmtp.drafters.checkpoint`: the class of a config.json's `architectures`); the generic
hooks `auxiliary_loss` and `propose` let callers treat every drafter alike.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from dmtp.drafters.registry import DFLASH_ARCH, architecture_of_names, register_drafter
from dmtp.drafters.window_cache import ring_block_mask
from dmtp.models.block_size import BLOCK_SIZE_RANGE, require_block_size   # noqa: F401 - also read from here
from dmtp.models.qwen3 import (KVCache, Qwen3DecoderLayer, RMSNorm, additive_mask, attend, init_linear_,
                               rope_cos_sin, rope_inv_freq)
from dmtp.models.rope_config import DEFAULT_ROPE_THETA, rope_theta
from dmtp.models.temperature import scale_logits

FULL, SLIDING = "full_attention", "sliding_attention"


@dataclass
class DFlashConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    num_target_layers: int
    target_layer_ids: list[int]
    mask_token_id: int
    block_size: int = 8
    context_dim: int | None = None  # input width of `fc`; default len(target_layer_ids) * hidden_size
    rms_norm_eps: float = 1e-6
    rope_theta: float = DEFAULT_ROPE_THETA
    max_position_embeddings: int = 4096
    layer_types: list[str] | None = None  # per layer FULL or SLIDING; default all FULL
    sliding_window: int | None = None
    is_causal: bool | None = None  # None: sliding layers causal in-block, full layers bidirectional
    output_multiplier: float = 1.0
    final_logit_softcapping: float = 0.0
    input_embedding_scale: float = 1.0
    # The published architecture name (config.json `architectures`); set by `register_drafter`.
    architecture: ClassVar[str] = DFLASH_ARCH
    # The architecture's own fields that configure training only: never written to config.json (an export
    # describes the model), still read from older exports that carry them.
    training_options: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self):
        require_block_size(self.block_size, "drafter block_size")
        self.target_layer_ids = [int(i) for i in self.target_layer_ids]
        if self.context_dim is None:
            self.context_dim = len(self.target_layer_ids) * self.hidden_size
        if self.layer_types is None:
            self.layer_types = [FULL] * self.num_hidden_layers
        self.layer_types = list(self.layer_types)
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_hidden_layers} layers")
        if any(t not in (FULL, SLIDING) for t in self.layer_types):
            raise ValueError(f"layer_types must be '{FULL}' or '{SLIDING}', got {self.layer_types}")
        if any(not 0 <= i < self.num_target_layers for i in self.target_layer_ids):
            raise ValueError(f"target_layer_ids {self.target_layer_ids} out of range for {self.num_target_layers} target layers")
        self.check_options()

    # -- an architecture's own fields (none for DFlash v1): a subclass overrides these three --------------
    def check_options(self) -> None:
        """Check (and normalise) the architecture's own fields; one line per problem."""

    def options_to_hf(self) -> dict:
        """The architecture's own fields as written under config.json's `dflash_config` (its
        `training_options` excluded: `to_hf_config` drops them whatever this returns)."""
        return {}

    @classmethod
    def options_from_hf(cls, pick) -> dict:
        """The architecture's own fields from a config.json; `pick(key)` reads `dflash_config`, then the top level."""
        return {}

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        """The architecture's own fields (those a DFlash v1 config does not have)."""
        common = {f.name for f in fields(DFlashConfig)}
        return tuple(f.name for f in fields(cls) if f.name not in common)

    def with_training_options(self, options: Mapping) -> "DFlashConfig":
        """This config with its architecture's training options taken from `options` (a run's drafter config)
        where they are given: an export carries none, so a run that continues one (`init_from`) trains on
        the run's own schedule, not the defaults.

        Checked as any config is."""
        given = {k: options[k] for k in self.training_options if options.get(k) is not None}
        return replace(self, **given) if given else self

    @property
    def default_context_dim(self) -> int:
        return len(self.target_layer_ids) * self.hidden_size

    def is_causal_for(self, layer_idx: int) -> bool:
        if self.is_causal is not None:
            return bool(self.is_causal)
        return self.layer_types[layer_idx] == SLIDING

    def window_for(self, layer_idx: int) -> int | None:
        return self.sliding_window if self.layer_types[layer_idx] == SLIDING else None

    def to_hf_config(self) -> dict:
        dflash = {
            "mask_token_id": self.mask_token_id, "target_layer_ids": list(self.target_layer_ids),
            "block_size": self.block_size, "output_multiplier": self.output_multiplier,
            "final_logit_softcapping": self.final_logit_softcapping,
            "input_embedding_scale": self.input_embedding_scale,
        }
        if self.context_dim != self.default_context_dim:
            dflash["context_dim"] = self.context_dim
        dflash.update({k: v for k, v in self.options_to_hf().items() if k not in self.training_options})
        d = {
            "architectures": [self.architecture], "model_type": "qwen3",
            "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers, "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
            "vocab_size": self.vocab_size, "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
            "rope_scaling": None, "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0,
            "tie_word_embeddings": False, "num_target_layers": self.num_target_layers,
            "block_size": self.block_size, "layer_types": list(self.layer_types),
            "sliding_window": self.sliding_window, "use_sliding_window": SLIDING in self.layer_types,
        }
        if self.is_causal is not None:
            d["is_causal"] = self.is_causal
        d["dflash_config"] = dflash
        return d

    @classmethod
    def from_hf_config(cls, d: dict) -> "DFlashConfig":
        """Reads the published layout (`dflash_config` sub-dict) or the older one with block_size,
        mask_token_id and target_layer_ids at top level.

        Missing block_size falls back to 16 (as Z2). The config class is the registered one of `architectures`
        (DFlash v1 for any other name)."""
        sub = d.get("dflash_config") or {}

        def pick(key, default=None):
            return sub[key] if sub.get(key) is not None else d.get(key, default)

        n_layers = d["num_hidden_layers"]
        n_target = d.get("num_target_layers")
        ids = pick("target_layer_ids")
        if ids is None:
            if n_target is None:
                raise ValueError("config has neither target_layer_ids nor num_target_layers")
            ids = build_target_layer_ids(n_target, n_layers)
        if n_target is None:
            n_target = max(ids) + 1
        mask_id = pick("mask_token_id")
        if mask_id is None:
            raise ValueError("config has no mask_token_id (top level or dflash_config)")
        config_class = architecture_of_names(d.get("architectures") or []).config
        return config_class(
            hidden_size=d["hidden_size"], intermediate_size=d["intermediate_size"], num_hidden_layers=n_layers,
            num_attention_heads=d["num_attention_heads"],
            num_key_value_heads=d.get("num_key_value_heads", d["num_attention_heads"]),
            head_dim=d.get("head_dim") or d["hidden_size"] // d["num_attention_heads"],
            vocab_size=d["vocab_size"], num_target_layers=n_target, target_layer_ids=list(ids),
            mask_token_id=int(mask_id), block_size=pick("block_size", 16), context_dim=sub.get("context_dim"),
            rms_norm_eps=d.get("rms_norm_eps", 1e-6), rope_theta=rope_theta(d),
            max_position_embeddings=d.get("max_position_embeddings", 4096), layer_types=d.get("layer_types"),
            sliding_window=d.get("sliding_window"), is_causal=d.get("is_causal"),
            output_multiplier=float(pick("output_multiplier", 1.0)),
            final_logit_softcapping=float(pick("final_logit_softcapping", 0.0) or 0.0),
            input_embedding_scale=float(pick("input_embedding_scale", 1.0)), **config_class.options_from_hf(pick),
        )


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Reference default taps: [T//2] for one draft layer, else round(1 + i*(T-4)/(n-1)).

    For T <= 4 that formula leaves [0, T-1], so small targets get evenly spaced ids over 0..T-1 instead (repeats
    only when n > T)."""
    t, n = num_target_layers, num_draft_layers
    if t < 1 or n < 1:
        raise ValueError(f"need num_target_layers >= 1 and num_draft_layers >= 1, got {t}, {n}")
    if n == 1:
        return [t // 2]
    if t <= 4:
        return [round(i * (t - 1) / (n - 1)) for i in range(n)]
    return [round(1 + i * (t - 4) / (n - 1)) for i in range(n)]


def dflash_attention_mask(noise_positions: torch.Tensor, ctx_positions: torch.Tensor, ctx_limit: torch.Tensor,
                          block_ids: torch.Tensor, causal: bool = False, window: int | None = None) -> torch.Tensor:
    """Boolean mask [B, 1, Q, C+Q] (True = attend) over keys laid out as [context | block rows].

    noise_positions/ctx_limit/block_ids: [B, Q]; ctx_positions: [B, C]. Query q sees context key c iff
    ctx_positions[c] < ctx_limit[q] (the anchor: strictly-before), and on windowed layers also
    ctx_positions[c] >= noise_positions[q] - (window-1). It sees block row j iff block_ids[j] == block_ids[q],
    plus noise_positions[j] <= noise_positions[q] when causal and |pq - pj| < window when windowed.
    Padding context slots must carry a position >= every ctx_limit (e.g. a large int) to stay invisible.
    """
    pq = noise_positions[:, :, None]
    ctx = ctx_positions[:, None, :] < ctx_limit[:, :, None]
    blk = block_ids[:, :, None] == block_ids[:, None, :]
    pk = noise_positions[:, None, :]
    if causal:
        blk = blk & (pk <= pq)
    if window is not None:
        ctx = ctx & (ctx_positions[:, None, :] >= pq - (window - 1))
        blk = blk & ((pq - pk).abs() < window)
    return torch.cat([ctx, blk], dim=-1)[:, None]


# Training drafts every block of a sequence in one forward (B x N blocks x s rows). Under one dense mask over
# [context ; every block's rows] each query would pay for every other block's keys: 512 blocks of 16 beside 2048
# context slots make 10240 keys per query, of which ~1040 are visible. Consecutive blocks are attended in groups
# of at most this many rows instead, each group over [context ; its own rows]: the same visible keys, 4x fewer
# pairs at that size, for one copy of the context K/V per group (tools/micro/bench_block_attention.py: 512 rows was
# the fastest of 512 / 1024 / 2048 on CPU, x4.25 the dense mask's forward + backward). Fewer rows (decoding's one
# block) are one group; 0 turns grouping off (benchmarks compare both in one process).
BLOCK_GROUP_ROWS = 512


def block_groups(num_blocks: int, block_rows: int) -> int:
    """How many groups of consecutive blocks a forward's queries are attended in: the fewest that split the
    blocks evenly into groups of at most BLOCK_GROUP_ROWS rows, looked for up to twice that few; else 1 (one
    group: a count of blocks with no such divisor is attended whole, as before)."""
    if BLOCK_GROUP_ROWS <= 0:
        return 1
    per_group = max(1, BLOCK_GROUP_ROWS // block_rows)
    fewest = -(-num_blocks // per_group)
    if fewest <= 1:
        return 1
    return next((g for g in range(fewest, 2 * fewest + 1) if num_blocks % g == 0), 1)


def _rows_by_group(t: torch.Tensor, groups: int) -> torch.Tensor:
    """[B, heads, R, d] -> [B x groups, heads, R / groups, d]: consecutive rows to one group each."""
    b, h, r, d = t.shape
    return t.view(b, h, groups, r // groups, d).transpose(1, 2).reshape(b * groups, h, r // groups, d)


def attend_context_and_blocks(q, k, v, ctx_k, ctx_v, mask, groups: int = 1):
    """The block queries q [B, h, R, d] over [context K/V ; the blocks' own K/V k, v], under `mask` (`attend`'s
    forms). groups > 1: the rows split into that many groups of consecutive rows, each over [context ; its own
    rows], under a mask [B x groups, 1, R / groups, C + R / groups] (`DFlashDrafter.forward` builds it)."""
    if groups == 1:
        return attend(q, torch.cat([ctx_k, k], dim=2), torch.cat([ctx_v, v], dim=2), mask)
    b, h, r, d = q.shape
    keys = torch.cat([ctx_k.repeat_interleave(groups, dim=0), _rows_by_group(k, groups)], dim=2)
    values = torch.cat([ctx_v.repeat_interleave(groups, dim=0), _rows_by_group(v, groups)], dim=2)
    out = attend(_rows_by_group(q, groups), keys, values, mask)
    return out.view(b, groups, h, r // groups, d).transpose(1, 2).reshape(b, h, r, d)


def cached_block_mask(noise_positions: torch.Tensor, ctx_limit: torch.Tensor, width: int, causal: bool = False,
                      window: int | None = None) -> torch.Tensor:
    """`dflash_attention_mask` of one block per request whose rows sit in the context cache at their own
    positions: boolean [B, 1, Q, width] over cache slots (slot = absolute position).

    Query q sees slot j iff j < ctx_limit[q] (context) or j is one of the block's slots, with j <= pq when causal
    and |pq - j| < window when windowed. noise_positions/ctx_limit [B, Q]: the block's consecutive positions, each
    at or after its anchor ctx_limit, so the two parts never overlap; and since every context slot lies before every
    query, the causal and window rules apply to both parts alike. Slots from ctx_limit up to the block and after it
    (scratch rows of earlier rounds) stay hidden."""
    slots = torch.arange(width, device=noise_positions.device)
    pq = noise_positions[:, :, None]
    in_block = (slots >= noise_positions[:, :1, None]) & (slots <= noise_positions[:, -1:, None])
    visible = (slots < ctx_limit[:, :, None]) | in_block
    if causal:
        visible = visible & (slots <= pq)
    if window is not None:
        visible = visible & ((pq - slots).abs() < window)
    return visible[:, None]


@dataclass(frozen=True)
class CachedContext:
    """Decoding's context for `DFlashDrafter.forward`: each layer's static K/V cache (slot = absolute
    position), attended over its first `width` slots, one block per request.

    The block's own K/V go into the cache at the block's positions instead of after a copy of it (module docstring).
    `ring`: the slots of the sliding-window layers' caches when those are window caches
    (`dmtp.drafters.window_cache`: a ring bounded by the window, read whole), None when every layer's cache is
    indexed by position."""
    caches: Sequence[KVCache]
    width: int
    ring: int | None = None

    def mask(self, noise_positions: torch.Tensor, ctx_limit: torch.Tensor, causal: bool, window: int | None):
        if window is not None and self.ring is not None:
            return ring_block_mask(noise_positions, ctx_limit, self.ring, causal, window)
        return cached_block_mask(noise_positions, ctx_limit, self.width, causal, window)


@dataclass(frozen=True)
class CacheSink:
    """One layer's part of a `CachedContext`: its cache and the slots [B, Q] its block's K/V are written to."""
    cache: KVCache
    positions: torch.Tensor

    def keys_values(self, k: torch.Tensor, v: torch.Tensor):
        """Write the block's k/v [B, hkv, Q, d] at its slots (device-side indexing: no sync, static shapes);
        -> the whole cache, which the mask cuts to the attended width."""
        self.cache.write(self.positions, k, v)
        return self.cache.k, self.cache.v


def attend_block(q, k, v, ctx, mask, groups: int = 1):
    """The block queries q [B, h, R, d] with their own keys/values k, v [B, hkv, R, d] and the context `ctx`:
    a `CacheSink` (decoding: the block's K/V written into the cache, the cache attended in place) or the
    context's (k, v) [B, hkv, C, d] (training, the reference round, the walk: [context ; block] keys, in
    `groups` groups of consecutive rows, `attend_context_and_blocks`)."""
    if isinstance(ctx, CacheSink):
        return attend(q, *ctx.keys_values(k, v), mask)
    return attend_context_and_blocks(q, k, v, *ctx, mask, groups)


class DFlashLayer(Qwen3DecoderLayer):
    """Qwen3 pre-norm layer whose attention also reads the context's keys/values (`attend_block`)."""

    def forward(self, x, cos, sin, ctx, mask, groups: int = 1):
        attn = self.self_attn
        h = self.input_layernorm(x)
        q = attn.project_q(h, cos, sin)
        k, v = attn.project_kv(h, cos, sin)
        x = x + attn.output(attend_block(q, k, v, ctx, mask, groups))
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    """fc + hidden_norm over target taps, `num_hidden_layers` DFlashLayers, final norm (no embedding/LM head)."""

    # The checkpoint names this architecture owns (a tensor under them that it lacks is an error, not an
    # extra), and stored names it reads under its own (another writer's spelling of the same tensor).
    tensor_prefixes: ClassVar[tuple[str, ...]] = ("fc.", "hidden_norm.", "norm.", "layers.")
    stored_aliases: ClassVar[dict[str, str]] = {}

    def __init__(self, config: DFlashConfig):
        super().__init__()
        c = self.config = config
        self.fc = nn.Linear(c.context_dim, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = nn.ModuleList(self._make_layer(i) for i in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self._inv_freq: dict[torch.device, torch.Tensor] = {}  # not a buffer: state_dict stays = checkpoint
        if not self.fc.weight.is_meta:  # load_drafter builds on "meta" and assigns the stored tensors
            init_linear_(self)

    def _make_layer(self, layer_idx: int) -> nn.Module:
        c = self.config
        return DFlashLayer(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                           c.intermediate_size, c.rms_norm_eps)

    def _layer_inputs(self, noise_positions: torch.Tensor, block_ids: torch.Tensor) -> dict:
        """Extra keyword inputs every layer gets (computed once per forward); none for DFlash v1."""
        return {}

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype):
        dev = positions.device
        if dev not in self._inv_freq:
            self._inv_freq[dev] = rope_inv_freq(self.config.head_dim, self.config.rope_theta).to(dev)
        return rope_cos_sin(positions, self._inv_freq[dev], dtype)

    def embed_noise(self, ids: torch.Tensor, embed_weight: torch.Tensor) -> torch.Tensor:
        """Block embeddings from the target's frozen table, times `input_embedding_scale`."""
        e = F.embedding(ids, embed_weight)
        return e * self.config.input_embedding_scale if self.config.input_embedding_scale != 1.0 else e

    def project_context(self, features: torch.Tensor) -> torch.Tensor:
        """[B, C, context_dim] concatenated target taps -> [B, C, H]."""
        return self.hidden_norm(self.fc(features))

    def context_kv(self, ctx_hidden: torch.Tensor, ctx_positions: torch.Tensor):
        """Per layer (k, v) [B, hkv, C, d] for the projected context, RoPE'd at absolute positions.

        Context rows get no input_layernorm. Decoding can cache these rows and append new ones."""
        cos, sin = self._rope(ctx_positions, ctx_hidden.dtype)
        return [layer.self_attn.project_kv(ctx_hidden, cos, sin) for layer in self.layers]

    def forward(self, noise_embeds: torch.Tensor, noise_positions: torch.Tensor, ctx_kv, ctx_positions: torch.Tensor,
                ctx_limit: torch.Tensor, block_ids: torch.Tensor, block_rows: int | None = None) -> torch.Tensor:
        """noise_embeds [B, Q, H] (any number of blocks flattened), noise_positions/ctx_limit/block_ids [B, Q],
        ctx_kv from `context_kv` over ctx_positions [B, C]. ctx_limit is each query's anchor position: it sees
        context strictly before it.

        Invalid context slots: give them a position >= every ctx_limit. block_rows: the rows are consecutive blocks
        of this many (block ids in order), so that many blocks are attended in groups (`block_groups`); None: one
        group. Decoding passes a `CachedContext` instead (one block per request at consecutive positions; the
        cache's slot is the position, so ctx_positions is not read): the block's K/V are written into the caches.
        Returns hidden states [B, Q, H] after the final norm."""
        b, rows = noise_positions.shape
        if isinstance(ctx_kv, CachedContext):
            groups = 1
            layer_ctx = [CacheSink(cache, noise_positions) for cache in ctx_kv.caches]
            visibility = lambda causal, window: ctx_kv.mask(noise_positions, ctx_limit, causal, window)  # noqa: E731
        else:
            groups = block_groups(rows // block_rows, block_rows) if block_rows else 1
            # Each group's rows as a batch row of their own (`attend_context_and_blocks`), beside a copy of the context.
            by_group = (lambda t: t.reshape(b * groups, rows // groups)) if groups > 1 else (lambda t: t)  # noqa: E731
            mask_ctx = ctx_positions.repeat_interleave(groups, dim=0) if groups > 1 else ctx_positions
            layer_ctx = ctx_kv
            visibility = lambda causal, window: dflash_attention_mask(  # noqa: E731
                by_group(noise_positions), mask_ctx, by_group(ctx_limit), by_group(block_ids), causal, window)
        cos, sin = self._rope(noise_positions, noise_embeds.dtype)
        masks: dict[tuple, torch.Tensor] = {}
        extra = self._layer_inputs(noise_positions, block_ids)
        x = noise_embeds
        for i, layer in enumerate(self.layers):
            key = (self.config.is_causal_for(i), self.config.window_for(i))
            if key not in masks:   # built once per layer kind, in the additive form every layer reads as is
                masks[key] = additive_mask(visibility(*key), noise_embeds.dtype)
            x = layer(x, cos, sin, layer_ctx[i], masks[key], groups=groups, **extra)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor, lm_head_weight: torch.Tensor, vocab=None) -> torch.Tensor:
        """Target LM head, then `output_multiplier` and c*tanh(x/c) soft-capping when c > 0. `vocab`
        (dmtp.models.draft_vocab.DraftVocab, decoding only): the head over its V tokens, -inf elsewhere."""
        out = F.linear(hidden, lm_head_weight) if vocab is None else vocab.linear(hidden, lm_head_weight)
        if self.config.output_multiplier != 1.0:
            out = out * self.config.output_multiplier
        c = self.config.final_logit_softcapping
        if c > 0:
            out = c * torch.tanh(out / c)
        return out if vocab is None else vocab.expand(out)

    # -- generic hooks: the LightningModule and the decoding loop call these for every drafter ----------
    auxiliary_loss_name: str | None = None  # what `auxiliary_loss` is logged as (None: it is always 0)

    def auxiliary_loss(self, hidden: torch.Tensor, lm_head_weight: torch.Tensor, labels: torch.Tensor,
                       prev_tokens: torch.Tensor, weights: torch.Tensor, step: int | None = None,
                       logits: torch.Tensor | None = None) -> torch.Tensor:
        """Extra training loss on top of the position-decayed CE (already normalised by sum(weights)).
        hidden [..., n, H]; labels/prev_tokens/weights [..., n]: gold token, the gold token before it,
        loss weight; `step` the optimizer step; `logits` optionally the precomputed `logits(hidden)`.

        DFlash v1 has none: an exact zero."""
        return torch.zeros((), device=hidden.device)

    def block_logits(self, hidden: torch.Tensor, lm_head_weight: torch.Tensor,
                     prev_tokens: torch.Tensor) -> torch.Tensor:
        """Training logits of the predicted slots given each slot's predecessor on the gold path
        (teacher forcing): hidden [..., n, H], prev_tokens [..., n] -> [..., n, V]. Only a drafter whose
        proposal depends on the previous token (DSpark's Markov head) reads `prev_tokens`."""
        return self.logits(hidden, lm_head_weight)

    has_confidence = False   # whether `confidence` answers (a confidence head)

    def confidence(self, hidden: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor | None:
        """Each predicted slot's probability of being accepted given that its predecessor was: hidden
        [..., n, H], prev_tokens [..., n] -> [..., n] in (0, 1), or None for a drafter without a
        confidence head (every one but DSpark's)."""
        return None

    def propose(self, hidden: torch.Tensor, lm_head_weight: torch.Tensor, first_prev: torch.Tensor,
                temperature: float = 0.0, generator: torch.Generator | None = None, sampler=None, forced=None,
                vocab=None):
        """Candidates for the predicted slots: hidden [..., n, H], first_prev [...] (the token just before
        the first predicted slot) -> (tokens [..., n], q [..., n, V] or None). `forced`: None or (tokens,
        use) [..., n], slots whose candidate is fixed already (the MTP's): a proposal sequential in the
        previous token takes them as it walks; DFlash's slots do not depend on each other, so it ignores them.

        `sampler(scores [..., C]) -> (index [...], probs [..., C] or None)` picks among C scored options
        (the decoding loop passes its graph-safe sampler with the run's temperature/top-k/top-p);
        without one: argmax at temperature 0, else a softmax(scores / T) sample. `vocab`: a draft vocabulary
        (dmtp.models.draft_vocab): the proposals come from its tokens only."""
        sampler = sampler or default_sampler(temperature, generator)
        return sampler(self.logits(hidden, lm_head_weight, vocab))


def default_sampler(temperature: float = 0.0, generator: torch.Generator | None = None):
    def pick(scores: torch.Tensor):
        if temperature <= 0:
            return scores.argmax(-1), None
        q = torch.softmax(scale_logits(scores, temperature), dim=-1)
        idx = torch.multinomial(q.reshape(-1, q.shape[-1]), 1, generator=generator).view(q.shape[:-1])
        return idx, q
    return pick


register_drafter(name="dflash", published=DFLASH_ARCH, dmtp_published="DMTPDraftModel", config=DFlashConfig)(
    DFlashDrafter)


__all__ = ["BLOCK_GROUP_ROWS", "BLOCK_SIZE_RANGE", "CacheSink", "CachedContext", "DFlashConfig", "DFlashDrafter",
           "DFlashLayer", "DFLASH_ARCH", "FULL", "SLIDING", "attend_block", "attend_context_and_blocks", "block_groups",
           "build_target_layer_ids", "cached_block_mask", "default_sampler", "dflash_attention_mask",
           "require_block_size"]
