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
checkpoint's own names (`tuned_mtp_path` finds it; the target is never modified).

Layering: models (target, MTP, backbones) -> injection (variants) -> this module -> training, decoding.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from dmtp.injection import Injection, variant_of
from dmtp.injection.catalogue import make_injection
from dmtp.models.drafter import DFlashDrafter, load_drafter, read_drafter_config, save_drafter
from dmtp.models.drafter_factory import build_drafter, target_layer_ids_for
from dmtp.models.drafter_fit import require_context_width
from dmtp.models.mtp_loading import TUNED_MTP_NAME, save_tuned_mtp

INJECTION_PREFIX = "dmtp_injection."


class BlockDrafter(nn.Module):
    """`backbone` (DFlashDrafter / DFlash2Drafter, the published tensors) + `injection` (the variant:
    slots, context features, MTP tokens per block). The backbone's hooks are forwarded, so callers
    treat the unit as the drafter; the injection's layout questions go to `drafter.injection`."""

    def __init__(self, backbone: DFlashDrafter, injection: Injection, what: str = "drafter"):
        super().__init__()
        require_context_width(backbone.config, injection, what)
        self.backbone = backbone
        self.injection = injection

    @classmethod
    def around(cls, backbone: DFlashDrafter, injection, what: str = "drafter") -> "BlockDrafter":
        """A new injection (variant name or factory, see `build_block_drafter`) for an existing backbone
        (init_from: continue a published DFlash drafter as a DMTP variant); `what` names the backbone
        in the error when its context width does not fit."""
        c = backbone.config
        return cls(backbone, _make(injection, c.hidden_size, len(c.target_layer_ids), c.mask_token_id), what)

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
    def auxiliary_loss_name(self) -> str | None:
        return self.backbone.auxiliary_loss_name

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

    def propose(self, *args, **kwargs):
        return self.backbone.propose(*args, **kwargs)

    def auxiliary_loss(self, *args, **kwargs) -> torch.Tensor:
        return self.backbone.auxiliary_loss(*args, **kwargs)

    # -- on disk ----------------------------------------------------------------------------------
    def save(self, path: str | Path, tuned_mtp=None, target_path: str | Path | None = None, **extra_config) -> None:
        """`tuned_mtp`: a jointly trained MTP, written beside the drafter as mtp.safetensors under
        `target_path`'s own checkpoint names. `extra_config` goes under config.json's "dmtp" section."""
        tensors = {INJECTION_PREFIX + k: v.detach().contiguous() for k, v in self.injection.state_dict().items()}
        # "injection_kwargs": the options it was built with (the key every exported drafter carries).
        meta = {"injection": self.variant, "injection_kwargs": self.injection.variant_options, **extra_config}
        if tuned_mtp is not None:
            meta["tuned_mtp"] = TUNED_MTP_NAME
        # A variant that reads the MTP is not the published DFlash drafter: it gets its own architecture
        # name; raw DFlash stays exactly the published layout (engines serve it unchanged).
        save_drafter(path, self.backbone, extra_tensors=tensors, extra_config=meta,
                     dmtp_architecture=self.needs_mtp)
        if tuned_mtp is not None:
            save_tuned_mtp(path, tuned_mtp, target_path)


def _make(injection, hidden_size: int, num_target_features: int, mask_token_id: int) -> Injection:
    if isinstance(injection, str):
        return make_injection(injection, hidden_size, num_target_features, mask_token_id)
    return injection(hidden_size=hidden_size, num_target_features=num_target_features, mask_token_id=mask_token_id)


def build_block_drafter(target, injection, mask_token_id: int, target_layer_ids: list[int] | None = None,
                        num_target_features: int | None = None, **backbone_options) -> BlockDrafter:
    """A fresh drafter sized to `target` (conf/drafter/*.yaml, instantiated partially). `injection`: a
    variant name, or a factory taking (hidden_size, num_target_features, mask_token_id) such as Hydra's
    partial of conf/injection/<name>.yaml. The tapped layers are resolved first, so the injection
    knows its context width before the backbone's fc is sized to it. `backbone_options`: those of
    `dmtp.models.drafter_factory.build_drafter` (depth, architecture, DFlash2 options, ...)."""
    layer_ids = target_layer_ids_for(target, target_layer_ids, num_target_features)
    inj = _make(injection, target.config.hidden_size, len(layer_ids), mask_token_id)
    backbone = build_drafter(target, inj.context_dim, mask_token_id, target_layer_ids=layer_ids, **backbone_options)
    return BlockDrafter(backbone, inj)


def fresh_drafter_for(target, name: str, mask_token_id: int, seed: int = 0, num_layers: int = 1,
                      perturb: float = 0.0, **options) -> BlockDrafter:
    """An untrained drafter sized to `target` (tests, benchmark plumbing): one tapped layer (the middle
    one), the target's widths, in eval mode. `perturb` adds noise to the injection's weights so that
    every injected path (zero-init fusion included) changes the drafter's output. `options`: the
    variant's own (e.g. mtp_threshold)."""
    torch.manual_seed(seed)
    drafter = build_block_drafter(target, lambda **s: make_injection(name, **s, **options), mask_token_id,
                                  num_target_features=1, num_layers=num_layers)
    if perturb:
        with torch.no_grad():
            for p in drafter.injection.parameters():
                p.add_(perturb * torch.randn_like(p))
    return drafter.eval()


def load_block_drafter(path: str | Path, dtype: torch.dtype = torch.float32, injection: str | None = None,
                       options: dict | None = None) -> tuple[BlockDrafter, dict]:
    """-> (drafter, the "dmtp" section of its config.json). `injection` overrides the saved variant (e.g.
    to continue a published DFlash drafter as dual_anchor_zero_init); its tensors then start fresh.
    `options` override the saved variant's own options (decoding-time ones, e.g. multi_mtp_zero_init's
    num_mtp_tokens / mtp_threshold)."""
    backbone, extra_tensors, meta = load_drafter(path, dtype=dtype)
    saved_name = meta.get("injection", "raw_dflash")
    name = injection or saved_name
    kwargs = dict(meta.get("injection_kwargs", {}) if name == saved_name else {})
    kwargs.update(options or {})
    cfg = backbone.config
    module = make_injection(name, cfg.hidden_size, len(cfg.target_layer_ids), cfg.mask_token_id, **kwargs)
    drafter = BlockDrafter(backbone, module.to(dtype), f"drafter at {path}")
    if name == saved_name:
        state = {k[len(INJECTION_PREFIX):]: v for k, v in extra_tensors.items() if k.startswith(INJECTION_PREFIX)}
        module.load_state_dict(state, strict=True)
    return drafter, meta


def tuned_mtp_path(path: str | Path) -> Path | None:
    """The drafter's own tuned MTP (mtp.safetensors) if it has one; an error if its config says it was
    trained with one that is missing."""
    tuned = Path(path) / TUNED_MTP_NAME
    if tuned.is_file():
        return tuned
    if (read_drafter_config(path).get("dmtp") or {}).get("tuned_mtp"):
        raise FileNotFoundError(f"drafter {path} was trained with its MTP (model.train_mtp) but {tuned} is missing")
    return None


__all__ = ["BlockDrafter", "INJECTION_PREFIX", "build_block_drafter", "fresh_drafter_for", "load_block_drafter",
           "tuned_mtp_path"]
