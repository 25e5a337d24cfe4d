"""Write a training run's data before it, shared out over W workers: `python -m dmtp.prepare step=regen|capture|merge
[workers=W worker=i] <the run's options>` (Hydra; conf/prepare.yaml composes conf/train.yaml).

A command only: the job is dmtp.training.prepare.prepare, imported after Hydra has composed the config.
"""
from __future__ import annotations

import hydra
from omegaconf import DictConfig

from dmtp.cli import hydra_faults_one_line, one_line_errors
from dmtp.threads import claim_process


@hydra.main(version_base="1.3", config_path="../conf", config_name="prepare")
def _hydra_main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from dmtp.quiet import quiet_known_warnings
    from dmtp.runs.records import dir_removed_if_unused
    from dmtp.threads import apply_threads

    run_dir = HydraConfig.get().runtime.output_dir
    with one_line_errors("dmtp.prepare"), quiet_known_warnings(), dir_removed_if_unused(run_dir):
        print(apply_threads(cfg.get("threads")))
        from dmtp.training.prepare import prepare

        prepare(cfg)


def main() -> None:
    with hydra_faults_one_line("dmtp.prepare"):
        _hydra_main()


if __name__ == "__main__":
    claim_process()
    main()
