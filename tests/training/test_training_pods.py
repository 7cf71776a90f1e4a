"""Replacement pods and warm spares (issue 16 parts 5 and 3): the rendered local job, real processes.

Budgets that nest in practice, under fault storms:

The job is `k8s/values/local-cpu.yaml` (2 nodes x 2 CPU ranks, mode `both`: NVRx 0.4.1's min-healthy
policy) with small budgets, run by the local executor playing the Job controller, as in
test_training_faults.py. Every fault is a SIGKILL of rank 3 (node index 1: ranks follow the sorted node
addresses). With `launcher_max_restarts=2` the third SIGKILL exhausts the launchers; min-healthy counts
restarts by the global rendezvous round, so every launcher of the group leaves with ChildFailedError
and closes the rendezvous. The Job still has budget and replaces the pods; their launcher's hand-over
(`--evict-predecessor`, training/launch.py) reopens the rendezvous, so training goes on from the newest
checkpoint. Before that, each replacement died at once with RendezvousClosedError.

Warm spares: with `spares=1` a third pod runs the launcher, which waits in NVRx 0.4.1's redundancy list
(`--nnodes=2:2` admits two); a node loss gives its place to the spare at the next round, and the Job's
replacement pod becomes the next spare. The replacement waits for its new node (the executor's
`node_provision_s`), as on a cluster: with none, it can start and join the next round before the spare
does, and the test raced (one CI run in a few resumed on the replacement).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import LocalJobRunner

    from localrun.executor import JobResult

pytestmark = pytest.mark.slow

STEPS = 20
BUDGETS = [
    "budgets.inprocess_max_iterations=1",
    "budgets.launcher_max_restarts=2",
    "budgets.expected_node_losses=1",
]


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
    overrides = [
        f"trainer.steps={STEPS}",
        *local_job.sync_durable_every_2,
        *BUDGETS,
        *extra,
    ]
    if plan:
        overrides.append(f"trainer.faults.plan={plan}")
    return local_job.run(
        run_dir, overrides, timeout_s=timeout_s, node_provision_s=node_provision_s, must_succeed=False
    )


@pytest.fixture(scope="module")
def fault_free_hash(tmp_path_factory: pytest.TempPathFactory, local_job: LocalJobRunner) -> str:
    result, events = _run(local_job, tmp_path_factory.mktemp("reference"), plan="", timeout_s=240)
    assert result.succeeded, result.reason
    return local_job.final_hash(events)


@pytest.mark.timeout(600)
def test_storm_exhausting_the_launchers_is_survived_through_replacement_pods(
    tmp_path, local_job, fault_free_hash
):
    result, events = _run(local_job, tmp_path, plan=_sigkills(3, 6, 9), timeout_s=540)

    assert result.succeeded, f"{result.reason}; pod logs in {tmp_path}"
    # The launchers ran out after the third SIGKILL: the Job replaced the pods (a failure each, within
    # backoffLimitPerIndex), and the replacements rejoined the rendezvous the launchers had closed.
    failed = [p for p in result.pods if p.reason == "Failed"]
    assert {p.index for p in failed} == {0, 1}, [(p.pod, p.reason) for p in result.pods]
    replacements = [p for p in result.pods if p.index is not None and not p.pod.endswith("-a0")]
    assert replacements
    assert any("reopened rendezvous" in Path(p.log).read_text() for p in replacements)
    # Training went on in the replacements' run, to the end, with nothing lost.
    assert len(local_job.events(events, "fault_injected")) == 3
    assert local_job.final_hash(events) == fault_free_hash


@pytest.mark.timeout(600)
def test_storm_exhausting_the_job_fails_naming_the_faulty_index_and_its_cause(tmp_path, local_job):
    # Mode ft_launcher with no launcher restarts and one pod failure per index: the first SIGKILL of
    # rank 3 ends both launchers (the Job charges both indexes), the replacements rejoin the reopened
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
def test_node_loss_with_a_warm_spare_resumes_on_the_spare(tmp_path, local_job, fault_free_hash):
    # A new node in 90 s: on a cluster a p5 takes minutes; here the round without it forms in ~15 s.
    result, events = _run(
        local_job, tmp_path, plan="node_loss@8:3", timeout_s=540, extra=("spares=1",), node_provision_s=90
    )

    assert result.succeeded, f"{result.reason}; pod logs in {tmp_path}"
    (deletion,) = result.deletions
    lost = deletion["index"]
    # The spare: the pod that trained nothing before the loss. Training resumed on it, not on the
    # replacement pod of the lost index (which became the next spare and trained nothing).
    steps = local_job.events(events, "step")
    before = {int(e["node"]) for e in steps if e["t"] < deletion["time"]}
    after = {int(e["node"]) for e in steps if e["t"] > deletion["time"]}
    (spare,) = {0, 1, 2} - before
    assert lost in before
    assert after == (before - {lost}) | {spare}, (before, after)
    spare_pod = next(p for p in result.pods if p.index == spare)
    assert spare_pod.started < deletion["time"]
    # Training went on without waiting for the lost node's replacement (still Pending, or started after).
    resumed = min(e["t"] for e in steps if e["t"] > deletion["time"])
    assert deletion.get("replacement_started") is None or deletion["replacement_started"] > resumed
    assert local_job.final_hash(events) == fault_free_hash
