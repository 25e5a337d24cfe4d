"""Decode a prompt set with every method through the one loop: `python -m dmtp.infer` (Hydra; conf/infer.yaml).

With no arguments: the embedded chat-model target (assistant), the newest drafter trained for it in this directory
(`outputs/**/drafter` or `logs/**/drafter`), the embedded held-out prompts of each domain, methods
ar / mtp415 / drafter. Prints a table and writes `metrics.json` to the run directory.

    python -m dmtp.infer drafter=outputs/train/runs/<run>/drafter batch_size=8 max_new_tokens=128
    (drafter=<dir> is short for drafter.path=<dir>)
    python -m dmtp.infer methods=[ar,drafter] temperature=0.7 top_p=0.9
    python -m dmtp.infer target.path=/models/Qwen3-8B drafter=/models/dflash eval.name=gsm8k eval.path=/data/gsm8k
    python -m dmtp.infer eval.name=prompts eval.path=my_prompts.jsonl   # {"prompt": ...} or {"text": ...} per line

A command only: the work is done by dmtp.inference.compare (imported once Hydra has composed the config,
so `--help` and `--cfg job` answer without loading torch). Run as a command, it owns the process: the
thread policy (dmtp.threads) is claimed before anything loads torch.
"""
from __future__ import annotations

import sys

import hydra

from dmtp.cli import drafter_path_shorthand, hydra_faults_one_line, one_line_errors
from dmtp.threads import claim_process


@hydra.main(version_base="1.3", config_path="../conf", config_name="infer")
def _hydra_main(cfg) -> None:
    from hydra.core.hydra_config import HydraConfig

    from dmtp.quiet import quiet_known_warnings
    from dmtp.runs.records import hydra_own_files, unused_dir_removed
    from dmtp.threads import apply_threads

    run_dir = HydraConfig.get().runtime.output_dir
    with one_line_errors("dmtp.infer"), quiet_known_warnings(), unused_dir_removed(run_dir, hydra_own_files()):
        print(apply_threads(cfg.get("threads")))
        from dmtp.inference.compare import compare_methods
        from dmtp.inference.options import named_methods

        compare_methods(cfg, named_methods(cfg, list(HydraConfig.get().overrides.task)))


def main() -> None:
    sys.argv = [sys.argv[0], *drafter_path_shorthand(sys.argv[1:])]
    with hydra_faults_one_line("dmtp.infer"):
        _hydra_main()


if __name__ == "__main__":
    claim_process()
    main()
