"""Keep the known-harmless library messages away from the user of `dmtp.train` / `dmtp.infer`.

Each is matched by its own message, never by category or module, so any other warning still shows:
- transformers' "Token indices sequence length is longer than the specified maximum": dmtp tokenizes
  whole documents and cuts them into windows the target can take itself;
- Lightning's "Found N module(s) in eval mode": the frozen target and MTP are in eval mode on purpose;
- Lightning's "use `self.log('val/...', sync_dist=True)`" across ranks: every rank walks the same rows;
- Lightning's "Tip: ... litlogger / litmodels" advertisements;
- the torch pytree deprecation ("`isinstance(treespec, LeafSpec)` is deprecated") raised inside Lightning.
"""
from __future__ import annotations

import logging
import re
import warnings
from contextlib import contextmanager

WARNING_MESSAGES = (
    r"Found \d+ module\(s\) in eval mode",
    # Every rank walks the same held-out rows (conf/trainer/default.yaml), so the epoch-level values agree.
    r"It is recommended to use `self.log\('val/",
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
)
LOG_MESSAGES = {
    "transformers.tokenization_utils_base": re.compile(r"Token indices sequence length is longer than the "
                                                        r"specified maximum"),
    # Lightning logs its rank-zero info through whichever of these its last imported part installed.
    "lightning.pytorch.utilities.rank_zero": re.compile(r".*Tip: .*(litlogger|litmodels)", re.S),
    "lightning.fabric.utilities.rank_zero": re.compile(r".*Tip: .*(litlogger|litmodels)", re.S),
}


class _DropMessage(logging.Filter):
    def __init__(self, pattern: re.Pattern):
        super().__init__()
        self.pattern = pattern

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.match(record.getMessage())


@contextmanager
def quiet_known_warnings():
    """While the block runs, drop exactly the messages listed above."""
    installed = [(logging.getLogger(name), _DropMessage(pattern)) for name, pattern in LOG_MESSAGES.items()]
    for logger, drop in installed:
        logger.addFilter(drop)
    try:
        with warnings.catch_warnings():
            for message in WARNING_MESSAGES:
                warnings.filterwarnings("ignore", message=message)
            yield
    finally:
        for logger, drop in installed:
            logger.removeFilter(drop)


def plain_lightning_logging() -> None:
    """Lightning prints its info lines ("Seed set to 0", "`Trainer.fit` stopped ...") plainly on stderr when
    it is imported before logging is configured. dmtp.train imports it after Hydra has set up the root
    logger, which would route those lines through Hydra's timestamped format: give Lightning's loggers the
    handler Lightning would have given itself."""
    for name in ("lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        if not logger.handlers:
            logger.addHandler(logging.StreamHandler())
            logger.setLevel(logging.INFO)
            logger.propagate = False
