"""The trainer under injected faults: the rendered local job (2 nodes x 2 CPU ranks) run by the executor.

The job is the one `nvrx-eks job render` writes for k8s/values/local-cpu.yaml, run by the local
executor exactly as `nvrx-eks local run` runs it (the manifests' own command lines; the executor plays
the Job controller, so a node-loss request replaces the pod). Mode `both`: in-process restart inside
ft_launcher. Two faulty runs -- the soft classes (recovered in process) and the hard classes (process
death, deadlock below Python, node loss) -- are each compared with one fault-free run of the same values,
computed once per module: the final parameters must be bit-identical. The synchronous reference
checkpointer writes the durable tier every 2 steps, so the hard faults lose at most 2 steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from nvrx_eks.localrun.chaos import reference_trainer
from nvrx_eks.localrun.summary import summarize

if TYPE_CHECKING:
    from pathlib import Path

    from conftest import LocalJobRunner

    from nvrx_eks.localrun.executor import JobResult
    from nvrx_eks.localrun.summary import FaultSummary

pytestmark = pytest.mark.slow

STEPS = 20
SOFT_PLAN = "exception@3:1,hang@6:0,skip_collective@9:3,oom@12:2"
HARD_PLAN = "sigkill@4:1,deadlock@9:2,node_loss@14:3"


def _run(local_job: LocalJobRunner, run_dir: Path, *, plan: str, timeout_s: float) -> tuple[JobResult, Path]:
    overrides = [*_overrides(local_job), *([f"trainer.faults.plan={plan}"] if plan else [])]
    return local_job.run(run_dir, overrides, timeout_s=timeout_s)


def _overrides(local_job: LocalJobRunner) -> list[str]:
    return [*reference_trainer(steps=STEPS), *local_job.sync_durable_every_2]


@pytest.fixture(scope="module")
def fault_free_hash(tmp_path_factory: pytest.TempPathFactory, local_job: LocalJobRunner) -> str:
    return local_job.fault_free_hash(
        tmp_path_factory.mktemp("reference"), _overrides(local_job), timeout_s=120
    )


@pytest.mark.timeout(200)
def test_soft_faults_recover_in_process_losing_at_most_one_step(tmp_path, local_job, fault_free_hash):
    _, events = _run(local_job, tmp_path, plan=SOFT_PLAN, timeout_s=150)

    summary = summarize(events)
    assert summary.completed, summary
    assert sorted(f.cls for f in summary.faults) == ["exception", "hang", "oom", "skip_collective"]
    for fault in summary.faults:
        assert fault.layer == fault.expected_layer == "inprocess", fault
        assert fault.steps_lost is not None, fault
        assert fault.steps_lost <= 1, fault
    assert local_job.final_hash(events) == fault_free_hash


@pytest.mark.timeout(260)
def test_hard_faults_recover_through_launcher_and_job_controller(tmp_path, local_job, fault_free_hash):
    result, events = _run(local_job, tmp_path, plan=HARD_PLAN, timeout_s=210)

    summary = summarize(events)
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
    # Rank 3 lives on node 1: the executor, as the Job controller, replaced that pod once.
    assert [d["index"] for d in result.deletions] == [1]
    assert local_job.final_hash(events) == fault_free_hash
    # Every worker, the restarted ones included, was a fork of its pod's warm forkserver
    # (training/resilience/launch.py): ready on a fraction of the CPU seconds a fresh interpreter spends
    # importing torch and torch._dynamo (~3 s here). CPU time, unlike wall time, does not grow with load.
    ready = local_job.events(events, "process_ready")
    assert any(e["restart"] >= 1 for e in ready), ready
    assert all(e["cpu_s"] < 1.0 for e in ready), [(e["rank"], e["restart"], e["cpu_s"]) for e in ready]
    # And imported nothing itself before its first step: every such import is paid again by every rank
    # at every restart (NVRx's launcher module, torch's worker wrapper, the checkpointer: 0.5-0.8 s).
    started = [e for e in local_job.events(events, "startup_done") if e["attempt"] == 0]
    assert len(started) > len(ready) // 2, started
    assert all(e["imported_since_fork"] == [] for e in started), [
        (e["rank"], e["restart"], e["imported_since_fork"]) for e in started if e["imported_since_fork"]
    ]


@pytest.mark.timeout(200)
def test_a_hang_with_long_steps_stays_in_process_though_its_recovery_outlasts_the_heartbeat_timeout(
    tmp_path, local_job
):
    # Steps of 2 s (an emulated device wait) and a 5 s launcher heartbeat timeout: the hang is decided
    # at the soft timeout (3.5 s) or at the peers' collective timeout (2 s after their 2 s step), and
    # the restarted step takes 2 s more, so the ranks send no step heartbeat for ~6 s. The in-process
    # layer beats for them from the moment the restart is decided until their next step, so the
    # launcher kills no rank: the hang is the in-process layer's, no step is lost, no process restarted.
    # Without those beats the launcher killed every worker in the middle of the in-process recovery
    # and started them again (8 processes).
    _, events = local_job.run(
        tmp_path,
        [
            # The hang at step 3, its restarted step and two more: a launcher's kill in the silence
            # would come seconds before the job could end.
            *reference_trainer(steps=6, emulated_device_step_s=2),
            *local_job.sync_durable_every_2,
            "trainer.inprocess.soft_timeout_s=3.5",
            "trainer.ft.heartbeat_timeout_floor_s=5",
            "timeouts.launcher_heartbeat_s=5",
            "trainer.faults.plan=hang@3:1",
        ],
        timeout_s=150,
    )

    _the_one_fault_stayed_in_process(local_job, events)


_SLOW_RESTORE = """
import time

import torch

from nvrx_eks.training import api as kit


def train(attempt):
    model = torch.nn.Linear(4, 4)
    wrapped = attempt.data_parallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if attempt.number > 0:
        # A restart's set-up that outlasts the launcher's heartbeat timeout (a large model built again,
        # a compile): Python runs throughout, so it is not a hang.
        for _ in range(50):
            time.sleep(0.1)
    attempt.resume(model=model, optimizer=optimizer)
    for step in attempt.steps(12):
        wrapped(torch.ones(2, 4)).sum().backward()
        with attempt.update():
            optimizer.step()


kit.Job().run(train)
"""


@pytest.mark.timeout(200)
def test_an_in_process_recovery_longer_than_the_launchers_heartbeat_timeout_is_not_killed(
    tmp_path, local_job
):
    # Rank 1 raises at step 6, and every rank's next attempt takes 5 s to set up before its first step:
    # longer than the launcher's heartbeat timeout (3.5 s), as a restart on a loaded machine, or one that
    # waits for a rank blocked in a gloo collective, can be. The in-process layer beats for every rank
    # from the moment the restart is decided until its next step, so the launcher kills no rank.
    # Beating only as the restart was decided and as the next attempt started, the launcher killed the
    # ranks in the middle of their in-process recovery: ft_launcher's restart.
    script = tmp_path / "slow_restore.py"
    script.write_text(_SLOW_RESTORE)
    overrides = ["entrypoint.module=null", f"entrypoint.script={script}", "entrypoint.args=[]"]
    _, events = local_job.run(
        tmp_path / "run",
        [*overrides, "entrypoint.preload=[]", "trainer.faults.plan=exception@6:1"],
        timeout_s=150,
    )

    exception = _the_one_fault_stayed_in_process(local_job, events)
    assert exception.recovery_s > 5, exception  # the premise: the recovery outlasted the timeout


def _the_one_fault_stayed_in_process(local_job: LocalJobRunner, events: Path) -> FaultSummary:
    """The run's one fault, checked recovered in process: the job completed, no step lost, and the four
    ranks' processes the only ones (the launcher restarted none)."""
    summary = summarize(events)
    assert summary.completed, summary
    (fault,) = summary.faults
    assert fault.layer == fault.expected_layer == "inprocess", fault
    assert fault.steps_lost == 0, fault
    starts = local_job.events(events, "process_start")
    assert len({e["pid"] for e in starts}) == 4, [(e["rank"], e["pid"]) for e in starts]
    return fault
