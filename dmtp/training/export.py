"""After fit: the drafter exported by rank 0 (gathered whole under FSDP) in the run's export precision, the metrics
files (one flat record per job for sweeps), the decode evaluation when asked, and the run-end lines and table."""
from __future__ import annotations

import re
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from dmtp.atomic_io import write_json
from dmtp.configs import override
from dmtp.drafters.registry import method_name
from dmtp.models.model_card import set_card_section
from dmtp.reports.evaluation import evaluation_table
from dmtp.reports.walk import walk_table
from dmtp.training.fsdp import full_state, gathered


EXPORT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_PRECISION_DTYPES = {"bf16-mixed": "bfloat16", "bf16-true": "bfloat16", "bf16": "bfloat16",
                     "16-mixed": "float16", "16-true": "float16", "16": "float16"}


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


def walk_table_now(cfg: DictConfig, module, trainer) -> str | None:
    """The walk's table from the metrics of the validation that just ended (ProgressLines, in log files)."""
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
    summary = {"injection": module.drafter.variant, "drafter_arch": module.drafter.config.architecture,
               "mtp_correction_rank": module.drafter.mtp_correction_rank, "global_step": trainer.global_step, **metrics}
    return walk_table(flat_metrics(cfg, summary))


def save_data_token_counts(drafter_dir: Path, trainer, target):
    """The drafter data's supervised-token counts beside the exported drafter (draft_vocab/token_counts.safetensors: its draft
    vocabulary of any size, dmtp.models.draft_vocab); -> the counts (None where the data has no rows in memory)."""
    from dmtp.models.draft_vocab import save_token_counts, token_counts

    rows = getattr(getattr(trainer, "datamodule", None), "train_rows", None)
    if not rows:
        return None
    counts = token_counts(rows, target.lm_head.weight.shape[0])
    save_token_counts(drafter_dir, counts, "the training rows' supervised tokens (dmtp.training.export)")
    return counts


def export_and_report(cfg: DictConfig, trainer, module, target, tokenizer, output_dir: Path, dtype) -> dict:
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
            counts = save_data_token_counts(drafter_dir, trainer, target)
            write_json(output_dir / "train_metrics.json", summary)
            record = flat_metrics(cfg, summary)
            if cfg.get("decode_eval") and cfg.decode_eval.enabled:
                from dmtp.training.evaluate import decode_after_training

                opts = OmegaConf.to_container(cfg.decode_eval, resolve=True)
                opts.pop("enabled")
                trained = list(cfg.data.domains) if cfg.data.get("source") == "embedded" else []
                record.update(decode_after_training(target, module.mtp, module.drafter, tokenizer, seed=cfg.seed,
                                                    trained_domains=trained, token_counts=counts, **opts))
            write_json(output_dir / "metrics.json", record)
            print(f"[dmtp] drafter ({record['method']}) exported to {drafter_dir}")
            if tuned is not None:
                print(f"[dmtp] its jointly trained MTP: {drafter_dir / 'mtp.safetensors'} (the target checkpoint is unchanged)")
            # only what the run wrote (callbacks=none saves no checkpoint, logger=none or csv no TensorBoard log)
            kept = [f"checkpoints in {output_dir / 'checkpoints'}"] if (output_dir / "checkpoints").is_dir() else []
            kept += [f"TensorBoard logs: tensorboard --logdir {output_dir}"] if (output_dir / "tensorboard").is_dir() \
                else []
            if kept:
                print(f"[dmtp] {'; '.join(kept)}")
            # The closing table: the protocol's decoding (greedy and sampled, beside MTP415, on the test prompts)
            # when it ran, else the validation walk (exact greedy acceptance on the validation prompts).
            table = evaluation_table(record["eval"], record["method"], record["global_step"]) if "eval" in record \
                else walk_table(record)
            if table is not None:
                print(table)
                title = ("Held-out decoding (evaluation protocol)" if "eval" in record
                         else "Final validation walk (exact greedy acceptance)")
                set_card_section(drafter_dir, "walk", title, table)
            print(f"[dmtp] decode with it: python -m dmtp.infer {override('drafter', drafter_dir)}")
    return summary
