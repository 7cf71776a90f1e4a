"""The local example's job end to end, rendered as is and run as local pods: its disk tiers keep up.

A fault-free 60-step run of k8s/values/local-cpu.yaml (2 nodes x 2 CPU ranks, the peer replica on,
RAM every 2 steps, NVMe and durable every 10) with the checkpoint defaults the p5 examples run. With
2 staging slots (the old default, one held for the partners' copy) it wrote NVMe and durable storage
at step 0 only; the local values' own 4 slots hid it.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from nvrx_eks.k8s.job_chart import render
from nvrx_eks.k8s.load import load_values
from nvrx_eks.localrun.chaos import reference_trainer
from nvrx_eks.localrun.executor import LocalJob, marked_processes
from nvrx_eks.localrun.summary import summarize
from nvrx_eks.training.events import read_events

LOCAL = Path(__file__).resolve().parents[2] / "k8s" / "values" / "local-cpu.yaml"
STEPS = 60
EVERY = 10


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_local_example_writes_every_disk_tier_at_every_cadence(tmp_path):
    dist = tmp_path / "dist"
    render(load_values(LOCAL, [*reference_trainer(steps=STEPS)]), str(dist))
    job = LocalJob(dist, run_dir=tmp_path / "run", timeout_s=240)
    result = job.run()
    assert result.succeeded, (result.reason, [(p.pod, p.reason, p.exit_code) for p in result.pods])
    assert not marked_processes(job.run_key)
    (run_dir,) = (job.run_dir / "volumes").glob("pvc-*/runs/*")
    events = read_events(run_dir)
    committed: dict[tuple[str, int], set[int]] = {}
    for event in events:
        if event["kind"] == "checkpoint_committed" and event["tier"] in {"local", "durable"}:
            committed.setdefault((event["tier"], event["rank"]), set()).add(event["step"])
    world = {event["rank"] for event in events if event["kind"] == "process_start"}
    assert len(world) == 4
    for tier in ("local", "durable"):
        for rank in sorted(world):
            # A due persist is skipped only while the tier's previous write runs (an fsync on a busy
            # disk can outlast the cadence's 0.4 s here); then the next snapshot writes the newest
            # state: never more than a cadence and a write (at most a cadence) apart, from step 0.
            steps = sorted(committed.get((tier, rank), ()))
            assert steps[:1] == [0], (tier, rank, committed)
            gaps = [b - a for a, b in itertools.pairwise([*steps, STEPS - 1])]
            assert max(gaps) <= 2 * EVERY, (tier, rank, committed)
    # A tier that fell behind all the same (a slow disk) is in the run's report, never silent.
    behind = {e["tier"] for e in events if e["kind"] == "checkpoint_behind"}
    warned = summarize(run_dir).checkpoint_warnings
    assert sorted(line.split()[2] for line in warned) == sorted(behind), warned
