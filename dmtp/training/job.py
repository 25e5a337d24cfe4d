"""One training job from a composed config (the body of `python -m dmtp.train`; conf/train.yaml): the run's plan
(dmtp.runs.plan), the checks that answer before anything is built, the run directory claimed, the components
built (dmtp.training.components), the trainer's fit, then the export and report (dmtp.training.export)."""
from __future__ import annotations

import os
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import LearningRateMonitor, ProgressBar
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, ListConfig, OmegaConf

from dmtp.configs import instantiate
from dmtp.inference.options import check_speed_profile
from dmtp.runs.checkpoint_io import checkpoint_io_for
from dmtp.runs.first_step import UntilFirstStep, paths_under
from dmtp.runs.dirs import continued_run_dir
from dmtp.runs.guards import FiniteGuard
from dmtp.runs.lock import RunDirLock
from dmtp.runs.plan import RunPlan, plan_run
from dmtp.runs.progress import ProgressLines, step_progress_bar, stdout_is_terminal
from dmtp.runs.records import created_by_this_command, write_hydra_record
from dmtp.runs.recorded_config import RecordRunConfig
from dmtp.runs.resume import check_checkpoint_fits, claim_run_dir
from dmtp.runs.rng_state import ResumableRNG
from dmtp.training.components import build_components, trainer_uses_cuda, uses_feature_cache
from dmtp.training.data_options import checked_before_loading
from dmtp.training.export import export_and_report, export_dtype, walk_table_now
from dmtp.training.module_options import options_of

# Safety rules, not options: added to every run (callbacks=none included) unless already configured.
ALWAYS_ON_CALLBACKS = (FiniteGuard, ResumableRNG)


def train(cfg: DictConfig, callbacks=(), overrides: list[str] | None = None, record: dict | None = None) -> dict:
    """Run one training job; `callbacks` are extra Lightning callbacks (notebooks, tests). `overrides`: the
    options given on the command line, which `resume=` checks (dmtp.runs.recorded_config); None: all of `cfg`.
    `record`: Hydra's record of the command (dmtp.runs.records.hydra_record), written once the run holds its
    directory.

    A run that stops before its first step leaves its directory as it found it (dmtp.runs.first_step); the
    directory is held against any other writer until the run ends (dmtp.runs.lock)."""
    given = OmegaConf.select(cfg, "paths.output_dir", throw_on_resolution_failure=False)   # None: set by resume=
    given_dir = Path(given) if given else None
    start = UntilFirstStep(given_dir, made=given_dir is not None and (created_by_this_command(given_dir)
                                                                      or not given_dir.exists()))
    lock = RunDirLock()
    try:
        return _train(cfg, callbacks, overrides, record, start, lock)
    except BaseException:
        if rank_zero_only.rank == 0:
            start.undo()
        raise
    finally:
        lock.release()


def _train(cfg: DictConfig, callbacks, overrides, record, start: UntilFirstStep, lock: RunDirLock) -> dict:
    rank0 = process_rank(cfg) == 0
    continued = continued_run_dir(cfg.get("resume"), cfg.get("ckpt_path"))
    if rank0 and continued is not None:   # a run in use is said before anything about its checkpoints
        lock.take(continued)
    plan = plan_run(cfg, overrides)
    cfg = plan.cfg
    if plan.output_dir != start.run_dir:
        start.run_dir, start.made = plan.output_dir, False
    dtype = export_dtype(cfg)   # bad options answer before anything is built
    check_run_length(cfg.trainer, plan.saved_step)
    options_of(cfg.model)       # the model's options likewise (each record checks its own)
    check_decode_eval_fits(cfg)
    trainer_uses_cuda(cfg.trainer)
    checked_before_loading(cfg.data)
    if rank0:
        _hold_run_dir(plan, start, record, lock)
    L.seed_everything(cfg.seed, workers=True)
    target, tokenizer, data, module = build_components(cfg)
    if plan.saved_shapes is not None:
        check_checkpoint_fits(plan.ckpt_path, plan.saved_shapes, module)
    loggers = _instantiate_dict(cfg.get("logger"))
    configured, bar = _callbacks(cfg, module, [*callbacks, start.first_step], logged=bool(loggers))
    trainer = instantiate(cfg.trainer, callbacks=configured, logger=loggers or False,
                          plugins=[checkpoint_io_for(cfg.get("checkpoint_writes") or "auto", trainer_uses_cuda(cfg.trainer))],
                          **bar)
    trainer.fit(module, datamodule=data, ckpt_path=plan.ckpt_path, weights_only=True)
    require_trained(trainer)
    start.finished()
    return export_and_report(cfg, trainer, module, target, tokenizer, plan.output_dir, dtype)


def _hold_run_dir(plan: RunPlan, start: UntilFirstStep, record: dict | None, lock: RunDirLock) -> None:
    """Rank 0 holds the run's directory against any other writer, claims it (or keeps the one it resumes), notes
    what was there before, writes Hydra's record of the command and says what a continued run continues from."""
    lock.take(plan.output_dir)
    before = paths_under(plan.output_dir) - ({lock.path} if lock.created else set())   # its lock file: the run's own
    claim_run_dir(plan.output_dir, resuming=plan.resuming)
    start.held(before)
    if record:
        write_hydra_record(plan.output_dir, record, resumed=plan.resuming)
    line = plan.resume_line()
    if line:
        print(line)


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


def check_run_length(trainer_cfg, reached: int | None = None) -> None:
    """trainer.max_steps: the run's length, over which its LR schedule is laid out (dmtp.training.module's
    warmup_cosine), a whole number of steps >= 1 and, for a continued run, not below the step it has `reached`.

    Lightning's 0 would export an untrained drafter, its -1 run without end; a continued run whose max_steps is
    below its checkpoint's step would train nothing and export that checkpoint again, saying nothing."""
    steps = trainer_cfg.get("max_steps")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"trainer.max_steps must be an integer >= 1 (the run's length in optimizer steps, over "
                         f"which its learning-rate schedule is laid out), got {steps!r}")
    if reached is not None and steps < reached:
        raise ValueError(f"trainer.max_steps={steps} is below the step the checkpoint was saved at ({reached}): "
                         f"nothing would be trained; give trainer.max_steps > {reached} to train on (= {reached} "
                         "exports it again)")


def require_trained(trainer) -> None:
    """After fit: a run that took no training step (trainer.limit_train_batches=0, trainer.max_epochs=0, ...) exports
    no drafter, since an untrained one would be decoded later as the newest trained drafter.

    Raised before the run counts as finished, so its directory is left as it was found (dmtp.runs.first_step)."""
    if trainer.global_step < 1:
        raise ValueError("the run took no training step (global step 0; check trainer.limit_train_batches and "
                         "trainer.max_epochs), so no drafter was exported")


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
    if cfg.get("decode_eval") and cfg.decode_eval.enabled:   # its table's speed-up column, priced after the run
        check_speed_profile(cfg.decode_eval.get("speed_profile"), "decode_eval.speed_profile")


def _instantiate_dict(node) -> list:
    return [instantiate(v) for v in (node or {}).values() if v is not None and "_target_" in v]



def _callbacks(cfg: DictConfig, module, extra, logged: bool = True) -> tuple[list, dict]:
    """The run's callbacks (configured, the caller's, the safety rules, the config record, the progress display)
    and the Trainer options that go with them.

    Without a logger (logger=none) the learning-rate monitor, which only writes to one (and refuses to start without
    it), is left out."""
    configured = [c for c in _instantiate_dict(cfg.get("callbacks")) + list(extra)
                  if logged or not isinstance(c, LearningRateMonitor)]
    configured += [cls() for cls in ALWAYS_ON_CALLBACKS if not any(isinstance(c, cls) for c in configured)]
    configured.append(RecordRunConfig(cfg))
    if not cfg.trainer.get("enable_progress_bar", True) or any(isinstance(c, ProgressBar) for c in configured):
        return configured, {}
    if stdout_is_terminal():
        return configured + [step_progress_bar()], {}   # counts steps: Lightning's own reads "Epoch 0/-2" here
    # A log file: lines every log_every_n_steps and the walk's table, no bar.
    lines = ProgressLines(cfg.trainer.get("log_every_n_steps") or 50, table=lambda tr: walk_table_now(cfg, module, tr))
    return configured + [lines], {"enable_progress_bar": False}
