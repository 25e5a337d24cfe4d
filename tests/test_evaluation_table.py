"""The table a training run ends with (dmtp.reports.evaluation): the drafter beside each MTP baseline decoded."""
from dmtp.reports.evaluation import evaluation_table


def _stats(taus):
    return {"tau": sum(taus) / len(taus), "tau_requests": taus}


def _record(methods):
    per_workload = {wl: {m: _stats(taus) for m, taus in methods.items()} for wl in ("code", "math")}
    return {"protocol": {"workloads": {"code": 8, "math": 8}, "target": "t", "target_digest": "abc",
                         "max_new_tokens": 16, "batch_size": 8},
            "modes": {"greedy": per_workload, "T=1 rejection": per_workload}}


def test_the_table_compares_the_drafter_with_mtp415_and_with_mtp7_where_decoded():
    drafter, mtp415, mtp7 = [5.0, 5.2, 4.9, 5.1] * 2, [3.0, 3.1, 2.9, 3.0] * 2, [5.0, 5.1, 5.0, 5.2] * 2
    table = evaluation_table(_record({"drafter": drafter, "mtp415": mtp415, "mtp:7": mtp7}), "m")
    header = table.splitlines()[2]
    assert "greedy vs mtp415" in header and "greedy vs mtp:7" in header and "T=1 rejection mtp:7" in header
    code_row = next(line for line in table.splitlines() if line.lstrip("| ").startswith("code"))
    assert "wins" in code_row and "~" in code_row      # apart from MTP415, within noise of mtp:7


def test_without_mtp7_the_table_has_mtp415_alone():
    table = evaluation_table(_record({"drafter": [2.0, 2.1] * 4, "mtp415": [2.0, 2.2] * 4}), "m")
    assert "mtp:7" not in table and "greedy vs mtp415" in table
    assert evaluation_table({"modes": {}}, "m") is None
