"""The block drafter as one unit: a DFlash or DFlash2 backbone and the injection that feeds it.

It is built (`build_block_drafter`, Hydra's conf/drafter/*.yaml), trained (the LightningModule holds
it as one module), saved (`BlockDrafter.save`) and loaded (`load_block_drafter`) together, so no
caller pairs a drafter with an injection by hand and the two can never disagree on the context width.

On disk it is the published DFlash layout (config.json + model.safetensors under the reference names,
which the reference package, vLLM and SGLang load) plus the injection's own tensors under
`dmtp_injection.` and, under config.json's "dmtp" section, the variant's name and options. A variant
that reads the MTP is named by its own architecture (`DMTPDraftModel`, `DMTPDFlash2DraftModel`), so
no engine mistakes it for raw DFlash; a raw DFlash export is exactly the published drafter. A plain
published DFlash drafter (no "dmtp" section) loads as `raw_dflash` unless told otherwise. A drafter
trained with its MTP (model.train_mtp) also carries `mtp.safetensors`: the tuned MTP under the target
checkpoint's own names (`tuned_mtp_path` finds it; the target is never modified). A drafter with an MTP
correction (`mtp_correction_rank`, dmtp.models.mtp_correction: a zero-init low-rank correction of the frozen
MTP's logits, trained on the target's outputs) carries its tensors under `dmtp_mtp_correction.` and its rank
in the "dmtp" section; `proposing_mtp` is the MTP it proposes T1 (and the chain) with.

Layering: models (target, MTP, backbones) -> injection (variants) -> this module -> training, decoding.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from dmtp.drafters.checkpoint import load_drafter, read_drafter_config, save_drafter
from dmtp.drafters.dflash import CachedContext, DFlashConfig, DFlashDrafter, require_block_size
from dmtp.drafters.factory import build_drafter, target_layer_ids_for
from dmtp.drafters.fit import require_block_fit, require_context_width
from dmtp.drafters.registry import method_name
from dmtp.injection import Injection, variant_of
from dmtp.injection.catalogue import CATALOGUE, make_injection, variant
from dmtp.models.model_card import write_card
from dmtp.models.mtp_correction import MTPCorrection, ProposingMTP, require_correction_rank
from dmtp.models.mtp_checkpoint import TUNED_MTP_NAME, save_tuned_mtp
from dmtp.models.provenance import target_provenance

INJECTION_PREFIX = "dmtp_injection."
CORRECTION_PREFIX = "dmtp_mtp_correction."


@dataclass
class MTPBlockInputs:
    """What the MTP gives each block: tokens [..., S] (T1..TS), hidden [..., S, H] (h_j predicted T_j),
    num [...] (m: how many of them the block uses, 1..S) and, when drafts are sampled, their proposal
    distributions q [..., S, V]."""
    tokens: torch.Tensor
    hidden: torch.Tensor
    num: torch.Tensor
    q: torch.Tensor | None = None


@dataclass
class DraftedBlock:
    """`BlockDrafter.draft_block`'s answer for blocks [B, N]: the drafter's final hidden states at the
    predicted slots [B, N, n_pred, H]; the token before the first predicted slot [B, N]; and, when an
    LM head was given, the block's K candidates [B, N, K] (the MTP's T1..Tm first) with their q
    [B, N, K, V] when sampled, and, from a drafter with a confidence head (DSpark), each candidate's
    predicted probability of acceptance given the candidates before it [B, N, K] (1 for the MTP's
    tokens, whose acceptance the drafter does not predict)."""
    hidden: torch.Tensor
    previous: torch.Tensor
    candidates: torch.Tensor | None = None
    q: torch.Tensor | None = None
    confidence: torch.Tensor | None = None


class BlockDrafter(nn.Module):
    """`backbone` (DFlashDrafter / DFlash2Drafter, the published tensors) + `injection` (the variant:
    slots, context features, MTP tokens per block).

    The backbone's hooks are forwarded, so callers treat the unit as the drafter; the injection's layout questions
    go to `drafter.injection`.

    The block width B is the backbone's `block_size` (config.json, the checkpoint); the injection may
    verify a shorter block at decoding time (`load_block_drafter(block_size=...)`), never a longer one."""

    def __init__(self, backbone: DFlashDrafter, injection: Injection, what: str = "drafter",
                 mtp_correction_rank: int = 0):
        super().__init__()
        require_context_width(backbone.config, injection, what)
        require_block_fit(backbone.config, injection, what)
        self.backbone = backbone
        self.injection = injection
        rank = require_correction_rank(mtp_correction_rank)
        if rank and not injection.uses_mtp:
            raise ValueError(f"mtp_correction_rank={rank} corrects the MTP's proposals, but injection "
                             f"{variant_of(injection).name} proposes no MTP token (use 0)")
        # A plain attribute when absent (not a None submodule): state dicts and FSDP see only real modules.
        if rank:
            self.mtp_correction = MTPCorrection(backbone.config.hidden_size, rank)

    @classmethod
    def around(cls, backbone: DFlashDrafter, injection, what: str = "drafter",
               mtp_correction_rank: int = 0) -> "BlockDrafter":
        """A new injection (variant name or factory, see `build_block_drafter`) for an existing backbone
        (init_from: continue a published DFlash drafter as a DMTP variant); `what` names the backbone
        in the error when its context width does not fit.

        The blocks are the backbone's own width."""
        c = backbone.config
        return cls(backbone, _make(injection, c.hidden_size, len(c.target_layer_ids), c.mask_token_id, c.block_size),
                   what, mtp_correction_rank)

    # -- what the unit is -------------------------------------------------------------------------
    @property
    def config(self):
        return self.backbone.config

    @property
    def layer_ids(self) -> list[int]:
        """The target layers whose hidden states form the drafter's context."""
        return list(self.config.target_layer_ids)

    @property
    def variant(self) -> str:
        return variant_of(self.injection).name

    @property
    def needs_mtp(self) -> bool:
        return self.injection.needs_mtp

    @property
    def method_name(self) -> str:
        """Its name in every table (dmtp.drafters.registry.method_name): injection, architecture, MTP correction."""
        return method_name(self.variant, self.config.architecture, self.mtp_correction_rank)

    @property
    def auxiliary_loss_name(self) -> str | None:
        return self.backbone.auxiliary_loss_name

    @property
    def mtp_correction_rank(self) -> int:
        correction = getattr(self, "mtp_correction", None)
        return correction.rank if correction is not None else 0

    def proposing_mtp(self, mtp, greedy: bool = True):
        """The MTP this drafter proposes T1 (and the chain) with: `mtp` itself, or, with an MTP correction,
        `mtp` whose logits pass through it (dmtp.models.mtp_correction.ProposingMTP); `greedy=False` (sampled
        decoding): the native MTP when the correction was trained on greedy tokens only (`greedy_only`)."""
        correction = getattr(self, "mtp_correction", None)
        if mtp is None or correction is None or isinstance(mtp, ProposingMTP) or (correction.greedy_only and not greedy):
            return mtp
        return ProposingMTP(mtp, correction)

    @property
    def block_size(self) -> int:
        """B, the block this unit drafts and the target verifies: [A, c1..c_{B-1}]."""
        return self.injection.block_size

    @property
    def num_candidates(self) -> int:
        return self.injection.num_candidates

    # -- drafting a block: slots -> one forward -> candidates (every caller, training included) -----
    def block_slots(self, embed_weight: torch.Tensor, anchor_tokens: torch.Tensor,
                    mtp: MTPBlockInputs | None = None, mtp_grad: bool = False) -> torch.Tensor:
        """The drafter's input slots of blocks [B, N] (anchor tokens A; the MTP's tokens and hiddens per
        block, None when the variant uses no MTP token) -> [B, N, num_slots, H], through the injection."""
        b, n = anchor_tokens.shape
        tokens = hidden = num = None
        if mtp is not None:
            tokens, hidden, num = mtp.tokens.flatten(0, 1), mtp.hidden.flatten(0, 1), mtp.num.flatten()
        embed = lambda ids: self.embed(ids, embed_weight)  # noqa: E731
        slots = self.injection.build_block(embed, anchor_tokens.flatten(), tokens, hidden, num, mtp_grad=mtp_grad)
        return slots.view(b, n, *slots.shape[1:])

    def draft_block(self, embed_weight: torch.Tensor, anchor_tokens: torch.Tensor, anchor_positions: torch.Tensor,
                    ctx_kv, ctx_positions: torch.Tensor | None, mtp: MTPBlockInputs | None = None, *,
                    keep: torch.Tensor | None = None, lm_head_weight: torch.Tensor | None = None, sampler=None,
                    slots: torch.Tensor | None = None, mtp_grad: bool = False, vocab=None) -> DraftedBlock:
        """Draft blocks [B, N] anchored at A = anchor_tokens at anchor_positions, in one forward: the
        slots (`block_slots`, or `slots` built earlier), each block seeing the context K/V `ctx_kv` at
        `ctx_positions` [B, C] strictly before its A (none where `keep` is False) and its own slots only;
        then, with `lm_head_weight`, the candidates (the backbone's `propose`: argmax per slot, or
        `sampler`; DFlash2's selector path from the previous token), candidate j being the MTP's for
        j <= m.

        The reference round, the decoding loop, the training loss and the validation walk all draft through here.
        Decoding passes a `CachedContext` as `ctx_kv` (ctx_positions None: the cache's slot is the position) and one
        block per request: the block's K/V are written into the caches (scratch rows from A on, which the next
        context append overwrites). `vocab`: a draft vocabulary (dmtp.models.draft_vocab): the drafter's slots
        propose from its tokens only."""
        inj = self.injection
        b, n = anchor_positions.shape
        if isinstance(ctx_kv, CachedContext) and n != 1:
            raise ValueError(f"a cached context takes one block per request (its rows go into the caches), got {n}")
        if slots is None:
            slots = self.block_slots(embed_weight, anchor_tokens, mtp, mtp_grad)
        s = inj.num_slots
        positions = inj.slot_positions(anchor_positions.flatten()).view(b, n * s)
        limit = anchor_positions if keep is None else torch.where(keep, anchor_positions, 0)
        ctx_limit = limit.repeat_interleave(s, dim=1)
        block_ids = torch.arange(n, device=positions.device).repeat_interleave(s)[None].expand(b, -1)
        hidden = self(slots.reshape(b, n * s, -1), positions, ctx_kv, ctx_positions, ctx_limit, block_ids, block_rows=s)
        hidden = hidden.view(b, n, s, -1)[:, :, inj.first_predicted_slot:]
        tokens = None if mtp is None else mtp.tokens
        out = DraftedBlock(hidden, inj.previous_token(anchor_tokens, tokens))
        if lm_head_weight is not None:
            drafted, q = self.propose(hidden, lm_head_weight, out.previous, sampler=sampler,
                                      forced=self._mtp_drafted_slots(mtp), vocab=vocab)
            num = None if mtp is None else mtp.num
            out.candidates = inj.merge_candidates(tokens, drafted, num)
            if q is not None:
                out.q = inj.merge_candidates(None if mtp is None else mtp.q, q, num)
            # The confidence of the proposed path: each slot given the token proposed before it.
            conf = self.confidence(hidden, torch.cat([out.previous[..., None], drafted[..., :-1]], dim=-1))
            if conf is not None:
                out.confidence = inj.merge_candidates(None if mtp is None else torch.ones_like(tokens, dtype=conf.dtype),
                                                      conf, num)
        return out

    def _mtp_drafted_slots(self, mtp: MTPBlockInputs | None):
        return None if mtp is None else self.injection.forced_drafter_slots(mtp.tokens, mtp.num)

    # -- the backbone's operations, with the injection's context path in front ---------------------
    def embed(self, ids: torch.Tensor, embed_weight: torch.Tensor) -> torch.Tensor:
        return self.backbone.embed_noise(ids, embed_weight)

    def context(self, layer_hidden: torch.Tensor, mtp_hidden: torch.Tensor | None) -> torch.Tensor:
        """The projected context rows (before per-layer K/V) from the target's tapped layers and, for
        context variants, the per-position MTP hidden."""
        return self.project_context(self.injection.context_features(layer_hidden, mtp_hidden))

    def project_context(self, features: torch.Tensor) -> torch.Tensor:
        return self.backbone.project_context(features)

    def context_kv(self, ctx_hidden: torch.Tensor, ctx_positions: torch.Tensor):
        return self.backbone.context_kv(ctx_hidden, ctx_positions)

    def forward(self, *args, **kwargs) -> torch.Tensor:
        return self.backbone(*args, **kwargs)

    def logits(self, hidden: torch.Tensor, lm_head_weight: torch.Tensor) -> torch.Tensor:
        return self.backbone.logits(hidden, lm_head_weight)

    def block_logits(self, hidden: torch.Tensor, lm_head_weight: torch.Tensor, prev_tokens: torch.Tensor):
        return self.backbone.block_logits(hidden, lm_head_weight, prev_tokens)

    @property
    def has_confidence(self) -> bool:
        return self.backbone.has_confidence

    def confidence(self, hidden: torch.Tensor, prev_tokens: torch.Tensor):
        return self.backbone.confidence(hidden, prev_tokens)

    def propose(self, *args, **kwargs):
        return self.backbone.propose(*args, **kwargs)

    def auxiliary_loss(self, *args, **kwargs) -> torch.Tensor:
        return self.backbone.auxiliary_loss(*args, **kwargs)

    # -- on disk ----------------------------------------------------------------------------------
    def save(self, path: str | Path, tuned_mtp=None, target_path: str | Path | None = None, *,
             state: dict[str, torch.Tensor] | None = None, dtype: torch.dtype | None = None,
             mtp_state: dict[str, torch.Tensor] | None = None, **extra_config) -> None:
        """`tuned_mtp`: a jointly trained MTP, written beside the drafter as mtp.safetensors under
        `target_path`'s own checkpoint names. `extra_config` goes under config.json's "dmtp" section; with
        `target=` (the target as given: a path or a hub id) it also records the target's config.json and MTP
        files' sha256 (dmtp.models.provenance), and `train_config=` (the run's composed config) becomes the
        card's training recipe.

        README.md beside the weights is the model card (dmtp.models.model_card). `state` / `mtp_state`: this unit's
        / the MTP's full tensors when the modules hold shards (FSDP: dmtp.training.fsdp.full_state); `dtype`: the
        floating tensors' precision on disk (None: as held)."""
        state = self.state_dict() if state is None else state
        own = lambda prefix: {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}  # noqa: E731
        tensors = {INJECTION_PREFIX + k: v.detach().contiguous() for k, v in own("injection.").items()}
        tensors.update({CORRECTION_PREFIX + k: v.detach().contiguous() for k, v in own("mtp_correction.").items()})
        # "injection_kwargs": the options it was built with (the key every exported drafter carries).
        # The block size and architecture are config.json's own (block_size, architectures), not repeated here.
        meta = {"injection": self.variant, "injection_kwargs": self.injection.variant_options}
        if self.mtp_correction_rank:
            meta["mtp_correction_rank"] = self.mtp_correction_rank
            meta["mtp_correction_greedy_only"] = self.mtp_correction.greedy_only
        if extra_config.get("target") is not None:
            meta.update(target_provenance(extra_config["target"]))
        meta.update(extra_config)
        if tuned_mtp is not None:
            meta["tuned_mtp"] = TUNED_MTP_NAME
        # A variant that reads the MTP is not the published DFlash drafter: it gets its own architecture
        # name; raw DFlash stays exactly the published layout (engines serve it unchanged).
        save_drafter(path, self.backbone, extra_tensors=tensors, extra_config=meta,
                     dmtp_architecture=self.needs_mtp, state=own("backbone."), dtype=dtype)
        if tuned_mtp is not None:
            save_tuned_mtp(path, tuned_mtp, target_path, state=mtp_state, dtype=dtype)
        write_card(path, meta, read_drafter_config(path), meta.get("train_config"))


def _make(injection, hidden_size: int, num_target_features: int, mask_token_id: int, block_size: int) -> Injection:
    if isinstance(injection, str):
        return make_injection(injection, hidden_size, num_target_features, mask_token_id, block_size)
    return injection(hidden_size=hidden_size, num_target_features=num_target_features, mask_token_id=mask_token_id,
                     block_size=block_size)


def build_block_drafter(target, injection, mask_token_id: int, target_layer_ids: list[int] | None = None,
                        num_target_features: int | None = None, mtp_correction_rank: int = 0,
                        **backbone_options) -> BlockDrafter:
    """A fresh drafter sized to `target` (conf/drafter/*.yaml, instantiated partially). `injection`: a
    variant name, or a factory taking (hidden_size, num_target_features, mask_token_id, block_size) such
    as Hydra's partial of conf/injection/<name>.yaml.

    The tapped layers and the block width are resolved first, so the injection knows its context width and slots
    before the backbone's fc is sized to it. `backbone_options`: those of `dmtp.drafters.factory.build_drafter`
    (depth, architecture, block_size, DFlash2 options, ...). `mtp_correction_rank`: a correction of the MTP's logits
    that trains with the drafter (0: none; dmtp.models.mtp_correction)."""
    layer_ids = target_layer_ids_for(target, target_layer_ids, num_target_features)
    block_size = require_block_size(backbone_options.get("block_size", DFlashConfig.block_size), "drafter.block_size")
    inj = _make(injection, target.config.hidden_size, len(layer_ids), mask_token_id, block_size)
    backbone = build_drafter(target, inj.context_dim, mask_token_id, target_layer_ids=layer_ids, **backbone_options)
    # The correction corrects the MTP's proposals: an injection that proposes none (raw DFlash) has nothing to
    # correct, so the configured rank applies to the variants that use the MTP (conf/drafter: "when it proposes").
    return BlockDrafter(backbone, inj, mtp_correction_rank=mtp_correction_rank if inj.uses_mtp else 0)


def fresh_drafter_for(target, name: str, mask_token_id: int, seed: int = 0, num_layers: int = 1,
                      perturb: float = 0.0, block_size: int = DFlashConfig.block_size, num_target_features: int = 1,
                      backbone: dict | None = None, mtp_correction_rank: int = 0, **options) -> BlockDrafter:
    """An untrained drafter sized to `target` (tests, benchmark plumbing): `num_target_features` tapped
    layers (one: the middle one; more: DFlash's spread), `num_layers` layers of the target's widths, blocks
    of `block_size`, in eval mode (benchmarks size it like a published drafter: 5 layers, 5 taps, block 16).
    `perturb` adds noise to the injection's weights so that every injected path (zero-init fusion included)
    changes the drafter's output. `backbone`: the architecture and its options (e.g. {"architecture":
    "dspark"}); `options`: the variant's own (e.g. mtp_threshold)."""
    torch.manual_seed(seed)
    drafter = build_block_drafter(target, lambda **s: make_injection(name, **s, **options), mask_token_id,
                                  num_target_features=num_target_features, num_layers=num_layers, block_size=block_size,
                                  mtp_correction_rank=mtp_correction_rank, **(backbone or {}))
    if perturb:
        with torch.no_grad():
            for p in drafter.injection.parameters():
                p.add_(perturb * torch.randn_like(p))
    return drafter.eval()


def load_block_drafter(path: str | Path, dtype: torch.dtype = torch.float32, injection: str | None = None,
                       options: dict | None = None, block_size: int | None = None) -> tuple[BlockDrafter, dict]:
    """-> (drafter, the "dmtp" section of its config.json). `injection` overrides the saved variant (e.g.
    to continue a published DFlash drafter as dual_anchor_zero_init); its tensors then start fresh.
    `options` override the saved variant's own options (decoding-time ones, e.g. multi_mtp_zero_init's
    num_mtp_tokens / mtp_threshold). `block_size`: verify a shorter block than the drafter was trained
    with (None: its own; longer is refused)."""
    backbone, extra_tensors, meta = load_drafter(path, dtype=dtype)
    section = Path(path) / "config.json"
    if not isinstance(meta, dict) or not isinstance(meta.get("injection", ""), str) \
            or not isinstance(meta.get("injection_kwargs", {}), dict):
        raise ValueError(f'{section}: the "dmtp" section must be an object with "injection" (a variant name) '
                         f'and "injection_kwargs" (an object); got {meta!r:.120}')
    saved_name = meta.get("injection", "raw_dflash")
    if saved_name not in CATALOGUE:
        raise ValueError(f"{section}: unknown injection variant {saved_name!r} in its \"dmtp\" section; "
                         f"known: {', '.join(CATALOGUE)}")
    name = injection or saved_name
    kwargs = dict(meta.get("injection_kwargs", {}) if name == saved_name else {})
    if name == saved_name:
        _refuse_trained_option_changes(path, name, kwargs, options or {})
    kwargs.update(options or {})
    cfg = backbone.config
    block = cfg.block_size if block_size is None else require_block_size(block_size, "block_size")
    try:
        module = make_injection(name, cfg.hidden_size, len(cfg.target_layer_ids), cfg.mask_token_id, block,
                                **kwargs)
    except (ValueError, TypeError) as e:   # an option the variant does not have, or out of its range
        raise ValueError(f"drafter {path}: {e}") from None
    rank = meta.get("mtp_correction_rank", 0) if name == saved_name else 0
    try:
        rank = require_correction_rank(rank)
    except ValueError as e:
        raise ValueError(f"{section}: {e}") from None
    if rank and not module.uses_mtp:
        raise ValueError(f"{section}: mtp_correction_rank={rank}, but injection {name} proposes no MTP token")
    drafter = BlockDrafter(backbone, module.to(dtype), f"drafter at {path}", mtp_correction_rank=rank)
    if name == saved_name:
        state = {k[len(INJECTION_PREFIX):]: v for k, v in extra_tensors.items() if k.startswith(INJECTION_PREFIX)}
        _require_injection_tensors(path, name, module, state, has_section=bool(meta))
        module.load_state_dict(state, strict=True)
    corrections = {k[len(CORRECTION_PREFIX):]: v for k, v in extra_tensors.items() if k.startswith(CORRECTION_PREFIX)}
    if rank:
        _require_tensors(path, CORRECTION_PREFIX, f"an MTP correction of rank {rank}", drafter.mtp_correction,
                         corrections)
        drafter.mtp_correction.load_state_dict(corrections, strict=True)
        drafter.mtp_correction.to(dtype)
        drafter.mtp_correction.greedy_only = meta.get("mtp_correction_greedy_only") is True
    elif corrections and name == saved_name:
        raise ValueError(f"{Path(path) / 'model.safetensors'}: unexpected tensor {CORRECTION_PREFIX}"
                         f"{next(iter(corrections))}, but {section} names no mtp_correction_rank")
    return drafter, meta


def _refuse_trained_option_changes(path, name: str, saved: dict, options: dict) -> None:
    """Only a variant's decoding-time options may change on load: the others (e.g. multi_mtp_zero_init's
    max_mtp_tokens, the m its training drew from) are what the saved tensors learned."""
    allowed = variant(name).cls.decoding_options
    for key, value in options.items():
        if key not in allowed and key in variant(name).options and saved.get(key) != value:
            raise ValueError(f"drafter {path}: {name} was trained with {key}={saved.get(key)!r}, which decoding "
                             f"cannot change (got {value!r}); its decoding-time options: "
                             f"{', '.join(allowed) or 'none'}")


def _require_injection_tensors(path, name: str, module: Injection, state: dict, has_section: bool) -> None:
    """The `dmtp_injection.*` tensors are exactly the variant's: one line naming the file and the first
    tensor missing, unexpected or of the wrong shape (not load_state_dict's multi-line RuntimeError)."""
    if state and not has_section:
        raise ValueError(f"{Path(path) / 'model.safetensors'}: unexpected tensor {INJECTION_PREFIX}{next(iter(state))}, "
                         f"but {Path(path) / 'config.json'} has no \"dmtp\" section naming their variant (it loads as "
                         "raw_dflash)")
    _require_tensors(path, INJECTION_PREFIX, f"injection {name}", module, state)


def _require_tensors(path, prefix: str, what: str, module: nn.Module, state: dict) -> None:
    """`state` holds exactly `module`'s tensors (under `prefix` in the file), each of its shape: else one line
    naming the first one unexpected, misshaped or missing."""
    where = Path(path) / "model.safetensors"
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    for key, tensor in state.items():
        if key not in expected:
            raise ValueError(f"{where}: unexpected tensor {prefix}{key}, which {what} does not have")
        if tuple(tensor.shape) != expected[key]:
            raise ValueError(f"{where}: tensor {prefix}{key} has shape {tuple(tensor.shape)}, {what} expects "
                             f"{expected[key]}")
    missing = [k for k in expected if k not in state]
    if missing:
        raise ValueError(f"{where}: missing tensor {prefix}{missing[0]} of {what} ({len(missing)} missing in all)")


def tuned_mtp_path(path: str | Path) -> Path | None:
    """The drafter's own tuned MTP (mtp.safetensors) if it has one; an error if its config says it was
    trained with one that is missing."""
    tuned = Path(path) / TUNED_MTP_NAME
    if tuned.is_file():
        return tuned
    if (read_drafter_config(path).get("dmtp") or {}).get("tuned_mtp"):
        raise FileNotFoundError(f"drafter {path} was trained with its MTP (model.train_mtp) but {tuned} is missing")
    return None


__all__ = ["BlockDrafter", "CORRECTION_PREFIX", "DraftedBlock", "INJECTION_PREFIX", "MTPBlockInputs", "build_block_drafter",
           "fresh_drafter_for", "load_block_drafter",
           "tuned_mtp_path"]
