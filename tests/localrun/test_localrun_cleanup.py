"""Nothing of a local job outlives it: processes, /dev/shm entries (semaphores included), temporary
folders, ports -- after a run with a SIGKILLed rank and a lost node, and after a SIGTERM to the
executor. Two jobs at once both complete, each on its own store port.

/dev/shm is shared by everything on the machine (other jobs, other test runs), so the faulty run
measures in a /dev/shm of its own where the machine allows it (a private mount namespace with a fresh
tmpfs: what is left there afterwards can only be the job's); elsewhere it compares the machine's
/dev/shm before and after, which is exact on a machine that runs nothing else.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import pytest

from nvrx_eks.k8s.job_chart import render
from nvrx_eks.k8s.load import load_values
from nvrx_eks.localrun.chaos import reference_trainer
from nvrx_eks.localrun.executor import LOCAL_SHM_ROOT, LocalJob, marked_processes, pod_tmp_prefix

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
LOCAL = REPO / "k8s" / "values" / "local-cpu.yaml"
FAULTS = "sigkill@3:1,node_loss@6:3"  # rank 1 kills itself, then rank 3's node (index 1) is lost

_JOB = """
import json, os, sys
from pathlib import Path
from nvrx_eks.localrun.executor import run_local
dist, run_dir = Path(sys.argv[1]), Path(sys.argv[2])
before = set(os.listdir("/dev/shm"))
result = run_local(dist, run_dir=run_dir, timeout_s=float(sys.argv[3]))
print(json.dumps({
    "succeeded": result.succeeded, "reason": result.reason, "run_key": result.run_key,
    "ports": getattr(result, "ports", {}), "new_shm": sorted(set(os.listdir("/dev/shm")) - before),
    "tmp_left": sorted(os.listdir(os.environ["TMPDIR"])),
}))
"""


def _private_shm() -> list[str]:
    """A command prefix that runs in a fresh /dev/shm, or [] where the machine does not allow it."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return []
    args = [unshare, "--mount"] if os.geteuid() == 0 else [unshare, "--mount", "--map-root-user"]
    probe = subprocess.run(
        [*args, "sh", "-c", "mount -t tmpfs tmpfs /dev/shm"], capture_output=True, timeout=10, check=False
    )
    return (
        [*args, "sh", "-c", 'mount -t tmpfs tmpfs /dev/shm && exec "$@"', "sh"]
        if not probe.returncode
        else []
    )


def _render(dist: Path, *overrides: str) -> None:
    render(load_values(LOCAL, [*reference_trainer(steps=12), *overrides]), str(dist))


def _pod_tmp_dirs(run_key: str) -> list[Path]:
    return list(Path(tempfile.gettempdir()).glob(f"{pod_tmp_prefix(run_key)}*"))


def _trainer_pods(executor_events: Path) -> set[str]:
    if not executor_events.exists():
        return set()
    events = [json.loads(line) for line in executor_events.read_text().splitlines() if line.endswith("}")]
    return {e["pod"] for e in events if e["kind"] == "container_start" and e["container"] == "trainer"}


def _children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children()
    except psutil.Error:  # gone meanwhile
        return []


def _listeners(port: int) -> list[int]:
    return [
        c.pid for c in psutil.net_connections(kind="tcp") if c.laddr.port == port and c.status == "LISTEN"
    ]


@pytest.fixture(scope="module")
def faulty_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The local job (default tiered checkpointer: NVRx writer processes) with a SIGKILL and a node loss."""
    root = tmp_path_factory.mktemp("cleanup")
    _render(root / "dist", *reference_trainer(steps=10), f"trainer.faults.plan={FAULTS}")
    prefix = _private_shm()
    # The machine's temp folder as the executor and its pods see it: theirs alone, and short (the pods
    # bind unix sockets below it; a worker's pytest folder can be too long for them).
    tmp = Path(tempfile.mkdtemp(prefix="nvrx-cleanup-"))
    try:
        proc = subprocess.Popen(
            [*prefix, sys.executable, "-c", _JOB, str(root / "dist"), str(root / "run"), "480"],
            cwd=REPO,
            env=os.environ | {"PYTHONPATH": str(REPO), "TMPDIR": str(tmp)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            stdout, stderr = proc.communicate(timeout=540)
        except subprocess.TimeoutExpired:
            proc.terminate()  # the executor's SIGTERM path: it stops its pods before it exits
            stdout, stderr = proc.communicate(timeout=60)
        out = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
        assert out.returncode == 0, out.stderr[-3000:]
        report = json.loads(out.stdout.strip().splitlines()[-1])
        assert report["succeeded"], f"{report['reason']}; pod logs in {root / 'run' / 'pods'}"
        yield report | {"private_shm": bool(prefix), "root": root}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.timeout(660)
def test_faulty_run_leaves_no_process_port_folder_or_shared_memory_file(faulty_run):
    left = marked_processes(faulty_run["run_key"])
    assert not left, f"processes left behind: {[(p.pid, p.name()) for p in left]}"
    for endpoint, port in faulty_run["ports"].items():
        assert not _listeners(port), f"{endpoint} (local port {port}) still served"
    # ft_launcher's IPC sockets and NVRx's watchdog files of the SIGKILLed and the deleted pods included.
    assert not faulty_run["tmp_left"], f"temporary files left behind: {faulty_run['tmp_left']}"
    assert not (LOCAL_SHM_ROOT / faulty_run["run_key"]).exists(), "pod RAM folders left behind"
    files = [n for n in faulty_run["new_shm"] if not n.startswith("sem.mp-")]
    assert not files, f"/dev/shm entries left behind: {files}"


@pytest.mark.timeout(660)
def test_faulty_run_leaves_no_semaphore(faulty_run):
    semaphores = [n for n in faulty_run["new_shm"] if n.startswith("sem.mp-")]
    assert not semaphores, f"{len(semaphores)} semaphores left in /dev/shm: {semaphores[:5]}"


@pytest.mark.timeout(200)
def test_sigterm_to_local_run_releases_everything(tmp_path):
    """`nvrx-eks local run` killed by SIGTERM (a cancelled CI job): its pods go with it."""
    _render(tmp_path / "dist", *reference_trainer(steps=400), "trainer.checkpoint.implementation=sync")
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from nvrx_eks.cli import main; main()",
            "local",
            "run",
            str(tmp_path / "dist"),
            "--run-dir",
            str(run_dir),
            "--timeout",
            "150",
        ],
        cwd=REPO,
        env=os.environ | {"PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    job = LocalJob(tmp_path / "dist", run_dir=run_dir)  # only for its run key: the same run folder
    try:
        # SIGTERM once ranks run: processes the trainer containers' launchers started (their forkserver
        # and workers), which carry their pod's marker whichever runtime started the launcher.
        deadline = time.monotonic() + 120
        ranks: list[psutil.Process] = []
        while time.monotonic() < deadline and proc.poll() is None and not ranks:
            trainers = _trainer_pods(run_dir / "executor.jsonl")
            launchers = [p for pod in trainers for p in marked_processes(f"{job.run_key}/{pod}")]
            ranks = [child for launcher in launchers for child in _children(launcher)]
            time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert ranks, "no pod process was running"
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, output[-3000:]
    left = marked_processes(job.run_key)
    assert not left, f"processes left behind: {[(p.pid, p.name()) for p in left]}"
    store_lines = [line for line in output.splitlines() if line.startswith("rendezvous store ")]
    assert store_lines, output[-3000:]
    port = int(store_lines[0].rsplit(":", 1)[1])
    assert not _listeners(port), f"store port {port} still served"
    assert not _pod_tmp_dirs(job.run_key), "pod temporary folders left behind"
    assert not job.shm_dir.exists(), "pod RAM folders left behind"


@pytest.mark.timeout(300)
def test_two_local_jobs_at_once_both_complete(tmp_path):
    results: dict[str, Any] = {}

    for name in ("a", "b"):  # before the threads: jsii (under cdk8s) is not thread-safe
        _render(
            tmp_path / name / "dist", *reference_trainer(steps=6), "trainer.checkpoint.implementation=sync"
        )

    def run(name: str) -> None:
        job = LocalJob(tmp_path / name / "dist", run_dir=tmp_path / name / "run", timeout_s=240)
        results[name] = job.run()

    threads = [threading.Thread(target=run, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=280)
    assert set(results) == {"a", "b"}, results
    for name, result in results.items():
        assert result.succeeded, f"{name}: {result.reason}; pod logs in {tmp_path / name / 'run' / 'pods'}"
        assert not marked_processes(result.run_key)
    ports = [set(result.ports.values()) for result in results.values()]
    assert all(ports), ports
    assert not ports[0] & ports[1], ports
