"""`nvrx-eks bench store`: NVRx barrier-rendezvous rounds and a process-group barrier against the store
Deployment's own process, small enough to run in seconds; the barrier's time split between the store
and this machine's simulation of the clients."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from nvrx_eks.bench.store import barrier_arrive, barrier_key, barrier_wait, parse_sims
from nvrx_eks.kitcore.configio import UserError


def test_bench_store_times_rounds_the_control_process_closed(nvrx_eks, tmp_path):
    out = tmp_path / "store.json"
    result = nvrx_eks(
        "bench", "store", "--agents", "64", "--barrier-clients", "0", "--restart-rounds", "2",
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
    # The rounds were NVRx's: its control process (the store Deployment's command) closed round 0 (the
    # first rendezvous) and both restart rounds, each with all 64 agents.
    (log,) = (tmp_path / "runs").glob("store-bench-*/store-64.log")
    text = log.read_text()
    for number in range(3):
        assert f"nvrx-control closed rendezvous round {number}" in text
    assert text.count("Constraint ok: 64 participants") == 3
    assert "round_s" in result.stdout


@pytest.mark.slow
def test_bench_store_splits_the_barrier_between_the_store_and_the_clients(nvrx_eks, tmp_path):
    """One barrier per client simulation, its phases adding up to it, the store's loop thread within the
    store process's CPU, and the summary naming the store's share and the simulation's."""
    out = tmp_path / "store.json"
    result = nvrx_eks(
        "bench", "store", "--agents", "2", "--restart-rounds", "1", "--barrier-clients", "1024",
        "--barrier-sim", "1x4", "--barrier-sim", "2x1024",
        "--json-out", str(out), "--runs", str(tmp_path / "runs"),
        timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    document = json.loads(out.read_text())
    rows = document["barrier"]
    assert [(r["procs"], r["threads"]) for r in rows] == [(1, 4), (2, 1024)]
    for r in rows:
        assert r["clients"] == 1024
        assert 0 < r["barrier_s"] < 60
        assert r["wake_s"] + r["arrive_s"] + r["release_s"] == pytest.approx(r["barrier_s"], abs=0.005)
        # Thread CPU is counted in clock ticks: a short barrier's loop may read 0.
        assert 0 <= r["store_loop_cpu_s"] <= r["store_cpu_s"]
        assert r["clients_cpu_s"] > 0
        assert r["store_share"] == pytest.approx(r["store_loop_cpu_s"] / r["barrier_s"], abs=0.001)
    assert sum(r["store_loop_cpu_s"] for r in rows) > 0
    breakdown = document["barrier_breakdown"]
    fast = min(rows, key=lambda r: r["barrier_s"])
    slow = max(rows, key=lambda r: r["barrier_s"])
    assert breakdown["fastest"] == f"{fast['procs']}x{fast['threads']}"
    assert breakdown["slowest"] == f"{slow['procs']}x{slow['threads']}"
    assert breakdown["store_loop_cpu_s"] == sorted(r["store_loop_cpu_s"] for r in rows)
    assert "store: its event loop busy" in result.stdout
    assert "this machine being the clients" in result.stdout
    # Each barrier on a store process of its own, the clients in the processes the simulation names.
    (folder,) = (tmp_path / "runs").glob("store-bench-*")
    assert {p.name for p in folder.glob("*barrier*")} == {
        "store-barrier-1024-1x4.log", "store-barrier-1024-2x1024.log",
        "clients-barrier-1024-1x4.log", "clients-barrier-1024-2x1024.log",
    }  # fmt: skip


class _RecordingStore:
    """A store that records each operation; `add` counts from `arrived` ranks already in."""

    def __init__(self, arrived: int) -> None:
        self.count = arrived
        self.ops: list[tuple[object, ...]] = []

    def add(self, key: str, amount: int) -> int:
        self.ops.append(("add", key, amount))
        self.count += amount
        return self.count

    def set(self, key: str, value: str) -> None:
        self.ops.append(("set", key, value))

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        del timeout
        self.ops.append(("wait", tuple(keys)))


@pytest.mark.parametrize("arrived", [0, 3])
def test_the_bench_barrier_issues_torchs_store_operations(arrived):
    """The bench times torch's process-group barrier by its store operations (it drives several clients
    per thread, which torch's function cannot): the same operations in the same order, the last
    arrival's included, as the installed torch's `_store_based_barrier`."""
    from torch.distributed.distributed_c10d import _store_based_barrier  # noqa: PLC0415

    world = 4
    theirs = _RecordingStore(arrived)
    _store_based_barrier(0, theirs, "bench", world, timedelta(seconds=5))
    ours = _RecordingStore(arrived)
    barrier_arrive(ours, barrier_key("bench"), world)
    barrier_wait(ours, barrier_key("bench"), timedelta(seconds=5))
    assert ours.ops == theirs.ops
    assert any(op[0] == "set" for op in ours.ops) == (arrived == world - 1)


@pytest.mark.parametrize("spec", ["1x0", "2x1", "x16", "1x300", "four"])
def test_a_client_simulation_the_bench_cannot_run_is_a_user_error(spec):
    with pytest.raises(UserError, match=r"--barrier-sim .*PROCSxTHREADS"):
        parse_sims([spec], clients=256)


def test_bench_store_refuses_more_clients_than_open_files(nvrx_eks, tmp_path):
    result = nvrx_eks("bench", "store", "--agents", "64", "--barrier-clients", "10000000", timeout=60)
    assert result.returncode == 2
    assert "--barrier-clients" in result.stderr
    assert "Traceback" not in result.stderr


def test_bench_store_refuses_a_bad_client_simulation(nvrx_eks):
    result = nvrx_eks("bench", "store", "--barrier-clients", "64", "--barrier-sim", "4x2", timeout=60)
    assert result.returncode == 2
    assert "--barrier-sim '4x2'" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_simulation_past_its_deadline_is_reported_and_the_bench_goes_on(tmp_path):
    from nvrx_eks.bench.store import ClientSim, run_store_bench  # noqa: PLC0415

    document = run_store_bench(
        agents=[],
        barrier_clients=64,
        barrier_sims=[ClientSim(1, 4), ClientSim(2, 64)],
        json_out=None,
        log_dir=tmp_path,
        deadline_s=0.001,
        echo=lambda _: None,
    )
    assert set(document["barrier_failed"]) == {"1x4", "2x64"}
    assert document["barrier"] == []
    assert document["barrier_breakdown"] is None
