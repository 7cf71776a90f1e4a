"""The local executor runs a tiny rendered job (2 pods x 2 CPU ranks) to the end, also when nodes die.

Every test checks afterwards that no process of any of its pods is left (the executor's environment
marker, which NVRx's daemonized in-process monitors carry too) and that the pods' RAM folders are gone.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from nvrx_eks.k8s.job_chart import render
from nvrx_eks.k8s.load import load_values
from nvrx_eks.localrun.chaos import reference_trainer
from nvrx_eks.localrun.executor import (
    COMPLETION_INDEX_ANNOTATION,
    LocalJob,
    local_node_labels,
    marked_processes,
    pvc_folder,
)
from nvrx_eks.localrun.node_api import LocalApiServer
from nvrx_eks.training.checkpoint.domains import NodeDomain, domain, levels, node_domain
from nvrx_eks.training.events import read_events
from nvrx_eks.training.resilience.launch import COLLATERAL_EXIT_CODE

LOCAL = Path(__file__).resolve().parents[2] / "k8s" / "values" / "local-cpu.yaml"
# The demo's configuration (mode both: in-process layer, whose monitor processes leave the launcher's
# process tree, under ft_launcher) with fewer steps and a durable checkpoint every 4 steps.
OVERRIDES = [
    *reference_trainer(steps=40),
    "trainer.checkpoint.memory_every=2",
    "trainer.checkpoint.local_every=4",
    "trainer.checkpoint.durable_every=4",
]
# Delete a node once the job has made this many steps since it (re)started (or the previous deletion),
# so that every deletion hits a running job whatever the machine's speed.
STEPS_BEFORE_DELETION = 8


def _render(tmp_path: Path, *overrides: str) -> Path:
    out = tmp_path / "dist"
    render(load_values(LOCAL, [*OVERRIDES, *overrides]), str(out))
    return out


def _trainer_run_dir(job: LocalJob) -> Path:
    found = list((job.run_dir / "volumes").glob("pvc-*/runs/*"))
    return found[0] if found else job.run_dir / "missing"


def _events(job: LocalJob) -> list[dict[str, Any]]:
    run_dir = _trainer_run_dir(job)
    return read_events(run_dir) if run_dir.exists() else []


def _assert_pods_gone(job: LocalJob) -> None:
    left = marked_processes(job.run_key)
    assert not left, f"processes left behind: {[(p.pid, p.name()) for p in left]}"
    assert not job.shm_dir.exists(), f"pod RAM folders left behind: {job.shm_dir}"


class _DeleteOnProgress(threading.Thread):
    """Deletes node `indexes[k]` once the job has progressed (see STEPS_BEFORE_DELETION) since the
    previous deletion or the start."""

    def __init__(self, job: LocalJob, indexes: list[int]) -> None:
        super().__init__(daemon=True)
        self.job, self.pending = job, list(indexes)
        self.stop = threading.Event()
        self.outside_tree: list[int] = []
        """Per deletion: the pod's processes (by marker) outside its container's process tree."""

    def run(self) -> None:
        since = 0.0
        while self.pending and not self.stop.wait(0.2):
            steps = {e["step"] for e in _events(self.job) if e["kind"] == "step" and e["t"] > since}
            if len(steps) >= STEPS_BEFORE_DELETION:
                since = time.time()
                index = self.pending.pop(0)
                self.outside_tree.append(self._outside_tree(index))
                self.job.delete_node(index)

    def _outside_tree(self, index: int) -> int:
        pod = self.job.pods[index]
        marked = {p.pid for p in marked_processes(pod.marker)}
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pod.proc.pid)  # type: ignore[union-attr]
            marked -= {p.pid for p in [root, *root.children(recursive=True)]}
        return len(marked)


def recovery(
    events: list[dict[str, Any]], deletion: dict[str, Any], executor: list[dict[str, Any]]
) -> dict[str, Any]:
    """Deletion -> the first step made by a process started after it, with the replacement pod's phases
    (seconds after the deletion) and what every rank restored."""
    t = deletion["time"]
    fresh = {e["pid"] for e in events if e["kind"] == "process_start" and e["t"] > t}
    first = next(e for e in events if e["kind"] == "step" and e["pid"] in fresh)
    restored = {
        f"{e['node']}/{e['rank']}": (e["tier"], e["restored_step"])
        for e in events
        if e["kind"] == "startup_done" and e["pid"] in fresh and e["t"] < first["t"]
    }
    phases = {
        f"{e['container']}_start": round(e["t"] - t, 2)
        for e in executor
        if e["kind"] == "container_start" and e["pod"] == deletion["replacement"]
    }
    phases["workers_start"] = round(min(e["t"] for e in events if e["pid"] in fresh) - t, 2)
    phases["workers_ready"] = round(
        max(
            e["t"]
            for e in events
            if e["kind"] == "startup_done" and e["pid"] in fresh and e["t"] < first["t"]
        )
        - t,
        2,
    )
    return {
        "index": deletion["index"],
        "recovery_s": round(first["t"] - t, 2),
        "kill_s": round(deletion["killed_s"], 2),
        "phases": phases,
        "last_step_before": max(e["step"] for e in events if e["kind"] == "step" and e["t"] < t),
        "first_step_after": first["step"],
        "restored": restored,
    }


def run_with_deletions(tmp_path: Path, indexes: list[int], *overrides: str) -> dict[str, Any]:
    """Run the tiny job, delete `indexes` in turn mid-run; return the result and per-deletion figures."""
    dist = _render(tmp_path, *overrides)
    job = LocalJob(dist, run_dir=tmp_path / "run", timeout_s=230)
    deleter = _DeleteOnProgress(job, indexes)
    deleter.start()
    try:
        result = job.run()
    finally:
        deleter.stop.set()
        deleter.join(timeout=5)
    events = _events(job)
    executor = [json.loads(line) for line in (job.run_dir / "executor.jsonl").read_text().splitlines()]
    figures = [recovery(events, d, executor) for d in result.deletions if "replacement" in d]
    return {
        "job": job,
        "result": result,
        "events": events,
        "recoveries": figures,
        "outside_tree": deleter.outside_tree,
    }


@pytest.mark.slow
@pytest.mark.timeout(280)
def test_job_survives_node_loss_of_index_0_then_1(tmp_path):
    run = run_with_deletions(tmp_path, [0, 1])
    job, result, events = run["job"], run["result"], run["events"]
    try:
        assert result.succeeded, (result.reason, [(p.pod, p.reason, p.exit_code) for p in result.pods])
        assert [d["index"] for d in result.deletions] == [0, 1]
        assert all("replacement" in d for d in result.deletions)
        pods = [p for p in result.pods if p.index is not None]
        assert sum(p.reason == "NodeDeleted" for p in pods) == 2
        assert sum(p.reason == "Succeeded" for p in pods) == 2
        assert job.failures == {0: 0, 1: 0}, "a node loss (DisruptionTarget) must not consume the budget"
        # NVRx's in-process monitors had left the launcher's tree: only the pod marker found them.
        assert all(n > 0 for n in run["outside_tree"]), run["outside_tree"]
        assert max(e["step"] for e in events if e["kind"] == "step") == 39
        for figure in run["recoveries"]:
            print(f"node-loss recovery: {json.dumps(figure)}")
            # The replacement's ranks never see their predecessor's RAM (the emptyDir died with it) nor
            # its local disk (a new node): their shards come from the partner node's RAM (the peer
            # replica), else the durable tier if a commit made it in time.
            node = str(figure["index"])
            replaced = {k: v for k, v in figure["restored"].items() if k.split("/")[0] == node}
            assert len(replaced) == 2, figure
            assert {tier for tier, _ in replaced.values()} <= {"peer_memory", "durable", "none"}, figure
        # The manifest's self-check ran in every pod before the launcher.
        for pod in pods:
            log = Path(pod.log).read_text()
            assert log.index("=== container selfcheck") < log.index("=== container trainer"), pod.log
            assert "node can train" in log, pod.log
        # Each pod, the replacements too, read its own node's labels (a replacement runs on a new node).
        assert job.api is not None
        assert sorted(job.api.requests) == ["node-0-0", "node-0-1", "node-1-0", "node-1-1"]
    finally:
        _assert_pods_gone(job)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_init_exit_75_is_ignored_config_error_fails_job_and_chaos_dir_deletes(tmp_path):
    """podFailurePolicy with init containers: the self-check's 75 (node problem) replaces the pod without
    consuming its budget; exit code 2 fails the job at once; a file in the chaos dir
    ($NVRX_EKS_CHAOS_DIR) deletes a node."""
    dist = _render(tmp_path, *reference_trainer(steps=1))
    manifest = next(dist.glob("*.yaml"))
    docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    (job_doc,) = [d for d in docs if d["kind"] == "Job"]
    pod = job_doc["spec"]["template"]["spec"]
    # A node problem on each index's first pod only (a marker on the shared volume), as a bad node
    # would report it; the replacement's check passes.
    pod["initContainers"][0]["command"] = [
        "sh",
        "-c",
        "test -e /fsx/bad-node-$(NODE_RANK) || { touch /fsx/bad-node-$(NODE_RANK); exit 75; }",
    ]
    # A configuration error the launcher itself reports with exit code 2 (argparse). ft_launcher exits 1
    # when a worker fails, whatever the worker's code, so the FailJob rule sees launcher-level errors.
    command = pod["containers"][0]["command"]
    command[command.index("--max-restarts=10")] = "--max-restarts=ten"
    manifest.write_text(yaml.safe_dump_all(docs))
    chaos = tmp_path / "chaos"
    chaos.mkdir()
    (chaos / "delete-node-1").write_text('{"step": 0, "rank": 2, "time": 0}')
    # A request still being written (the trainer writes a temporary file, then renames it): not one yet.
    (chaos / "delete-node-0.tmp").write_text('{"step": 0')
    job = LocalJob(dist, run_dir=tmp_path / "run", chaos_dir=chaos, timeout_s=100)
    try:
        result = job.run()
        assert not result.succeeded
        assert "PodFailurePolicy" in result.reason
        assert "exit code 2" in result.reason
        assert list(chaos.glob("handled-delete-node-1-*"))
        assert (chaos / "delete-node-0.tmp").exists()
        init_failed = [p for p in result.pods if p.reason == "InitFailed"]
        assert 0 in {p.index for p in init_failed}  # index 1's first pod may be deleted before its check
        assert all((p.container, p.exit_code) == ("selfcheck", 75) for p in init_failed)
        assert job.failures == {0: 0, 1: 0}, "exit 75 and node deletion must not consume the budget"
    finally:
        _assert_pods_gone(job)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_checkpointer_that_cannot_start_fails_the_job_before_any_launcher(tmp_path):
    """The rendered self-check proves the reference trainer's tiers: a file where the durable tier's
    folder goes on the shared volume fails the Job from the first pod's self-check (exit 2), and the
    reason names the tier, its folder, the cause and the fix."""
    job = LocalJob(_render(tmp_path, *reference_trainer(steps=1)), run_dir=tmp_path / "run", timeout_s=100)
    pod = job.rendered.job["spec"]["template"]["spec"]
    (fsx,) = (v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v)
    shared = pvc_folder(job.run_dir, fsx)
    shared.mkdir(parents=True)
    (shared / "durable").write_text("a file where the durable tier's folder goes")
    try:
        result = job.run()
        assert not result.succeeded
        assert (
            "container selfcheck exit code 2 fails the job: self-check (configuration/image " in result.reason
        )
        assert f"checkpoint durable: {shared / 'durable' / 'nvrx-local'}: Not a directory" in result.reason
        assert "point checkpoint.durable_dir at another folder" in result.reason
        # No launcher started: the pods ended in their self-check.
        assert "trainer" not in {p.container for p in result.pods}
    finally:
        _assert_pods_gone(job)


@pytest.mark.timeout(120)
def test_a_collateral_stop_is_replaced_without_charging_its_index_and_a_fault_is_charged(tmp_path):
    """podFailurePolicy on the trainer container's exit code: the launcher's collateral exit (its ranks
    were only stopped after a peer failed) replaces the pod for free; any other failure costs budget."""
    dist = _render(tmp_path)
    manifest = next(dist.glob("*.yaml"))
    docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    (job_doc,) = [d for d in docs if d["kind"] == "Job"]
    pod = job_doc["spec"]["template"]["spec"]
    pod["initContainers"] = []
    # Each index's first pod exits collateral, its second fails on its own (1), its third succeeds.
    pod["containers"][0]["command"] = [
        "sh",
        "-c",
        (
            "n=$(ls /fsx/attempt-$(NODE_RANK)-* 2>/dev/null | wc -l); touch /fsx/attempt-$(NODE_RANK)-$n; "
            f'[ "$n" = 0 ] && exit {COLLATERAL_EXIT_CODE}; [ "$n" = 1 ] && exit 1; exit 0'
        ),
    ]
    manifest.write_text(yaml.safe_dump_all(docs))
    job = LocalJob(dist, run_dir=tmp_path / "run", timeout_s=100)
    try:
        result = job.run()
        assert result.succeeded, result.reason
        codes = {i: [p.exit_code for p in result.pods if p.index == i] for i in (0, 1)}
        assert codes == {0: [COLLATERAL_EXIT_CODE, 1, 0], 1: [COLLATERAL_EXIT_CODE, 1, 0]}
        assert job.failures == {0: 1, 1: 1}, "only the launcher's own failure is charged"
    finally:
        _assert_pods_gone(job)


def test_the_topology_init_container_reads_its_own_local_node_through_the_executors_api(tmp_path):
    """The rendered init container as the executor runs it: spec.nodeName, the projected token and CA,
    the API's address; then the trainer container's env finds the file it wrote."""
    job = LocalJob(_render(tmp_path), run_dir=tmp_path / "run")
    (job.run_dir / "volumes").mkdir(parents=True)
    job.api = LocalApiServer(job.run_dir / "api")  # what `start` makes for a pod that mounts a token
    job.api.start()
    pod_spec = job.rendered.job["spec"]["template"]["spec"]
    pod = job._make_pod(
        name="p-1", index=1, pod_spec=pod_spec, annotations={COMPLETION_INDEX_ANNOTATION: "1"}
    )
    try:
        containers = {c.name: c for c in pod._containers}
        topology, trainer = containers["topology"], containers["trainer"]
        assert topology.env["NODE_NAME"] == "node-1-0"
        done = subprocess.run(
            topology.argv, env=topology.env, capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
        assert job.api.requests == ["node-1-0"]
        assert node_domain(trainer.env) == NodeDomain(
            domain(local_node_labels(1, 2)), "node labels", node="node-1-0"
        )
        # The two local nodes hang from two layer-3 network nodes, and have no zone.
        zero, one = (levels(domain(local_node_labels(i, 2))) for i in (0, 1))
        assert zero[0] == one[0] == ""
        assert zero[:3] == one[:3]
        assert zero[3] != one[3]
        # Only the init container names the token's folder; the trainer's command and env do not.
        token_dir = next(a.split("=", 1)[1] for a in topology.argv if a.startswith("--token-dir="))
        assert Path(token_dir, "token").read_text() == job.api.token
        assert token_dir not in " ".join([*trainer.argv, *trainer.env.values()])
    finally:
        job.api.close()
        for folder in pod._ram_dirs:
            shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(job.shm_dir, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_four_local_nodes_choose_partners_under_another_network_node_from_their_labels(tmp_path):
    """End to end: four nodes of one rank, two by two under two layer-3 network nodes (by index); the
    trainer's events show the domains it gathered from the labels and partners across them."""
    dist = _render(
        tmp_path,
        "num_nodes=4",
        "instance_profile=local-cpu-1",
        *reference_trainer(steps=8),
        "mode=ft_launcher",
    )
    job = LocalJob(dist, run_dir=tmp_path / "run", timeout_s=200)
    try:
        result = job.run()
        assert result.succeeded, (result.reason, [(p.pod, p.reason, p.exit_code) for p in result.pods])
        assert job.api is not None
        assert sorted(job.api.requests) == [f"node-{i}-0" for i in range(4)]
        events = _events(job)
        sources = {e["rank"]: e["source"] for e in events if e["kind"] == "checkpoint_peer_domain"}
        assert sources == dict.fromkeys(range(4), "node labels")
        (partners,) = {json.dumps(e["domains"]) for e in events if e["kind"] == "checkpoint_peer_partners"}
        domains = json.loads(partners)
        assert sorted(domains) == sorted(domain(local_node_labels(i, 4)) for i in range(4))
        for e in (e for e in events if e["kind"] == "checkpoint_peer_partners"):
            (target,) = e["targets"]
            assert levels(domains[target])[3] != levels(domains[e["rank"]])[3], e
    finally:
        _assert_pods_gone(job)
