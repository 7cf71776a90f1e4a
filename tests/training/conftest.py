"""A local job for the trainer tests: a rendezvous store process and ft_launcher agents ("nodes").

Plays the parts the local executor and the Job controller play in the demo: each node is an agent in
its own session; a node-loss request (`$NVRX_EKS_CHAOS_DIR/delete-node-<i>`) kills that agent's whole
process group and starts a replacement. Everything is killed by process group in `close()`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process's whole tree: its group and every descendant (workers run in their own
    sessions, and the in-process wrapper's monitor processes are children of the workers)."""
    with contextlib.suppress(psutil.NoSuchProcess):
        tree = psutil.Process(proc.pid).children(recursive=True)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for child in locals().get("tree", []):
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


@dataclass
class LocalJob:
    run_dir: Path
    trainer_args: list[str]
    num_nodes: int = 2
    procs_per_node: int = 2
    launcher: str = "ft_launcher"
    max_restarts: int = 8
    agents: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    replaced: list[int] = field(default_factory=list)
    store: subprocess.Popen[bytes] | None = None
    every_agent: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.chaos = self.run_dir / "chaos"
        self.chaos.mkdir(parents=True, exist_ok=True)
        self.logs = self.run_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.rdzv_port = free_port()

    def _env(self, node: int) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            NVRX_EKS_CHAOS_DIR=str(self.chaos),
            JOB_COMPLETION_INDEX=str(node),
            PYTHONWARNINGS="ignore",
            PYTHONPATH=str(REPO),
            OMP_NUM_THREADS="1",
        )
        return env

    def _start_store(self) -> None:
        log = (self.logs / "store.log").open("ab")
        self.store = subprocess.Popen(
            [sys.executable, "-m", "training.rendezvous", "--port", str(self.rdzv_port)],
            cwd=REPO,
            env=self._env(0),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.rdzv_port)) == 0:
                    return
            time.sleep(0.2)
        raise RuntimeError("rendezvous store did not start")

    def _start_agent(self, node: int) -> None:
        log = (self.logs / f"node-{node}-{len(self.every_agent)}.log").open("ab")
        if self.launcher == "ft_launcher":
            cmd = [
                str(VENV_BIN / "ft_launcher"),
                f"--nnodes={self.num_nodes}",
                f"--nproc-per-node={self.procs_per_node}",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{self.rdzv_port}",
                "--rdzv-conf=is_host=0",
                "--rdzv-id=test",
                f"--max-restarts={self.max_restarts}",
                "--monitor-interval=0.3",
                "--ft-restart-policy=any-failed",
                "--ft-initial-rank-heartbeat-timeout=90",
                "--ft-rank-heartbeat-timeout=60",
                "--ft-workload-check-interval=0.5",
                "--ft-rank-termination-signal=SIGKILL",
                "--ft-enable-nic-monitor=false",
                "--ignore-missing-fault-tol-cfg",
                "--term-timeout=3",
                "-m",
                "training",
                *self.trainer_args,
            ]
        else:  # plain torchrun, one "node" (the fault-free reference)
            cmd = [
                str(VENV_BIN / "torchrun"),
                "--standalone",
                f"--nproc-per-node={self.procs_per_node * self.num_nodes}",
                "-m",
                "training",
                *self.trainer_args,
            ]
        agent = subprocess.Popen(
            cmd, cwd=REPO, env=self._env(node), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.agents[node] = agent
        self.every_agent.append(agent)

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
                _kill_group(self.agents[node])  # the pod and everything in it
                self.replaced.append(node)
                self._start_agent(node)  # the Job controller's replacement pod
            codes = {n: a.poll() for n, a in self.agents.items()}
            if all(code is not None for code in codes.values()):
                return {n: int(c) for n, c in codes.items() if c is not None}
            time.sleep(0.2)
        raise TimeoutError(f"job did not finish in {timeout_s} s; logs in {self.logs}")

    def close(self) -> None:
        for agent in self.every_agent:
            _kill_group(agent)
        if self.store is not None:
            _kill_group(self.store)


@pytest.fixture
def local_job(tmp_path: Path):
    jobs: list[LocalJob] = []

    def make(name: str, trainer_args: list[str], **kwargs: object) -> LocalJob:
        run_dir = tmp_path / name
        job = LocalJob(run_dir=run_dir, trainer_args=[*trainer_args, "--run-dir", str(run_dir)], **kwargs)
        jobs.append(job)
        return job

    yield make
    for job in jobs:
        job.close()
