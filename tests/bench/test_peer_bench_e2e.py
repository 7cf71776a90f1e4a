"""`nvrx-eks bench peer` end to end, scaled down: two modes through the rendered job and local executor."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_peer_bench_writes_each_modes_figures_beside_the_peers(tmp_path, nvrx_eks):
    # CPU speed (no emulated device time) and 40 steps: the same code path as the full bench, in a minute.
    result = nvrx_eks(
        *("bench", "peer", "--steps", "40", "--device-step-s", "0", "--runs", str(tmp_path)),
        *("--mode", "inprocess", "--mode", "both"),
        timeout=400,
        piped=True,  # as into a file: every table cell whole (tests/test_console.py)
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    (peer_path,) = tmp_path.glob("peer-*/peer.json")
    document = json.loads(peer_path.read_text())
    scenario = document["scenario"]
    assert (scenario["steps"], scenario["emulated_device_step_s"], scenario["durable_every"]) == (40, 0.0, 10)
    assert (scenario["num_faults"], scenario["fault_seed"]) == (5, 42)
    assert set(document["modes"]) == {"inprocess", "both"}
    for name, row in document["modes"].items():
        assert row["completed"], (name, row)
        assert 0.0 < row["training_goodput"] <= row["infra_goodput"] <= 1.0, (name, row)
        assert row["mean_recovery_s"] > 0, (name, row)
        assert len(row["faults"]) == 5, (name, row)
        # Both modes restart in process: every fault is a soft one and none loses a step.
        assert row["steps_lost"] == 0, (name, row)
        assert {f["layer"] for f in row["faults"]} == {"inprocess"}, (name, row)
        # Every second of the wall is named once: steps kept, replayed, checkpoint stall, recovery,
        # startup, the rest; the kept steps are training goodput's numerator.
        parts = row["wall_breakdown_s"]
        assert sum(parts.values()) == pytest.approx(row["wall_s"], abs=0.01), (name, parts)
        assert parts["productive"] == pytest.approx(row["training_goodput"] * row["wall_s"], abs=0.01)
        assert parts["replayed"] == 0.0, (name, parts)
        assert parts["recovery"] > 0, (name, parts)
        assert parts["checkpoint_stall"] > 0, (name, parts)
    # The sample's figures are printed beside ours, marked as theirs.
    assert "31.0%" in result.stdout
    assert "published figures" in result.stdout
    assert "kit goals: training goodput >= 95%" in result.stdout
    assert "Where the wall time went" in result.stdout
    assert "…" not in result.stdout
    assert "peer goodput*" in result.stdout

    # `nvrx-eks plan --from` this run: the plan built from peer.json's scenario and the
    # costs the run measured projects each mode's training goodput within 5 points of the measurement.
    planned = nvrx_eks("plan", "--from", str(tmp_path), "--json", timeout=120)
    assert planned.returncode == 0, planned.stdout[-3000:] + planned.stderr[-3000:]
    projection = json.loads(planned.stdout[planned.stdout.index("{") :])
    for name, row in document["modes"].items():
        projected = projection["modes"][row["mode"]]
        assert projected["measured_goodput"] == pytest.approx(row["training_goodput"]), name
        assert abs(projected["training_goodput"] - row["training_goodput"]) <= 0.05, (name, projected, row)
