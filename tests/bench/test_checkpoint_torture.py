"""`nvrx-eks bench checkpoint`'s kill -9 trials: the events of the killed ranks are counted, not shown."""

from __future__ import annotations

import pytest

from nvrx_eks.bench.checkpoint.torture import EVENTS_LOG, run_trials


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_trials_count_the_ranks_events_by_kind_and_print_none_of_them(tmp_path, capfd):
    result = run_trials(root=tmp_path, trials=4, seed=5, max_kill_s=1.0)
    out, err = capfd.readouterr()
    assert result["ok"] == result["trials"] == 4, result
    # Whatever the killed ranks logged went to the trials' own file, one readable line each.
    assert "checkpoint_" not in out + err, out + err
    logged = (tmp_path / EVENTS_LOG).read_text().splitlines() if (tmp_path / EVENTS_LOG).exists() else []
    assert all(line.startswith("checkpoint_") and "{'" not in line for line in logged), logged[:5]
    assert sum(result["events"].values()) == len(logged)
