"""OmegaConf resolvers used by conf/, registered on `import dmtp` (before Hydra composes anything).

- `${dmtp_run_id:}`: a short random id, one value per composed config (cached like Hydra's `${now:}`,
  whose cache Hydra copies into every job of a multirun), so that runs started in the same second
  (a shell loop, a scheduler) never share a run directory.
- `${dmtp_run_dir:${resume},${ckpt_path},<default>}`: a resumed run continues in its own directory.
"""
from __future__ import annotations

import secrets

from omegaconf import OmegaConf

from dmtp.runs.dirs import hydra_run_dir


def _run_dir(resume, ckpt_path, default):
    return hydra_run_dir(resume, ckpt_path, default)


def register() -> None:
    OmegaConf.register_new_resolver("dmtp_run_id", lambda: secrets.token_hex(3), use_cache=True, replace=True)
    OmegaConf.register_new_resolver("dmtp_run_dir", _run_dir, replace=True)
