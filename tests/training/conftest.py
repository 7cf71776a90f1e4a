"""A local job for the trainer tests: a rendezvous store process and ft_launcher agents ("nodes").

Plays the parts the local executor (k8s/executor.py) and the Job controller play in the demo, with the
same contracts:
- each node is an agent in its own session, joining with its own loopback address (`--local-addr
  127.0.0.<2+i>`, the executor's mapping of the pod's stable DNS name);
- a node-loss request (COMMON.md contract 7: `$NVRX_EKS_CHAOS_DIR/delete-node-<i>`) kills the node's
  whole "pod": the agent's process tree and every process that carries the pod's environment (the
  in-process wrapper's monitor processes daemonize out of the tree, but die with a real pod), then the
  replacement runs the job chart's init step (`python -m training.rendezvous evict`) and a new agent;
- processes are found and killed with the executor's own pod marker (`k8s.executor.POD_ENV`,
  `kill_pod_processes`), so `close()` leaves no process of the job behind.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from k8s.executor import CHAOS_ENV, POD_ENV, kill_pod_processes, marked_processes

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LocalJob:
    run_dir: Path
    trainer_args: list[str]
    num_nodes: int = 2
    procs_per_node: int = 2
    launcher: str = "ft_launcher"
    restart_policy: str = "any-failed"
    max_restarts: int = 8
    agents: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    replaced: list[int] = field(default_factory=list)
    store: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.chaos = self.run_dir / "chaos"
        self.chaos.mkdir(parents=True, exist_ok=True)
        self.logs = self.run_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.rdzv_port = free_port()
        self.generation = 0
        self.run_key = f"training-tests-{uuid.uuid4().hex[:12]}"

    def marker(self, node: int) -> str:
        """The executor's pod marker for a node (-1: the rendezvous store's pod)."""
        return f"{self.run_key}/{'store' if node < 0 else f'node-{node}'}"

    def _env(self, node: int) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                CHAOS_ENV: str(self.chaos),
                POD_ENV: self.marker(node),
                "JOB_COMPLETION_INDEX": str(node),
                "PYTHONWARNINGS": "ignore",
                "PYTHONPATH": str(REPO),
                "OMP_NUM_THREADS": "1",
            }
        )
        return env

    def _node_addr(self, node: int) -> str:
        return f"127.0.0.{2 + node}"

    def _popen(self, cmd: list[str], *, node: int, log_name: str) -> subprocess.Popen[bytes]:
        with (self.logs / log_name).open("ab") as log:
            return subprocess.Popen(
                cmd,
                cwd=REPO,
                env=self._env(node),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _start_store(self) -> None:
        self.store = self._popen(
            [
                sys.executable,
                "-m",
                "training.rendezvous",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.rdzv_port),
            ],
            node=-1,
            log_name="store.log",
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.rdzv_port)) == 0:
                    return
            time.sleep(0.2)
        raise RuntimeError("rendezvous store did not start")

    def _agent_cmd(self, node: int) -> list[str]:
        if self.launcher == "torchrun":  # one "node", the fault-free reference
            return [
                str(VENV_BIN / "torchrun"),
                "--standalone",
                f"--nproc-per-node={self.procs_per_node * self.num_nodes}",
                "-m",
                "training",
                *self.trainer_args,
            ]
        return [
            str(VENV_BIN / "ft_launcher"),
            f"--nnodes={self.num_nodes}:{self.num_nodes}",
            f"--nproc-per-node={self.procs_per_node}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{self.rdzv_port}",
            "--rdzv-conf=is_host=0,last_call_timeout=1",
            "--rdzv-id=test",
            f"--local-addr={self._node_addr(node)}",
            f"--max-restarts={self.max_restarts}",
            "--monitor-interval=0.3",
            f"--ft-restart-policy={self.restart_policy}",
            "--ft-initial-rank-heartbeat-timeout=90",
            "--ft-rank-heartbeat-timeout=60",
            "--ft-workload-check-interval=0.5",
            "--ft-rank-termination-signal=SIGKILL",
            "--ft-enable-nic-monitor=false",
            "--workers-stop-timeout=5",
            "--term-timeout=3",
            "-m",
            "training",
            *self.trainer_args,
        ]

    def _start_agent(self, node: int) -> None:
        self.generation += 1
        self.agents[node] = self._popen(
            self._agent_cmd(node), node=node, log_name=f"node-{node}-{self.generation}.log"
        )

    def _replace_node(self, node: int) -> None:
        # The node is gone, and every process on it (the in-process wrapper's monitor processes
        # daemonize out of the agent's tree; the marker finds them).
        kill_pod_processes(self.marker(node), root_pid=self.agents[node].pid)
        self.agents[node].wait(timeout=10)
        self.replaced.append(node)
        # The replacement pod's init step (k8s/job_chart.py): drop the predecessor from the rendezvous
        # state instead of waiting out the keep-alive expiry.
        evict = self._popen(
            [
                sys.executable,
                "-m",
                "training.rendezvous",
                "evict",
                f"--endpoint=127.0.0.1:{self.rdzv_port}",
                "--run-id=test",
                f"--node-addr={self._node_addr(node)}",
                "--timeout=30",
            ],
            node=node,
            log_name=f"evict-{node}.log",
        )
        evict.wait(timeout=60)
        self._start_agent(node)

    def run(self, *, timeout_s: float) -> dict[int, int]:
        """Run to completion (replacing deleted nodes); return each node's exit code."""
        if self.launcher == "ft_launcher":
            self._start_store()
            nodes = range(self.num_nodes)
        else:
            nodes = range(1)
        for node in nodes:
            self._start_agent(node)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for request in sorted(self.chaos.glob("delete-node-*")):
                node = int(request.name.rsplit("-", 1)[1])
                request.unlink()
                self._replace_node(node)
            codes = {n: a.poll() for n, a in self.agents.items()}
            if all(code is not None for code in codes.values()):
                return {n: int(c) for n, c in codes.items() if c is not None}
            time.sleep(0.2)
        raise TimeoutError(f"job did not finish in {timeout_s} s; logs in {self.logs}")

    def close(self) -> None:
        kill_pod_processes(self.run_key)
        for proc in [*self.agents.values(), *([self.store] if self.store else [])]:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


def run_job(run_dir: Path, trainer_args: list[str], *, timeout_s: float, **kwargs: object) -> LocalJob:
    """Run one job to completion under a hard bound; always kill what it started."""
    job = LocalJob(run_dir=run_dir, trainer_args=[*trainer_args, "--run-dir", str(run_dir)], **kwargs)
    try:
        codes = job.run(timeout_s=timeout_s)
    finally:
        job.close()
    expected = {0: 0} if job.launcher == "torchrun" else dict.fromkeys(range(job.num_nodes), 0)
    assert codes == expected, f"exit codes {codes}; logs in {job.logs}"
    left = marked_processes(job.run_key)
    assert not left, f"processes left behind: {[(p.pid, p.name()) for p in left]}"
    return job


@pytest.fixture(scope="session")
def training_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("training")


@pytest.fixture(scope="session")
def local_job() -> object:
    """`run_job` for the tests (conftest modules are not importable by name)."""
    return run_job
