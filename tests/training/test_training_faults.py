"""The trainer under injected faults: real processes, 2 local nodes x 2 CPU ranks under ft_launcher.

Mode `both` (in-process restart inside ft_launcher, `--ft-restart-policy min-healthy` as NVRx 0.4.1's
integration guide and the job chart use it). Two faulty runs -- the soft classes (recovered in process)
and the hard classes (process death, deadlock below Python, node loss) -- are each compared with one
fault-free torchrun run of the same config, computed once per module: the final parameters must be
bit-identical. Every job runs under a hard bound and its processes are killed and checked for in
teardown (tests/training/conftest.py).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from training.metrics import summarize

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.slow

STEPS = 20
SOFT_PLAN = "exception@3:1,hang@6:0,skip_collective@9:3,oom@12:2"
HARD_PLAN = "sigkill@4:1,deadlock@9:2,node_loss@14:3"


def _args(run_dir: Path, *, mode: str, plan: str) -> list[str]:
    return [
        "--mode",
        mode,
        "--steps",
        str(STEPS),
        "--faults-plan",
        plan,
        "--log-every",
        "10",
        # The synchronous reference checkpointer, every 2 steps, to the durable tier under the run dir.
        "--checkpoint-implementation",
        "sync",
        "--checkpoint-durable-every",
        "2",
        "--checkpoint-memory-dir",
        f"/dev/shm/nvrx-eks-test-{run_dir.parent.name}-{run_dir.name}",
    ]


def _final_hash(run_dir: Path) -> str:
    return json.loads((run_dir / "final.json").read_text())["final_params_sha256"]


@pytest.fixture(scope="module")
def fault_free_hash(training_tmp: Path, local_job) -> str:
    run_dir = training_tmp / "reference"
    local_job(run_dir, _args(run_dir, mode="baseline", plan=""), timeout_s=90, launcher="torchrun")
    return _final_hash(run_dir)


def _faulty_run(local_job, run_dir: Path, plan: str, *, timeout_s: float):
    return local_job(
        run_dir,
        _args(run_dir, mode="both", plan=plan),
        timeout_s=timeout_s,
        restart_policy="min-healthy",
    )


@pytest.mark.timeout(200)
def test_soft_faults_recover_in_process_losing_at_most_one_step(training_tmp, fault_free_hash, local_job):
    run_dir = training_tmp / "soft"
    _faulty_run(local_job, run_dir, SOFT_PLAN, timeout_s=150)

    summary = summarize(run_dir)
    assert summary.completed, summary
    assert sorted(f.cls for f in summary.faults) == ["exception", "hang", "oom", "skip_collective"]
    for fault in summary.faults:
        assert fault.layer == fault.expected_layer == "inprocess", fault
        assert fault.steps_lost is not None, fault
        assert fault.steps_lost <= 1, fault
    assert _final_hash(run_dir) == fault_free_hash


@pytest.mark.timeout(260)
def test_hard_faults_recover_through_launcher_and_job_controller(training_tmp, fault_free_hash, local_job):
    run_dir = training_tmp / "hard"
    job = _faulty_run(local_job, run_dir, HARD_PLAN, timeout_s=210)

    summary = summarize(run_dir)
    assert summary.completed, summary
    by_class = {f.cls: f for f in summary.faults}
    assert set(by_class) == {"sigkill", "deadlock", "node_loss"}
    assert by_class["sigkill"].layer == "ft_launcher"
    assert by_class["deadlock"].layer == "ft_launcher"
    assert by_class["node_loss"].layer == "job_controller"
    for fault in summary.faults:
        assert fault.recovery_s is not None, fault
        # Durable checkpoint every 2 steps: at most that many steps trained again.
        assert fault.steps_lost is not None, fault
        assert fault.steps_lost <= 2, fault
    assert job.replaced == [1]  # rank 3 lives on node 1; the harness played the Job controller once
    assert _final_hash(run_dir) == fault_free_hash
