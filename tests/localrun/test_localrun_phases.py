"""localrun/phases.py: each recovery's milestones, read from event streams."""

from __future__ import annotations

import json

from nvrx_eks.localrun.phases import fault_phases, find_event_dirs, main, medians


def _ev(t, kind, rank, pid, **fields):
    return {"t": t, "kind": kind, "rank": rank, "pid": pid, **fields}


def _sigkill_run(offset=0.0):
    """Two ranks; rank 1 is SIGKILLed at t=10, rank 0 is stopped by the launcher, both restart."""
    o = offset
    return [
        _ev(o + 0.0, "process_start", 0, 100, world_size=2, created_t=o - 1.0),
        _ev(o + 0.0, "process_start", 1, 101, world_size=2, created_t=o - 1.0),
        _ev(o + 9.9, "step", 0, 100, step=7),
        _ev(o + 10.0, "fault_injected", 1, 101, **{"class": "sigkill"}, step=8, target_rank=1),
        _ev(o + 10.3, "terminated", 0, 100),
        _ev(o + 12.0, "process_start", 0, 200, world_size=2, created_t=o + 11.0),
        _ev(o + 12.5, "process_start", 1, 201, world_size=2, created_t=o + 11.2),
        _ev(o + 14.0, "process_ready", 0, 200),
        _ev(o + 14.4, "process_ready", 1, 201),
        _ev(o + 14.6, "startup_done", 1, 201, tier="memory", load_s=0.01),
        _ev(o + 14.7, "startup_done", 0, 200, tier="memory", load_s=0.02),
        _ev(o + 14.8, "step", 1, 201, step=7),
        _ev(o + 14.9, "step", 0, 200, step=7),
        _ev(o + 20.0, "fault_injected", 0, 200, **{"class": "exception"}, step=12, target_rank=0),
        _ev(o + 20.1, "detected", 1, 201),
        _ev(o + 20.2, "startup_done", 0, 200, tier="inprocess", load_s=0.0),
        _ev(o + 20.25, "startup_done", 1, 201, tier="inprocess", load_s=0.0),
        _ev(o + 20.4, "step", 0, 200, step=12),
        _ev(o + 20.5, "step", 1, 201, step=12),
    ]


def test_launcher_restart_milestones_are_the_slowest_ranks():
    sigkill, exception = fault_phases(_sigkill_run())
    assert sigkill["layer"] == "launcher"
    expected = {"detect": 0.3, "gone": 0.3, "spawn": 1.2, "start": 2.5, "ready": 4.4, "restore": 4.7}
    for key, value in expected.items():
        assert abs(sigkill[key] - value) < 1e-6, key
    assert abs(sigkill["step_t"] - 4.9) < 1e-6
    assert sigkill["tier"] == "memory"
    assert sigkill["load_s"] == 0.02
    assert exception["layer"] == "inprocess"
    assert exception["gone"] is None
    assert abs(exception["restore"] - 0.25) < 1e-6
    assert abs(exception["step_t"] - 0.5) < 1e-6


def test_cli_reads_demo_folders_and_prints_medians(tmp_path, capsys):
    for i, offset in enumerate((0.0, 100.0)):
        events = tmp_path / f"demo-{i}" / "chaos" / "runs" / "job" / "events"
        events.mkdir(parents=True)
        (tmp_path / f"demo-{i}" / "fault-free" / "events").mkdir(parents=True)
        (tmp_path / f"demo-{i}" / "fault-free" / "events" / "rank-0.jsonl").write_text("")
        by_rank: dict[int, list[str]] = {}
        for event in _sigkill_run(offset):
            by_rank.setdefault(event["rank"], []).append(json.dumps(event))
        for rank, lines in by_rank.items():
            (events / f"rank-{rank}.jsonl").write_text("\n".join(lines) + "\n")
    assert [d.name for d in find_event_dirs(tmp_path)] == ["job", "job"]  # fault-free runs left out
    assert main([str(tmp_path / "demo-0"), str(tmp_path / "demo-1")]) == 0
    out = capsys.readouterr().out
    assert "median of 2 runs" in out
    assert "sigkill@8:1" in out
    med = medians([fault_phases(_sigkill_run()), fault_phases(_sigkill_run(100.0))])
    assert abs(med[0]["ready"] - 4.4) < 1e-6
