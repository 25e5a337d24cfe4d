"""What a training run is made of, each built from its own config group only: the target (whole, or its
embedding and LM head when the features come from the offline cache), the drafter (backbone + injection), the
target's MTP, the data and the LightningModule; and where they run."""
from __future__ import annotations

import os

import torch
from omegaconf import DictConfig

from dmtp.configs import instantiate
from dmtp.datagen.feature_spec import FeatureSpec
from dmtp.drafters.block_drafter import BlockDrafter
from dmtp.drafters.checkpoint import load_drafter
from dmtp.drafters.factory import mask_token_id_of
from dmtp.drafters.fit import require_target_fit
from dmtp.families.mtp_loading import MTPLoadError, load_native_mtp
from dmtp.models.target import load_tokenizer
from dmtp.models.target_head import TargetHead
from dmtp.training.module_options import JointMTP, Objective, options_of
from dmtp.tiny.targets import ensure_tiny_target


def build_components(cfg: DictConfig):
    """Everything `fit` needs, from the composed config (also used by tests and sweeps).

    With `data.features` the target's decoder is never loaded: its embedding and LM head only (`feature_target`),
    the features of every row coming from the offline cache (dmtp.datagen.feature_cache)."""
    features = uses_feature_cache(cfg)
    target = feature_target(cfg) if features else instantiate(cfg.target, device=target_device(cfg))
    tokenizer = load_tokenizer(target.path)
    drafter = build_drafter(cfg, target, tokenizer)
    mtp = load_mtp(target, drafter) if drafter.needs_mtp else None
    data = instantiate(cfg.data)(tokenizer=tokenizer, target=target)
    require_rows_hold_a_block(data, drafter)
    module = instantiate(cfg.model)(target=target, mtp=mtp, drafter=drafter)
    if features:
        spec = feature_spec_of(data, drafter, target)
        require_serves(spec, drafter, cfg.model)
        data.use_features(spec)
    return target, tokenizer, data, module


def require_rows_hold_a_block(data, drafter: BlockDrafter) -> None:
    """A training row holds at least one whole drafter block: a shorter one cuts every block it draws (data.seq_len=2
    trained on a token or two per block, silently)."""
    loader = getattr(data, "loader", None)   # another data module than dmtp's: its own rules
    seq_len, block = (loader.seq_len if loader else None), drafter.config.block_size
    if seq_len is not None and seq_len < block:
        raise ValueError(f"data.seq_len={seq_len} is shorter than one block of the drafter ({block} positions): "
                         f"use data.seq_len >= {block}")


def uses_feature_cache(cfg: DictConfig) -> bool:
    return bool(cfg.data.get("features"))


def feature_target(cfg: DictConfig) -> TargetHead:
    """The target as training from cached features reads it: its embedding and LM head (conf/target's path or
    embedded preset, dtype and device)."""
    node = cfg.target
    path = node.get("path") or str(ensure_tiny_target(node.get("preset") or "tiny"))
    return TargetHead.from_pretrained(path, dtype=getattr(torch, str(node.get("dtype") or "float32")),
                                      device=target_device(cfg), trust_remote_code=bool(node.get("trust_remote_code")))


def feature_spec_of(data, drafter: BlockDrafter, target) -> FeatureSpec:
    """What the feature cache of this run holds: the data's feature options at the drafter's taps, in the
    target's dtype (the capture and the training run compute it alike, so they find the same cache)."""
    return data.features.spec(drafter.layer_ids, str(target.dtype).removeprefix("torch."))


def require_serves(spec: FeatureSpec, drafter: BlockDrafter, model_cfg) -> None:
    """One line when the cache of `spec` lacks something this run's drafter or loss (`model_cfg`: conf/train.yaml's
    `model:`) reads, naming the option to set.

    The one rule of both sides: the capture applies it before it writes (dmtp.training.prepare), the training run
    before it reads."""
    options = options_of(model_cfg) or {"objective": Objective(), "joint": JointMTP()}   # another module: the defaults
    objective, joint = options["objective"], options["joint"]
    inj = drafter.injection
    need = []
    if drafter.needs_mtp and not spec.mtp_hidden:
        need.append(f"data.feature_mtp_hidden=true (injection={drafter.variant} reads the MTP's hidden)")
    if (inj.uses_mtp and inj.max_mtp_tokens > 1 or joint.train) and not spec.last_hidden:
        need.append("data.feature_last_hidden=true (the MTP's chain or its training reads the target's last hidden)")
    if objective.label_source == "target" and spec.labels == "none":
        need.append("data.feature_labels=greedy (model.label_source=target reads the target's greedy tokens)")
    if (objective.label_source == "target_kl" or objective.loss_mix[1]) and spec.labels != "topk":
        need.append(f"data.feature_labels=topk (model.loss={objective.loss} with model.label_source="
                    f"{objective.label_source} reads the target's distribution)")
    if need:
        raise ValueError("the feature cache of this run would not hold what it trains on: set " + "; ".join(need)
                         + " (the same options for the capture, python -m dmtp.prepare step=capture, and the run)")


def build_drafter(cfg: DictConfig, target, tokenizer) -> BlockDrafter:
    """A fresh drafter sized to the target, or `init_from`'s backbone, with the run's injection."""
    if cfg.drafter.get("init_from_target_layers") and uses_feature_cache(cfg):
        raise ValueError("drafter.init_from_target_layers copies the target's decoder layers, which training from "
                         "cached features (data.features=true) does not load")
    make_injection = instantiate(cfg.injection)
    if cfg.init_from:   # a published (or earlier) drafter's backbone, with this run's injection
        backbone, _, _ = load_drafter(cfg.init_from)
        backbone.config = backbone.config.with_training_options(cfg.drafter)
        require_target_fit(backbone.config, target, f"init_from={cfg.init_from}")
        drafter = BlockDrafter.around(backbone, make_injection, f"init_from={cfg.init_from}",
                                      mtp_correction_rank=cfg.drafter.get("mtp_correction_rank") or 0)
    else:
        mask_id = mask_token_id_of(tokenizer, target.config.vocab_size)
        drafter = instantiate(cfg.drafter)(target=target, injection=make_injection, mask_token_id=mask_id)
    return drafter


def load_mtp(target, drafter: BlockDrafter):
    """The target's native MTP, for a variant that needs it (one line naming the variant when it is missing)."""
    try:
        return load_native_mtp(target.path, target.embed_tokens, target.lm_head)
    except MTPLoadError as e:
        raise MTPLoadError(f"injection={drafter.variant} needs the target's MTP: {e}; train a variant that does not "
                           "read it (injection=raw_dflash) or a target with one") from None


def trainer_uses_cuda(trainer_cfg) -> bool:
    """Whether the configured trainer runs on CUDA devices: one line when it asks for them and there are none."""
    accelerator = str(trainer_cfg.get("accelerator", "cpu"))
    if accelerator in ("gpu", "cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"trainer.accelerator={accelerator} but this machine has no CUDA device "
                             "(use trainer=cpu, or trainer.accelerator=cpu)")
        return True
    return accelerator == "auto" and torch.cuda.is_available()


def target_device(cfg: DictConfig) -> str:
    """target.device, where `auto` (the default) follows the trainer: this rank's GPU on a CUDA trainer (so the
    target, its MTP and the data regeneration before fit run there), else the CPU."""
    device = str(cfg.target.get("device") or "auto")
    if device != "auto":
        return device
    return f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if trainer_uses_cuda(cfg.trainer) else "cpu"
