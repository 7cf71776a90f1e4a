"""`nvrx-eks bench store`: NVRx barrier-rendezvous rounds and a process-group barrier against the store
Deployment's own process, small enough to run in seconds."""

from __future__ import annotations

import json


def test_bench_store_times_rounds_the_control_process_closed(nvrx_eks, tmp_path):
    out = tmp_path / "store.json"
    result = nvrx_eks(
        "bench", "store", "--agents", "64", "--barrier-clients", "256", "--restart-rounds", "2",
        "--json-out", str(out), "--runs", str(tmp_path / "runs"),
        timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    document = json.loads(out.read_text())
    (row,) = document["store"]
    assert row["agents"] == 64
    assert len(row["rounds_s"]) == 2
    assert 0 < row["closed_s"] <= row["round_s"] < 60
    assert row["rss_mb"] > 0
    assert row["store_cpu_s"] > 0
    assert document["barrier"]["clients"] == 256
    assert 0 < document["barrier"]["barrier_s"] < 60
    # The rounds were NVRx's: its control process (the store Deployment's command) closed round 0 (the
    # first rendezvous) and both restart rounds, each with all 64 agents.
    (log,) = (tmp_path / "runs").glob("store-bench-*/store-64.log")
    text = log.read_text()
    for number in range(3):
        assert f"nvrx-control closed rendezvous round {number}" in text
    assert text.count("Constraint ok: 64 participants") == 3
    assert "round_s" in result.stdout
    assert "barrier: 256 clients" in result.stdout


def test_bench_store_refuses_more_clients_than_open_files(nvrx_eks, tmp_path):
    result = nvrx_eks("bench", "store", "--agents", "64", "--barrier-clients", "10000000", timeout=60)
    assert result.returncode == 2
    assert "--barrier-clients" in result.stderr
    assert "Traceback" not in result.stderr
