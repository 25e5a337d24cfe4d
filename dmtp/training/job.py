"""One training job from a composed config: target -> drafter (backbone + injection) -> MTP -> data -> module ->
trainer -> fit -> export (the body of `python -m dmtp.train`; conf/train.yaml). Each component is built
from its own config group only."""
from __future__ import annotations

import os
import re
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from dmtp.atomic_io import write_json
from dmtp.drafters.block_drafter import BlockDrafter
from dmtp.configs import instantiate
from dmtp.drafters.checkpoint import load_drafter
from dmtp.drafters.registry import method_name
from dmtp.drafters.factory import mask_token_id_of
from dmtp.drafters.fit import require_target_fit
from dmtp.models.model_card import set_card_section
from dmtp.run_records import created_by_this_command, write_hydra_record
from dmtp.families.mtp_loading import MTPLoadError, load_native_mtp
from dmtp.models.target import load_tokenizer
from dmtp.models.target_head import TargetHead
from dmtp.tiny.targets import ensure_tiny_target
from dmtp.training.feature_spec import FeatureSpec
from dmtp.training.guards import FiniteGuard
from dmtp.training.progress import ProgressLines, step_progress_bar, stdout_is_terminal
from dmtp.training.checkpoint_io import checkpoint_io_for
from dmtp.training.data_options import checked_before_loading
from dmtp.training.first_step import UntilFirstStep, paths_under
from dmtp.training.fsdp import full_state, gathered
from dmtp.training.resume import check_checkpoint_fits, checkpoint_shapes, claim_run_dir, read_checkpoint, resume_plan
from dmtp.training.run_config import RecordRunConfig, resume_line, run_recipe, resumed_config
from dmtp.training.rng_state import ResumableRNG
from dmtp.reports.evaluation import evaluation_table
from dmtp.reports.walk import walk_table


def build_components(cfg: DictConfig):
    """Everything `fit` needs, from the composed config (also used by tests and sweeps). With `data.features`
    the target's decoder is never loaded: its embedding and LM head only (`feature_target`), the features of
    every row coming from the offline cache (dmtp.training.feature_cache)."""
    features = uses_feature_cache(cfg)
    target = feature_target(cfg) if features else instantiate(cfg.target, device=target_device(cfg))
    tokenizer = load_tokenizer(target.path)
    drafter = build_drafter(cfg, target, tokenizer)
    mtp = load_mtp(target, drafter) if drafter.needs_mtp else None
    data = instantiate(cfg.data)(tokenizer=tokenizer, target=target)
    module = instantiate(cfg.model)(target=target, mtp=mtp, drafter=drafter)
    if features:
        spec = feature_spec_of(data, drafter, target)
        require_serves(spec, module)
        data.use_features(spec)
    return target, tokenizer, data, module


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


def require_serves(spec: FeatureSpec, module) -> None:
    """One line when the cache of `spec` lacks something this run's drafter or loss reads (the option to set)."""
    inj = module.drafter.injection
    need = []
    if module.drafter.needs_mtp and not spec.mtp_hidden:
        need.append(f"data.feature_mtp_hidden=true (injection={module.drafter.variant} reads the MTP's hidden)")
    if (inj.uses_mtp and inj.max_mtp_tokens > 1 or module.train_mtp) and not spec.last_hidden:
        need.append("data.feature_last_hidden=true (the MTP's chain or its training reads the target's last hidden)")
    if module.label_source == "target" and spec.labels == "none":
        need.append("data.feature_labels=greedy (model.label_source=target reads the target's greedy tokens)")
    if (module.label_source == "target_kl" or module.loss_mix[1]) and spec.labels != "topk":
        need.append("data.feature_labels=topk (a KL or TV loss reads the target's distribution)")
    if need:
        raise ValueError("the feature cache of this run would not hold what it trains on: set " + "; ".join(need))


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
        raise MTPLoadError(f"injection={drafter.variant} needs the target's MTP: {e}") from None


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


EXPORT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_PRECISION_DTYPES = {"bf16-mixed": "bfloat16", "bf16-true": "bfloat16", "bf16": "bfloat16",
                     "16-mixed": "float16", "16-true": "float16", "16": "float16"}


def process_rank(cfg: DictConfig) -> int:
    """This process's global rank before the trainer exists: its launcher's (RANK from torchrun, SLURM_PROCID),
    else NODE_RANK x devices per node + LOCAL_RANK: Lightning's own multi-node launch, the same command on every
    node with NODE_RANK, MASTER_ADDR and MASTER_PORT set (Lightning's rank_zero_only reads no NODE_RANK, so
    every node would take itself for rank 0 and claim the shared run directory)."""
    env = os.environ
    if "RANK" in env or "SLURM_PROCID" in env:
        return rank_zero_only.rank
    devices = cfg.trainer.get("devices", 1)
    per_node = devices if isinstance(devices, int) else len(devices) if isinstance(devices, (list, ListConfig)) else 1
    return int(env.get("NODE_RANK", 0)) * per_node + int(env.get("LOCAL_RANK", 0))


def export_dtype(cfg: DictConfig) -> torch.dtype:
    """The exported drafter's precision: `export_dtype`, or by default the training precision's (bf16 for
    bf16-mixed, as published DFlash drafters are; fp32 for 32-true)."""
    name = cfg.get("export_dtype") or _PRECISION_DTYPES.get(str(cfg.trainer.get("precision")), "float32")
    if name not in EXPORT_DTYPES:
        raise ValueError(f"export_dtype must be one of {', '.join(EXPORT_DTYPES)} (or null), got {name!r}")
    return EXPORT_DTYPES[name]


_LENGTH_AT_LEAST = re.compile(r"P\(L>=([0-9]+)\)")   # "P(L>=k)" -> "p_len_ge_k" (also after "mtp415_")


def flat_metrics(cfg: DictConfig, summary: dict) -> dict:
    """One flat record per job for sweep aggregation: identity + exact walk acceptance per domain."""
    out = {"method": method_name(summary["injection"], summary["drafter_arch"], summary.get("mtp_correction_rank", 0)),
           "injection": summary["injection"],
           "drafter_arch": summary["drafter_arch"], "seed": cfg.seed, "global_step": summary["global_step"]}
    for key, value in summary.items():
        if key.startswith("val/") and key.count("/") == 2:
            _, domain, name = key.split("/")
            if name in ("loss", "acc_first"):   # teacher-forced on held-out data
                out[f"val/{domain}/{name}"] = value
            else:                               # the exact greedy walk (SPEC §6), the drafter's and the MTP chain's
                out[f"walk/{domain}/" + _LENGTH_AT_LEAST.sub(r"p_len_ge_\1", name)] = value
    return out


def check_decode_eval_fits(cfg: DictConfig) -> None:
    """decode_eval decodes on rank 0 alone after the run, through the whole target: refused up front when the
    target's layers are sharded across the ranks (their all-gathers would wait for ranks that do not decode), or
    not loaded at all (data.features)."""
    if uses_feature_cache(cfg) and cfg.get("decode_eval") and cfg.decode_eval.enabled:
        raise ValueError("decode_eval.enabled=true decodes through the whole target, which training from cached "
                         "features (data.features=true) never loads: decode the export after the run "
                         "(python -m dmtp.infer drafter=<run dir>/drafter), or set decode_eval.enabled=false")
    strategy = cfg.trainer.get("strategy")
    sharded = isinstance(strategy, DictConfig) and bool(strategy.get("shard_target"))
    if sharded and cfg.get("decode_eval") and cfg.decode_eval.enabled:
        raise ValueError("decode_eval.enabled=true decodes through the whole target on rank 0, but "
                         "trainer.strategy.shard_target=true shards it across the ranks: decode the export after the "
                         "run (python -m dmtp.infer drafter=<run dir>/drafter), or set decode_eval.enabled=false")


def _instantiate_dict(node) -> list:
    return [instantiate(v) for v in (node or {}).values() if v is not None and "_target_" in v]


def _walk_table_now(cfg: DictConfig, module, trainer) -> str | None:
    """The walk's table from the metrics of the validation that just ended (ProgressLines, in log files)."""
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
    summary = {"injection": module.drafter.variant, "drafter_arch": module.drafter.config.architecture,
               "mtp_correction_rank": module.drafter.mtp_correction_rank, "global_step": trainer.global_step, **metrics}
    return walk_table(flat_metrics(cfg, summary))


# Safety rules, not options: added to every run (callbacks=none included) unless already configured.
ALWAYS_ON_CALLBACKS = (FiniteGuard, ResumableRNG)


def _continued(cfg: DictConfig, ckpt_path, resumed_dir, overrides, recorded, saved):
    """-> (the config to run, the checkpoint's tensor shapes or None), read before anything is built.
    `resume=` runs the run's own config (dmtp.training.run_config); `ckpt_path=` the one given."""
    if ckpt_path is None:
        return cfg, None
    if cfg.get("resume"):
        cfg = resumed_config(cfg, recorded, resumed_dir, overrides)
    return cfg, checkpoint_shapes(saved)


def train(cfg: DictConfig, callbacks=(), overrides: list[str] | None = None, record: dict | None = None) -> dict:
    """Run one training job; `callbacks` are extra Lightning callbacks (notebooks, tests). `overrides`: the
    options given on the command line, which `resume=` checks (dmtp.training.run_config); None: all of `cfg`.
    `record`: Hydra's record of the command (dmtp.run_records.hydra_record), written once the run holds its
    directory. A run that stops before its first step leaves its directory as it found it
    (dmtp.training.first_step)."""
    given = OmegaConf.select(cfg, "paths.output_dir", throw_on_resolution_failure=False)   # None: set by resume=
    given_dir = Path(given) if given else None
    start = UntilFirstStep(given_dir, made=given_dir is not None and (created_by_this_command(given_dir)
                                                                      or not given_dir.exists()))
    try:
        return _train(cfg, callbacks, overrides, record, start)
    except BaseException:
        if rank_zero_only.rank == 0:
            start.undo()
        raise


def _train(cfg: DictConfig, callbacks, overrides, record, start: UntilFirstStep) -> dict:
    ckpt_path, resumed_dir = resume_plan(cfg.get("resume"), cfg.ckpt_path)
    by_resume = bool(cfg.get("resume"))
    saved = read_checkpoint(ckpt_path) if ckpt_path is not None else None
    recorded = run_recipe(resumed_dir, saved, required=by_resume) if saved is not None else None
    cfg, saved_shapes = _continued(cfg, ckpt_path, resumed_dir, overrides, recorded, saved)
    if resumed_dir is not None:   # continue in the run's own directory (Hydra already points there)
        with open_dict(cfg):
            cfg.paths.output_dir = str(resumed_dir)
    output_dir = Path(cfg.paths.output_dir)
    if output_dir != start.run_dir:
        start.run_dir, start.made = output_dir, False
    dtype = export_dtype(cfg)   # bad options answer before anything is built
    check_decode_eval_fits(cfg)
    trainer_uses_cuda(cfg.trainer)
    checked_before_loading(cfg.data)
    if process_rank(cfg) == 0:
        before = paths_under(output_dir)
        claim_run_dir(output_dir, resuming=resumed_dir is not None)
        start.held(before)
        if record:
            write_hydra_record(output_dir, record, resumed=resumed_dir is not None)
        if ckpt_path is not None:
            print(resume_line(ckpt_path, saved.get("global_step"), recorded, cfg, by_resume))
    L.seed_everything(cfg.seed, workers=True)
    target, tokenizer, data, module = build_components(cfg)
    if saved_shapes is not None:
        check_checkpoint_fits(ckpt_path, saved_shapes, module)
    configured, bar = _callbacks(cfg, module, [*callbacks, start.first_step])
    trainer = instantiate(cfg.trainer, callbacks=configured, logger=_instantiate_dict(cfg.get("logger")) or False,
                          plugins=[checkpoint_io_for(cfg.get("checkpoint_writes") or "auto", trainer_uses_cuda(cfg.trainer))],
                          **bar)
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path, weights_only=True)
    start.finished()
    return _export_and_report(cfg, trainer, module, target, tokenizer, output_dir, dtype)


def _callbacks(cfg: DictConfig, module, extra) -> tuple[list, dict]:
    """The run's callbacks (configured, the caller's, the safety rules, the config record, the progress display)
    and the Trainer options that go with them."""
    configured = _instantiate_dict(cfg.get("callbacks")) + list(extra)
    configured += [cls() for cls in ALWAYS_ON_CALLBACKS if not any(isinstance(c, cls) for c in configured)]
    configured.append(RecordRunConfig(cfg))
    if not cfg.trainer.get("enable_progress_bar", True) or any(isinstance(c, ProgressBar) for c in configured):
        return configured, {}
    if stdout_is_terminal():
        return configured + [step_progress_bar()], {}   # counts steps: Lightning's own reads "Epoch 0/-2" here
    # A log file: lines every log_every_n_steps and the walk's table, no bar.
    lines = ProgressLines(cfg.trainer.get("log_every_n_steps") or 50, table=lambda tr: _walk_table_now(cfg, module, tr))
    return configured + [lines], {"enable_progress_bar": False}


def _export_and_report(cfg: DictConfig, trainer, module, target, tokenizer, output_dir: Path, dtype) -> dict:
    """After fit: the drafter exported by rank 0 (gathered whole under FSDP), the metrics files, the decode
    evaluation when asked, and the run-end lines and table."""
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
    summary = {"injection": module.drafter.variant, "drafter_arch": module.drafter.config.architecture,
               "mtp_correction_rank": module.drafter.mtp_correction_rank, "global_step": trainer.global_step,
               "target": target.path, **metrics}
    tuned = module.mtp if module.train_mtp else None   # joint training: the MTP travels with its drafter
    # Full tensors on every rank (a collective under FSDP, where each rank holds shards), written by rank 0.
    drafter_state = full_state(module.drafter)
    mtp_state = full_state(tuned) if tuned is not None else None
    with gathered(module):   # the decode below uses the drafter whole (every rank takes part under FSDP)
        if trainer.is_global_zero and not trainer.fast_dev_run:
            drafter_dir = output_dir / "drafter"
            module.drafter.save(drafter_dir, tuned_mtp=tuned, target_path=target.path, state=drafter_state,
                                mtp_state=mtp_state, dtype=dtype, target=target.path,
                                train_config=OmegaConf.to_container(cfg, resolve=False))
            summary["drafter"] = str(drafter_dir)
            write_json(output_dir / "train_metrics.json", summary)
            record = flat_metrics(cfg, summary)
            if cfg.get("decode_eval") and cfg.decode_eval.enabled:
                from dmtp.training.evaluate import decode_after_training

                opts = OmegaConf.to_container(cfg.decode_eval, resolve=True)
                opts.pop("enabled")
                record.update(decode_after_training(target, module.mtp, module.drafter, tokenizer, seed=cfg.seed,
                                                    **opts))
            write_json(output_dir / "metrics.json", record)
            print(f"[dmtp] drafter ({record['method']}) exported to {drafter_dir}")
            if tuned is not None:
                print(f"[dmtp] its jointly trained MTP: {drafter_dir / 'mtp.safetensors'} (the target checkpoint is unchanged)")
            print(f"[dmtp] checkpoints in {output_dir / 'checkpoints'}; TensorBoard logs: tensorboard --logdir {output_dir}")
            # The closing table: the protocol's decoding (greedy and sampled, beside MTP415, on the test prompts)
            # when it ran, else the validation walk (exact greedy acceptance on the validation prompts).
            table = evaluation_table(record["eval"], record["method"], record["global_step"]) if "eval" in record \
                else walk_table(record)
            if table is not None:
                print(table)
                title = ("Held-out decoding (evaluation protocol)" if "eval" in record
                         else "Final validation walk (exact greedy acceptance)")
                set_card_section(drafter_dir, "walk", title, table)
            print(f"[dmtp] decode with it: python -m dmtp.infer drafter={drafter_dir}")
    return summary
