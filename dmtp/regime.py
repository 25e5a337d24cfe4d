"""Place a target among served models: `python -m dmtp.regime` (Hydra; conf/regime.yaml).

    python -m dmtp.regime                              # the embedded chat-model target (assistant)
    python -m dmtp.regime target=tiny                  # the embedded base-model target
    python -m dmtp.regime target.path=/models/Qwen3.6-27B num_prompts=32

A command only: the work is done by dmtp.inference.regime_run (imported once Hydra has composed the config).
"""
from __future__ import annotations

import hydra

from dmtp.cli import hydra_faults_one_line, one_line_errors
from dmtp.threads import claim_process


@hydra.main(version_base="1.3", config_path="../conf", config_name="regime")
def _hydra_main(cfg) -> None:
    from hydra.core.hydra_config import HydraConfig

    from dmtp.quiet import quiet_known_warnings
    from dmtp.runs.records import hydra_own_files, unused_dir_removed
    from dmtp.threads import apply_threads

    run_dir = HydraConfig.get().runtime.output_dir
    with one_line_errors("dmtp.regime"), quiet_known_warnings(), unused_dir_removed(run_dir, hydra_own_files()):
        print(apply_threads(cfg.get("threads")))
        from dmtp.inference.regime_run import report_regime

        report_regime(cfg)


def main() -> None:
    with hydra_faults_one_line("dmtp.regime"):
        _hydra_main()


if __name__ == "__main__":
    claim_process()
    main()
