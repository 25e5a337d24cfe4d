"""Train a drafter: `python -m dmtp.train injection=<variant>` (Hydra; see conf/train.yaml).

A command only: the job is dmtp.training.job.train, imported after Hydra has composed the config, so
`--help` and `--cfg job` answer without loading torch, transformers or Lightning.
"""
from __future__ import annotations

import hydra
from omegaconf import DictConfig

from dmtp.cli import one_line_errors


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    from dmtp.quiet import plain_lightning_logging, quiet_known_warnings

    plain_lightning_logging()
    with one_line_errors("dmtp.train"), quiet_known_warnings():
        from hydra.core.hydra_config import HydraConfig

        from dmtp.training.job import train

        summary = train(cfg, overrides=list(HydraConfig.get().overrides.task))   # what resume= may take
    return summary.get("val/tau")


if __name__ == "__main__":
    main()
