"""Replacement pods and hot spares: the rendered local job, real processes.

Budgets that nest in practice, under fault storms:

The job is `k8s/values/local-cpu.yaml` (2 nodes x 2 CPU ranks, mode `both`) with small budgets, run by
the local executor playing the Job controller, as in test_training_faults.py. Every fault is a SIGKILL
of rank 3 (node index 1: ranks follow the sorted node addresses). NVRx counts launcher restarts by the
rendezvous round, job-wide: with `launcher_max_restarts=2` the third SIGKILL exhausts the launchers,
which close the rendezvous for good and leave. NVRx's control process (the store Deployment) then exits
and is restarted with an empty store; the Job still has budget and replaces the pods, which start a
fresh rendezvous and go on from the newest checkpoint.

Hot spares: with `spares=1` a third pod runs the launcher, whose agent waits in NVRx's rendezvous
(`--nnodes=2:3`). A node loss leaves a place the lost node never takes again: the next round waits
`rdzv_last_call_s` for it, then the spare takes it (a replacement that starts within that wait
carries the lost pod's index and may take the place back); the lost node's replacement becomes the
next spare. A restart round (a SIGKILL) takes no spare: the previous active nodes, known to NVRx by their
pod index (GROUP_RANK), all rejoin within the last call.

Store loss: the store pod's process (NVRx's control process, which hosts the TCPStore every launcher
talks to and closes each rendezvous round) is SIGKILLed mid-run and restarted empty, as a crash or an
OOM kill of that pod would. Whatever the launchers then do, the Job must not complete before training
did: either training reaches its last step or the Job fails with a reason.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from nvrx_eks.localrun.chaos import reference_trainer
from nvrx_eks.localrun.summary import summarize

if TYPE_CHECKING:
    from conftest import LocalJobRunner

    from nvrx_eks.localrun.executor import JobResult

pytestmark = pytest.mark.slow

STEPS = 20
BUDGETS = [
    "budgets.inprocess_max_iterations=1",
    "budgets.launcher_max_restarts=2",
    "budgets.expected_node_losses=1",
]


def _no_pod_succeeded_before_training_ended(result: JobResult, steps: list[dict]) -> None:
    """A launcher exits 0 only once training is done: a pod that succeeded earlier (a spare whose agent
    left the rendezvous) would count its index complete, and enough of them would complete the Job."""
    last_step = max(e["t"] for e in steps)
    early = [p.pod for p in result.pods if p.reason == "Succeeded" and (p.ended or 0) < last_step]
    assert not early, f"pods exited 0 before the last step: {early}"


def _sigkills(*steps: int) -> str:
    return ",".join(f"sigkill@{s}:3" for s in steps)


def _run(
    local_job: LocalJobRunner,
    run_dir: Path,
    *,
    plan: str,
    timeout_s: float,
    extra: tuple[str, ...] = (),
    node_provision_s: float = 0.0,
) -> tuple[JobResult, Path]:
    overrides = [*_overrides(local_job, extra), *([f"trainer.faults.plan={plan}"] if plan else [])]
    return local_job.run(
        run_dir, overrides, timeout_s=timeout_s, node_provision_s=node_provision_s, must_succeed=False
    )


def _overrides(local_job: LocalJobRunner, extra: tuple[str, ...] = ()) -> list[str]:
    return [*reference_trainer(steps=STEPS), *local_job.sync_durable_every_2, *BUDGETS, *extra]


def _kill_store_at(run_dir: Path, *, step: int, stop: threading.Event) -> None:
    """Ask the executor (chaos dir) to kill the store pod once rank 0 logged `step`."""
    while not stop.wait(0.2):
        for path in run_dir.glob("volumes/pvc-*/runs/*/events/rank-0.jsonl"):
            events = map(json.loads, path.read_text().splitlines()[:-1])  # the last may be half written
            if any(e.get("kind") == "step" and e["step"] >= step for e in events):
                (run_dir / "chaos").mkdir(exist_ok=True)
                (run_dir / "chaos" / "delete-store").touch()
                return


@pytest.fixture(scope="module")
def fault_free_hash(tmp_path_factory: pytest.TempPathFactory, local_job: LocalJobRunner) -> str:
    # The budgets bound restarts, which a fault-free run has none of: without them the reference is the
    # same job as test_training_faults.py's (same steps and checkpointing), run once for both.
    overrides = [*reference_trainer(steps=STEPS), *local_job.sync_durable_every_2]
    return local_job.fault_free_hash(tmp_path_factory.mktemp("reference"), overrides, timeout_s=240)


@pytest.mark.timeout(600)
def test_storm_exhausting_the_launchers_is_survived_through_replacement_pods(
    tmp_path, local_job, fault_free_hash
):
    result, events = _run(local_job, tmp_path, plan=_sigkills(3, 6, 9), timeout_s=540)

    assert result.succeeded, f"{result.reason}; pod logs in {tmp_path}"
    # The launchers ran out after the third SIGKILL: the Job replaced the pods (a failure each, within
    # backoffLimitPerIndex), the store's control process was restarted after the closure, and the
    # replacements formed a fresh rendezvous there.
    failed = [p for p in result.pods if p.reason == "Failed" and p.index is not None]
    assert {p.index for p in failed} == {0, 1}, [(p.pod, p.reason) for p in result.pods]
    replacements = [p for p in result.pods if p.index is not None and not p.pod.endswith("-a0")]
    assert replacements
    assert [p for p in result.pods if p.index is None and "-r" in p.pod], "the store was not restarted"
    # Training went on in the replacements' run, to the end, with nothing lost.
    assert len(local_job.events(events, "fault_injected")) == 3
    assert local_job.final_hash(events) == fault_free_hash


@pytest.mark.timeout(600)
def test_storm_exhausting_the_job_fails_naming_the_faulty_index_and_its_cause(tmp_path, local_job):
    # Mode ft_launcher with no launcher restarts and one pod failure per index: the first SIGKILL of
    # rank 3 ends both launchers (the Job charges both indexes), the replacements form a fresh
    # rendezvous and train on, and the second SIGKILL is one failure more than the budget.
    result, _ = _run(
        local_job,
        tmp_path,
        plan=_sigkills(3, 6),
        timeout_s=540,
        extra=(
            "mode=ft_launcher",
            "budgets.launcher_max_restarts=0",
            "budgets.expected_node_losses=0",
            "budgets.job_backoff_limit_per_index=1",
        ),
    )

    assert not result.succeeded
    assert result.reason.startswith("index 1 failed 2 time(s): BackoffLimitExceeded"), result.reason
    assert "cause: worker rank 3 exit code -9 (Signal 9 (SIGKILL))" in result.reason, result.reason


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "node_provision_s",
    [
        pytest.param(0, id="the-replacement-at-once"),
        # A new node in 90 s (on a cluster a p5 takes minutes): the spare does not wait for it.
        pytest.param(90, id="the-replacement-pending"),
    ],
)
def test_node_loss_with_a_warm_spare_resumes_on_the_spare(
    tmp_path, local_job, fault_free_hash, node_provision_s
):
    result, events = _run(
        local_job,
        tmp_path,
        plan="node_loss@8:3",
        timeout_s=540,
        extra=("spares=1",),
        node_provision_s=node_provision_s,
    )

    assert result.succeeded, f"{result.reason}; pod logs in {tmp_path}"
    (deletion,) = result.deletions
    lost = deletion["index"]
    # The spare: the pod that trained nothing before the loss. Training resumed on it, not on the
    # replacement pod of the lost index (which became the next spare and trained nothing). Before and
    # after by process, not by the clock: the lost node's ranks log a step or so after the deletion
    # (the kill takes milliseconds to land), once in 16 loaded runs here.
    steps = local_job.events(events, "step")
    started_after = {e["pid"] for e in local_job.events(events, "process_start") if e["t"] > deletion["time"]}
    before = {int(e["node"]) for e in steps if e["pid"] not in started_after}
    after = {int(e["node"]) for e in steps if e["pid"] in started_after}
    (spare,) = {0, 1, 2} - before
    assert lost in before
    if node_provision_s:
        assert after == (before - {lost}) | {spare}, (before, after)
    else:
        # A replacement that starts within the last call carries the lost pod's index, which NVRx knows
        # as a previous active node: it may take the place back before the spare does. Either way the
        # lost node's place is filled and the survivor keeps its own.
        assert after in ({*before}, (before - {lost}) | {spare}), (before, after)
    spare_pod = next(p for p in result.pods if p.index == spare)
    assert spare_pod.started < deletion["time"]
    _no_pod_succeeded_before_training_ended(result, steps)
    if node_provision_s:
        # Training went on without waiting for the lost node's replacement (Pending, or started after).
        resumed = min(e["t"] for e in steps if e["pid"] in started_after)
        assert deletion.get("replacement_started") is None or deletion["replacement_started"] > resumed
        # And without waiting the round's last call for the lost node: its launcher stopped beating.
        store_log = Path(next(p.log for p in result.pods if p.index is None)).read_text(errors="replace")
        assert f"not waiting for infra rank {lost}" in store_log, store_log[-2000:]
    assert local_job.final_hash(events) == fault_free_hash


@pytest.mark.timeout(600)
def test_a_lost_node_restarts_the_job_once_its_launcher_is_silent_not_after_the_in_process_heartbeat(
    tmp_path, local_job, fault_free_hash
):
    # Nothing is left on a lost node to report its loss. Before, the survivors restarted only once their
    # in-process restart had waited the lost ranks' heartbeat timeout (20 s here, 6 s by default, 3 s in
    # the local values): only a launcher whose own workers failed opened the next round. Now the
    # survivor that watches the lost node opens it as soon as that node's launcher beat is stale.
    heartbeat_timeout_s = 20
    result, events = _run(
        local_job,
        tmp_path,
        plan="node_loss@8:3",
        timeout_s=540,
        extra=("spares=1", f"trainer.inprocess.heartbeat_timeout_s={heartbeat_timeout_s}"),
        node_provision_s=90,
    )

    assert result.succeeded, f"{result.reason}; pod logs in {tmp_path}"
    (deletion,) = result.deletions
    logs = "".join(Path(p.log).read_text(errors="replace") for p in result.pods if p.index is not None)
    assert f"node with infra rank {deletion['index']} lost" in logs, logs[-3000:]
    (fault,) = summarize(events).faults
    assert fault.recovery_s is not None, fault
    assert fault.recovery_s < heartbeat_timeout_s / 2, fault
    _no_pod_succeeded_before_training_ended(result, local_job.events(events, "step"))
    assert local_job.final_hash(events) == fault_free_hash


@pytest.mark.timeout(600)
def test_losing_the_node_of_rank_0_with_the_replacement_pending_never_waits_for_the_heartbeat_timeout(
    tmp_path, local_job, fault_free_hash
):
    # Rank 0 hosts the in-process layer's store. With the p5 values' kind of heartbeat timeout (30 s
    # here, 120 s there) and the lost node's replacement pending, nothing but the survivors themselves
    # can start the next round: before, they waited for that timeout (the monitor thread that would
    # restart them died with the store). Now each ends its process once its store is gone.
    result, events = _run(
        local_job,
        tmp_path,
        plan="node_loss@8:0",
        timeout_s=540,
        extra=(
            "spares=1",
            "timeouts.launcher_heartbeat_s=30",
            "trainer.ft.heartbeat_timeout_floor_s=30",
            "trainer.inprocess.hard_timeout_s=40",
            "trainer.inprocess.barrier_timeout_s=60",
        ),
        node_provision_s=90,
    )

    assert result.succeeded, f"{result.reason}; pod logs in {tmp_path}"
    left = [e for e in local_job.events(events, "terminated") if e["layer"] == "inprocess"]
    assert left, "no survivor ended itself for its lost in-process store"
    assert all("in-process store lost" in e["cause"] for e in left), left
    logs = "".join(Path(p.log).read_text(errors="replace") for p in result.pods)
    assert "Did not get subsequent heartbeat" not in logs
    _no_pod_succeeded_before_training_ended(result, local_job.events(events, "step"))
    assert local_job.final_hash(events) == fault_free_hash


@pytest.mark.timeout(600)
def test_a_sigkill_restart_round_leaves_the_warm_spare_standing_by(tmp_path, local_job, fault_free_hash):
    result, events = _run(local_job, tmp_path, plan=_sigkills(6), timeout_s=540, extra=("spares=1",))

    assert result.succeeded, f"{result.reason}; pod logs in {tmp_path}"
    assert len(local_job.events(events, "fault_injected")) == 1
    # The first round takes the first two pods to join: the spare is the one that trained nothing
    # before the SIGKILL. The restart round re-formed with the same two nodes: the spare stayed out.
    (fault,) = local_job.events(events, "fault_injected")
    steps = local_job.events(events, "step")
    started_after = {e["pid"] for e in local_job.events(events, "process_start") if e["t"] > fault["t"]}
    before = {int(e["node"]) for e in steps if e["pid"] not in started_after}
    after = {int(e["node"]) for e in steps if e["pid"] in started_after}
    assert len(before) == 2, before
    assert after == before, (before, after)
    _no_pod_succeeded_before_training_ended(result, steps)
    restored = local_job.events(events, "checkpoint_restored")
    assert restored, "the SIGKILL restarted no worker"
    assert {int(e["node"]) for e in restored} == before
    assert local_job.final_hash(events) == fault_free_hash


@pytest.mark.timeout(600)
@pytest.mark.parametrize("spares", [0, 1], ids=["no-spare", "a-warm-spare"])
def test_losing_the_rendezvous_store_mid_run_never_completes_the_job_early(tmp_path, local_job, spares):
    stop = threading.Event()
    killer = threading.Thread(target=_kill_store_at, args=(tmp_path,), kwargs={"step": 8, "stop": stop})
    killer.start()
    try:
        result, events = _run(local_job, tmp_path, plan="", timeout_s=540, extra=(f"spares={spares}",))
    finally:
        stop.set()
        killer.join()

    executor = [json.loads(line) for line in (tmp_path / "executor.jsonl").read_text().splitlines()]
    (kill,) = [e for e in executor if e["kind"] == "delete_store"]
    steps = local_job.events(events, "step")
    assert any(e["t"] < kill["t"] for e in steps), "the store was killed before training started"
    _no_pod_succeeded_before_training_ended(result, steps)
    if result.succeeded:
        # Completed means trained to the end: the last step and the final parameters exist.
        assert max(e["step"] for e in steps) == STEPS - 1, result.reason
        assert local_job.final_hash(events)
    else:
        assert result.reason, "a failed job names why"
        assert result.reason != "DeadlineExceeded", result.reason
