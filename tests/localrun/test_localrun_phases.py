"""localrun/phases.py: each recovery's phases, read from event streams, named as the report names them."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from nvrx_eks.localrun.phases import fault_phases, find_event_dirs, main, medians
from nvrx_eks.localrun.summary import fault_summaries
from nvrx_eks.training.metrics import RECOVERY_PHASES


def _ev(t, kind, rank, pid, **fields):
    return {"t": t, "kind": kind, "rank": rank, "pid": pid, **fields}


SIGKILL = {"class": "sigkill", "expected_layer": "ft_launcher"}
EXCEPTION = {"class": "exception", "expected_layer": "inprocess"}


def _sigkill_run(offset=0.0):
    """Two ranks; rank 1 is SIGKILLed at t=10, rank 0 is stopped by the launcher, both restart."""
    o = offset
    return [
        _ev(o + 0.0, "process_start", 0, 100, world_size=2, created_t=o - 1.0),
        _ev(o + 0.0, "process_start", 1, 101, world_size=2, created_t=o - 1.0),
        _ev(o + 9.9, "step", 0, 100, step=7),
        _ev(o + 10.0, "fault_injected", 1, 101, **SIGKILL, step=8, target_rank=1),
        _ev(o + 10.3, "terminated", 0, 100),
        _ev(o + 12.0, "process_start", 0, 200, world_size=2, created_t=o + 11.0),
        _ev(o + 12.5, "process_start", 1, 201, world_size=2, created_t=o + 11.2),
        _ev(o + 14.0, "process_ready", 0, 200),
        _ev(o + 14.4, "process_ready", 1, 201),
        _ev(o + 14.6, "startup_done", 1, 201, tier="memory", load_s=0.01, restored_step=6),
        _ev(o + 14.7, "startup_done", 0, 200, tier="memory", load_s=0.02, restored_step=6),
        _ev(o + 14.8, "step", 1, 201, step=7),
        _ev(o + 14.9, "step", 0, 200, step=7),
        _ev(o + 20.0, "fault_injected", 0, 200, **EXCEPTION, step=12, target_rank=0),
        _ev(o + 20.1, "detected", 1, 201),
        _ev(o + 20.2, "startup_done", 0, 200, tier="inprocess", load_s=0.0, restored_step=11),
        _ev(o + 20.25, "startup_done", 1, 201, tier="inprocess", load_s=0.0, restored_step=11),
        _ev(o + 20.4, "step", 0, 200, step=12),
        _ev(o + 20.5, "step", 1, 201, step=12),
    ]


def test_each_recovery_is_the_phases_summary_json_gives():
    sigkill, exception = fault_phases(_sigkill_run())
    expected = {"detect": 0.3, "teardown": 0.0, "rendezvous": 0.98, "start": 3.4, "restore": 0.02}
    for key, value in {**expected, "first_step": 0.2, "total": 4.9}.items():
        assert sigkill[key] == pytest.approx(value), key
    assert sigkill["tier"] == "memory"
    assert exception["layer"] == "inprocess"
    assert exception["start"] == 0.0
    assert exception["rendezvous"] == pytest.approx(0.15)
    assert exception["total"] == pytest.approx(0.5)
    # The same figures, under the same names, as the run's summary (localrun.summary.FaultPhases).
    summary = fault_summaries(_sigkill_run())[0].phases
    assert summary is not None
    assert {f"{phase}_s": sigkill[phase] for phase in RECOVERY_PHASES} == asdict(summary)


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
    assert med[0]["start"] == pytest.approx(3.4)
