"""Train a drafter: `python -m dmtp.train injection=<variant>` (Hydra; see conf/train.yaml).

A command only: the job is dmtp.training.job.train, imported after Hydra has composed the config, so
`--help` and `--cfg job` answer without loading torch, transformers or Lightning. Run as a command, it
owns the process: the thread policy (dmtp.threads) is claimed before anything loads torch.
"""
from __future__ import annotations

import hydra
from omegaconf import DictConfig

from dmtp.cli import hydra_faults_one_line, one_line_errors
from dmtp.threads import claim_process


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def _hydra_main(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig

    from dmtp.quiet import plain_lightning_logging, quiet_known_warnings
    from dmtp.runs.records import hydra_record, unused_dir_removed
    from dmtp.threads import apply_threads

    plain_lightning_logging()
    run_dir = HydraConfig.get().runtime.output_dir
    with one_line_errors("dmtp.train"), quiet_known_warnings(), unused_dir_removed(run_dir):
        print(apply_threads(cfg.get("threads")))
        from dmtp.training.job import train

        overrides = list(HydraConfig.get().overrides.task)
        summary = train(cfg, overrides=overrides,      # what resume= may take
                        record=hydra_record(cfg))      # written once the run holds its dir
    if not overrides and HydraConfig.get().mode.name == "RUN":   # the quick start: the next command to run
        print("[dmtp] the same beside raw DFlash trained alike, one table: python -m dmtp.train -m +sweep=quickstart")
    return summary.get("val/tau")


def main() -> None:
    with hydra_faults_one_line("dmtp.train"):
        _hydra_main()


if __name__ == "__main__":
    claim_process()
    main()
