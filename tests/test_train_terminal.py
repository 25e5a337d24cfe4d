"""What `python -m dmtp.train` shows: the per-domain walk table (its place at the end of a run is checked
in test_regenerate), the progress bar in steps, and none of the known-harmless library messages
(filtered by message only)."""
from __future__ import annotations

import logging
import warnings
from types import SimpleNamespace

import pytest

from dmtp.quiet import quiet_known_warnings
from dmtp.runs.progress import step_description
from dmtp.reports.walk import walk_rows, walk_table


def _record():
    record = {"method": "dual_anchor_zero_init", "global_step": 1200, "val/code/loss": 1.0}
    for domain, tau in (("prose", 2.5), ("code", 4.0)):
        record.update({f"walk/{domain}/tau": tau, f"walk/{domain}/t1_accept": tau / 5,
                       **{f"walk/{domain}/p_len_ge_{k}": 1 / k for k in range(1, 8)}})
    return record


def test_walk_table_has_one_row_per_domain():
    rows = walk_rows(_record())
    assert [r["domain"] for r in rows] == ["code", "prose"]
    assert rows[0] == {"domain": "code", "tau": 4.0, "t1_accept": 0.8, "P(L>=2)": 0.5, "P(L>=4)": 0.25,
                       "P(L>=7)": 1 / 7}
    text = walk_table(_record())
    assert "dual_anchor_zero_init at step 1200" in text and "P(L>=4)" in text
    assert walk_table({"method": "x", "global_step": 3}) is None   # no walk ran (model.val_walk=false)
    assert "mtp415" not in text   # no chain walked (raw_dflash, or model.val_mtp_chain_steps=0)


def test_walk_table_puts_the_mtp_chain_beside_the_drafter():
    record = _record()
    for domain, tau in (("prose", 2.3), ("code", 3.0)):
        record.update({f"walk/{domain}/mtp415_tau": tau, f"walk/{domain}/mtp415_t1_accept": 0.7,
                       f"walk/{domain}/mtp415_tau_all_anchors": tau, **{f"walk/{domain}/mtp415_p_len_ge_{k}": 0.1 * k
                                                                        for k in range(1, 8)}})
    code = walk_rows(record)[0]
    assert code["tau"] == 4.0 and code["mtp415 tau"] == 3.0 and code["mtp415 t1_accept"] == 0.7
    assert (code["mtp415 P(L>=2)"], code["mtp415 P(L>=4)"]) == (0.2, 0.4) and "mtp415 P(L>=7)" not in code
    text = walk_table(record)
    assert "mtp415: the target's MTP chained alone on the same sequences" in text
    header = text.splitlines()[1].split()
    assert header[:3] == ["domain", "tau", "t1_accept"] and header[6:8] == ["mtp415", "tau"]
    tuned = {k.replace("mtp415_", "mtp415_tuned_"): v for k, v in record.items()}   # model.train_mtp=true
    assert walk_rows(tuned)[0]["mtp415_tuned tau"] == 3.0
    assert "mtp415_tuned: the jointly trained MTP chained alone" in walk_table(tuned)


def test_flat_record_names_both_walks():
    from omegaconf import OmegaConf

    from dmtp.training.export import flat_metrics

    summary = {"injection": "dual_anchor_zero_init", "drafter_arch": "DFlashDraftModel", "global_step": 5,
               "val/code/tau": 3.0, "val/code/P(L>=3)": 0.5, "val/code/mtp415_P(L>=3)": 0.25,
               "val/code/mtp415_tau": 2.0, "val/code/loss": 1.5, "val/tau": 3.0}
    record = flat_metrics(OmegaConf.create({"seed": 0}), summary)
    assert record["walk/code/p_len_ge_3"] == 0.5 and record["walk/code/mtp415_p_len_ge_3"] == 0.25
    assert record["walk/code/mtp415_tau"] == 2.0 and record["val/code/loss"] == 1.5 and "val/tau" not in record


def test_progress_bar_counts_steps():
    assert step_description(SimpleNamespace(max_steps=1200, global_step=37, current_epoch=0)) == "step 37/1200"
    assert step_description(SimpleNamespace(max_steps=-1, global_step=5, current_epoch=2)) == "step 5 (epoch 2)"


@pytest.mark.parametrize("message", ["Found 88 module(s) in eval mode at the start of training.",
                                     "`isinstance(treespec, LeafSpec)` is deprecated, use ... instead."])
def test_known_warnings_are_dropped_and_others_kept(message):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with quiet_known_warnings():
            warnings.warn(message, UserWarning)
            warnings.warn("something else went wrong", UserWarning)
    assert [str(w.message) for w in caught] == ["something else went wrong"]


@pytest.mark.parametrize("logger_name,message", [
    ("transformers.tokenization_utils_base", "Token indices sequence length is longer than the specified maximum "
                                             "sequence length for this model (900 > 512)."),
    ("lightning.pytorch.utilities.rank_zero", "💡 Tip: For seamless cloud logging and experiment tracking, try "
                                              "installing [litlogger](https://pypi.org/project/litlogger/)"),
])
def test_known_log_lines_are_dropped_and_others_kept(logger_name, message):
    logger = logging.getLogger(logger_name)
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger.addHandler(handler)
    level, logger.level = logger.level, logging.INFO
    try:
        with quiet_known_warnings():
            logger.warning(message)
            logger.warning("a real problem")
        logger.warning(message)   # outside the commands nothing is filtered
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert seen == ["a real problem", message]


def test_walk_table_shows_the_whole_block():
    """A block-16 drafter's walk has P(L>=k) up to 15: the table's last column is the whole block."""
    record = {"method": "raw_dflash", "global_step": 3, "walk/code/tau": 5.0, "walk/code/t1_accept": 0.5,
              **{f"walk/code/p_len_ge_{k}": 1 / k for k in range(1, 16)}}
    row = walk_rows(record)[0]
    assert [k for k in row if k.startswith("P(")] == ["P(L>=2)", "P(L>=4)", "P(L>=15)"]
    assert "P(L>=15)" in walk_table(record)
