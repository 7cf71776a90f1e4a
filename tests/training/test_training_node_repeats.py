"""A node problem that repeats on another node is the configuration's (training/node/repeats.py): the
job fails with the reason instead of replacing pods for ever."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from torch.distributed import TCPStore

from nvrx_eks.k8s.job_chart import render
from nvrx_eks.k8s.load import load_values
from nvrx_eks.localrun.chaos import reference_trainer
from nvrx_eks.localrun.executor import LocalJob
from nvrx_eks.training.node import repeats
from nvrx_eks.training.node.selfcheck import Check, Status, compare_with_other_nodes, exit_code

LOCAL = Path(__file__).resolve().parents[2] / "k8s" / "values" / "local-cpu.yaml"


@pytest.fixture
def store() -> TCPStore:
    """A store like the job's rendezvous store, on a free loopback port."""
    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))


def _client(store: TCPStore):
    return lambda _endpoint: repeats.connect(f"127.0.0.1:{store.port}", timeout_s=10)


GPUS = Check("GPUs", Status.NODE, "7 of 8 GPUs usable")
DISK = Check("checkpoint local", Status.NODE, "/local/checkpoints: Read-only file system")


def _on(store: TCPStore, node: str, *checks: Check) -> list[Check]:
    return compare_with_other_nodes(
        [Check("mode", Status.OK, "GPU"), *checks],
        store_endpoint="the-job-rdzv:29400",
        node_name=node,
        connect=_client(store),
    )


def test_the_same_node_problem_on_a_second_node_is_a_configuration_problem(store):
    first = _on(store, "ip-10-0-0-1", GPUS)
    assert exit_code(first) == 75  # one node: its own problem, the pod is replaced for free
    again = _on(store, "ip-10-0-0-1", GPUS)
    assert exit_code(again) == 75  # the same node again: still one node
    second = _on(store, "ip-10-0-0-2", GPUS, DISK)
    assert exit_code(second) == 2
    (gpus,) = [c for c in second if c.name == "GPUs"]
    assert gpus.status is Status.CONFIG
    assert "the same on node ip-10-0-0-1 (this one: ip-10-0-0-2)" in gpus.detail
    assert "configuration's" in gpus.detail
    # A check only this node failed stays this node's.
    assert [c.status for c in second if c.name == "checkpoint local"] == [Status.NODE]


def test_a_pass_between_two_nodes_failures_keeps_them_node_problems(store):
    assert exit_code(_on(store, "ip-10-0-0-1", GPUS)) == 75
    assert exit_code(_on(store, "ip-10-0-0-3")) == 0  # a node passes: the configuration can work
    assert exit_code(_on(store, "ip-10-0-0-2", GPUS)) == 75


def test_without_the_store_the_checks_stand_and_say_so():
    def unreachable(endpoint: str) -> repeats.Store:
        raise RuntimeError(f"connect() to {endpoint} timed out")

    checks = compare_with_other_nodes(
        [GPUS], store_endpoint="the-job-rdzv:29400", node_name="ip-10-0-0-1", connect=unreachable
    )
    assert exit_code(checks) == 75
    assert checks[-1].name == "other nodes"
    assert checks[-1].status is Status.WARN
    assert "the-job-rdzv:29400 was not reached" in checks[-1].detail


def test_a_store_that_does_not_answer_is_one_oserror(capfd):
    """Not TCPStore's retries, each with a C++ stack trace in the pod's log (its tail is the pod's
    termination message, where the self-check's verdict must be found)."""
    import socket  # noqa: PLC0415

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, never listening: refused
        with pytest.raises(OSError, match=rf"127\.0\.0\.1:{port}: "):
            repeats.connect(f"127.0.0.1:{port}", timeout_s=1)
    assert "frame #" not in capfd.readouterr().err


@pytest.mark.slow  # a local job: the store and two pods' self-checks
@pytest.mark.timeout(180)
def test_a_node_problem_on_every_node_ends_the_job_with_the_reason_within_its_budget(tmp_path):
    """Every node's local NVMe unusable (a file where the tier's folder goes: the same on every node of
    the group, as a configuration fault would leave it): each self-check finds a node problem, the
    Job's failure policy replaces the pod for free, and without the comparison it would go on so. The
    second node's self-check finds the first's report and fails the job, naming the check and both
    nodes, with no index charged."""
    dist = tmp_path / "dist"
    render(load_values(LOCAL, list(reference_trainer(steps=4))), str(dist))
    job = LocalJob(dist, run_dir=tmp_path / "run", timeout_s=150)
    pod = job.rendered.job["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if "hostPath" in v]
    folder = volume["hostPath"]["path"].strip("/").replace("/", "_")
    for index in range(job.completions):
        node = job.run_dir / "volumes" / f"node-{index}-0" / folder
        node.mkdir(parents=True)
        (node / "checkpoints").write_text("not a folder")
    try:
        result = job.run()
    finally:
        for p in job.pods.values():
            assert p.done.is_set()
    assert not result.succeeded
    assert "PodFailurePolicy" in result.reason
    assert "container selfcheck exit code 2" in result.reason
    assert "checkpoint local" in result.reason
    assert "the same on node node-" in result.reason
    assert job.failures == dict.fromkeys(range(job.completions), 0)
    assert "trainer" not in {p.container for p in result.pods}
    # What the Job's pods ran: the self-check reached the store through the rendered endpoint.
    (selfcheck,) = [c for c in pod["initContainers"] if c["name"] == "selfcheck"]
    assert any(arg.startswith("--store=") for arg in selfcheck["command"])
    assert yaml.safe_dump(selfcheck["env"]).count("spec.nodeName") == 1
