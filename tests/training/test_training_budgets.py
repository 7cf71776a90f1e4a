"""Restart budgets that nest in practice (issue 16 part 5): the rendered local job under fault storms.

The job is `k8s/values/local-cpu.yaml` (2 nodes x 2 CPU ranks, mode `both`: NVRx 0.4.1's min-healthy
policy) with small budgets, run by the local executor playing the Job controller, as in
test_training_faults.py. Every fault is a SIGKILL of rank 3 (node index 1: ranks follow the sorted node
addresses). With `launcher_max_restarts=2` the third SIGKILL exhausts the launchers; min-healthy counts
restarts by the global rendezvous round, so every launcher of the group leaves with ChildFailedError
and closes the rendezvous. The Job still has budget and replaces the pods; their init step
(`python -m training.rendezvous evict`) reopens the rendezvous, so training goes on from the newest
checkpoint. Before that, each replacement died at once with RendezvousClosedError.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from k8s.job_chart import render
from k8s.load import load_values
from localrun.chaos import trainer_run_dir
from localrun.executor import marked_processes, run_local

if TYPE_CHECKING:
    from localrun.executor import JobResult

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
LOCAL = "k8s/values/local-cpu.yaml"
STEPS = 20
BUDGETS = [
    "budgets.inprocess_max_iterations=1",
    "budgets.launcher_max_restarts=2",
    "budgets.expected_node_losses=1",
]


def _sigkills(*steps: int) -> str:
    return ",".join(f"sigkill@{s}:3" for s in steps)


def _run(
    run_dir: Path, *, plan: str, timeout_s: float, extra: tuple[str, ...] = ()
) -> tuple[JobResult, Path]:
    overrides = [
        f"trainer.steps={STEPS}",
        "trainer.log_every=10",
        "trainer.checkpoint.implementation=sync",
        "trainer.checkpoint.durable_every=2",
        "trainer.checkpoint.local_every=0",
        *BUDGETS,
        *extra,
    ]
    if plan:
        overrides.append(f"trainer.faults.plan={plan}")
    values = load_values(REPO / LOCAL, overrides)
    dist = run_dir / "dist"
    render(values, str(dist))
    result = run_local(dist, run_dir=run_dir, timeout_s=timeout_s)
    left = marked_processes(result.run_key)
    assert not left, f"processes left behind: {[(p.pid, p.name()) for p in left]}"
    return result, trainer_run_dir(values, run_dir)


def _events(events_dir: Path, kind: str) -> list[dict]:
    found = []
    for path in events_dir.rglob("*.jsonl"):
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event.get("kind") == kind:
                found.append(event)
    return found


def _final_hash(events_dir: Path) -> str:
    return json.loads((events_dir / "final.json").read_text())["final_params_sha256"]


@pytest.fixture(scope="module")
def fault_free_hash(tmp_path_factory: pytest.TempPathFactory) -> str:
    result, events = _run(tmp_path_factory.mktemp("reference"), plan="", timeout_s=240)
    assert result.succeeded, result.reason
    return _final_hash(events)


@pytest.mark.timeout(600)
def test_storm_exhausting_the_launchers_is_survived_through_replacement_pods(tmp_path, fault_free_hash):
    result, events = _run(tmp_path, plan=_sigkills(3, 6, 9, 13), timeout_s=540)

    assert result.succeeded, f"{result.reason}; pod logs in {tmp_path}"
    # The launchers ran out after the third SIGKILL: the Job replaced the pods (a failure each, within
    # backoffLimitPerIndex), and the replacements rejoined the rendezvous the launchers had closed.
    failed = [p for p in result.pods if p.reason == "Failed"]
    assert {p.index for p in failed} == {0, 1}, [(p.pod, p.reason) for p in result.pods]
    replacements = [p for p in result.pods if p.index is not None and not p.pod.endswith("-a0")]
    assert replacements
    assert any("reopened rendezvous" in Path(p.log).read_text() for p in replacements)
    # The fourth SIGKILL fired in the replacements' run: training went on there, to the end.
    assert len(_events(events, "fault_injected")) == 4
    assert _final_hash(events) == fault_free_hash


@pytest.mark.timeout(600)
def test_storm_exhausting_the_job_fails_naming_the_faulty_index_and_its_cause(tmp_path):
    # backoffLimitPerIndex 3: the launchers' exhaustion (3rd SIGKILL) costs each index one pod; after
    # it min-healthy's global round count leaves every new launcher without restarts, so each further
    # SIGKILL costs each index another, and the 6th is one more than the budget.
    result, _ = _run(
        tmp_path,
        plan=_sigkills(2, 4, 6, 8, 10, 12),
        timeout_s=540,
        extra=("budgets.job_backoff_limit_per_index=3",),
    )

    assert not result.succeeded
    assert result.reason.startswith("index 1 failed 4 time(s): BackoffLimitExceeded"), result.reason
    assert "cause: worker rank 3 exit code -9 (Signal 9 (SIGKILL))" in result.reason, result.reason
