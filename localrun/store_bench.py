"""`nvrx-eks bench store`: the rendezvous store under load, on loopback.

The store is the process the store Deployment runs: `python -m training.control` with the command line
k8s/launcher.py `control_command` renders (NVRx's control process: it hosts the TCPStore and closes every
rendezvous round). Against it:

- Rendezvous rounds: N simulated agents, one thread each with its own TCPStore client, each running
  NVRx's own barrier-rendezvous join (`_RendezvousBarrierState.perform_rendezvous`: the same keys and
  store operations an ft_launcher's agent issues per round, from the installed NVRx). Round 0 is the
  job's first rendezvous; each later round is a restart round, opened as a launcher that saw its
  workers fail opens it (`open_rendezvous`). A round lasts from its opening until the last agent holds
  its rank; `closed_s` is when the control process closed it (every agent joined, ranks written).
- A process-group barrier: M clients through torch's own store barrier (`_store_based_barrier`, what
  `init_process_group` runs: `add` + `wait` on one key), from release to the last client through.

`rss_mb` is the store process's peak resident memory (VmHWM). Agents are threads of this process, so on
a small machine they share its cores with the store: the figures are an upper bound on the store's
share of a round.

Every client's connect makes torch resolve its own socket address (a reverse lookup, for a log line);
where the resolver drops queries, as in some sandboxes, a connect waits for the resolver's timeout
(5 s by default). The bench sets `RES_OPTIONS=timeout:1 attempts:1` for its own process so setup stays
bounded; rounds are timed after every client connected, so the figures do not include it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kitcore.configio import UserError

if TYPE_CHECKING:
    from collections.abc import Callable

DEFAULT_AGENTS = (256, 512, 1024, 2048)
DEFAULT_BARRIER_CLIENTS = 16384
ROUND_GOAL_S = 5.0
"""A rendezvous round at >= 2,048 agents, on this machine."""
GOAL_AGENTS = 2048
RESTART_ROUNDS = 3
"""Restart rounds timed per agent count (after the first rendezvous); the row is their median."""
_CONNECT_WORKERS = 64
_THREAD_STACK = 256 * 1024
_REPO = Path(__file__).resolve().parents[1]
_VALUES = _REPO / "k8s" / "values" / "local-cpu.yaml"
_RESOLVER = "timeout:1 attempts:1"


@dataclass
class StoreRow:
    agents: int
    round_s: float
    """Median restart round: opened -> every agent holds its rank."""
    rss_mb: float
    first_s: float
    """The first rendezvous (round 0), every agent starting at once."""
    closed_s: float
    """Median: opened -> the control process closed the round (all joined, ranks written)."""
    store_cpu_s: float
    """CPU seconds the store process used per restart round (mean): its share of the round."""
    agents_cpu_s: float
    """CPU seconds the simulated agents (this process) used per restart round (mean)."""
    rounds_s: list[float]
    connect_s: float


@dataclass
class BarrierRow:
    clients: int
    barrier_s: float
    rss_mb: float
    connect_s: float


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds the process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


class _Store:
    """The store Deployment's process, on a free loopback port; ended (SIGTERM, then SIGKILL) on exit."""

    def __init__(self, *, nodes: int, log: Path) -> None:
        from k8s.launcher import control_command  # noqa: PLC0415
        from k8s.load import load_values  # noqa: PLC0415

        self.port = _free_port()
        values = load_values(_VALUES, [f"num_nodes={nodes}"])
        command = control_command(values, port=self.port)
        # The image runs `python`; here it is this interpreter, with the repository importable.
        command[0] = sys.executable
        env = {**os.environ, "PYTHONPATH": str(_REPO)}
        self._log = log.open("w")
        self.proc = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=_REPO)
        self.rdzv_id = values.name

    def wait_listening(self, timeout_s: float) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the store exited ({self.proc.returncode}); see {self._log.name}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return
            time.sleep(0.1)
        raise RuntimeError(f"the store did not listen within {timeout_s:.0f} s; see {self._log.name}")

    def rss_mb(self) -> float:
        return _peak_rss_mb(self.proc.pid)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _connect(port: int, count: int, timeout_s: float) -> tuple[list[Any], float]:
    """`count` TCPStore clients of the store on `port`, connected in parallel."""
    from torch.distributed import TCPStore  # noqa: PLC0415

    def one(_: int) -> Any:  # noqa: ANN401 - a torch TCPStore
        return TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=timeout_s))

    start = time.monotonic()
    with ThreadPoolExecutor(_CONNECT_WORKERS) as pool:
        clients = list(pool.map(one, range(count)))
    return clients, time.monotonic() - start


class _Agents:
    """`count` agent threads; `round()` releases them into one rendezvous round and times it."""

    def __init__(self, *, stores: list[Any], rdzv_id: str, nodes: int, deadline_s: float) -> None:
        from nvidia_resiliency_ext.fault_tolerance import ft_rendezvous_barrier as barrier  # noqa: PLC0415
        from nvidia_resiliency_ext.shared_utils.log_manager import LogConfig  # noqa: PLC0415

        from training.resilience.nvrx_compat import poll_rendezvous_faster  # noqa: PLC0415

        # Each real agent logs on its own node; thousands of them writing one process's stderr would
        # time this process's logging, not the store. The store's own log stays as deployed.
        logging.getLogger(LogConfig.name).setLevel(logging.ERROR)
        # The agents poll as the kit's launchers do (training/resilience/launch.py applies the same mend).
        poll_rendezvous_faster()
        self._barrier = barrier
        self._nodes = nodes
        self._deadline_s = deadline_s
        # Each agent is one node with its own infrastructure rank (its pod index on EKS: GROUP_RANK),
        # which NVRx reads from the environment; threads share one, so each thread answers its own.
        local = threading.local()
        barrier.get_infrastructure_rank = lambda *_a, **_k: local.rank
        self._local = local
        self._states = [
            barrier._RendezvousBarrierState(  # noqa: SLF001 - NVRx's own agent-side rendezvous
                store=s, run_id=rdzv_id, is_store_host=False, join_timeout_seconds=deadline_s
            )
            for s in stores
        ]
        self._go = threading.Semaphore(0)
        self._done: list[float] = [0.0] * len(stores)
        self._errors: list[BaseException] = []
        self._stop = False
        previous = threading.stack_size(_THREAD_STACK)
        try:
            self._threads = [
                threading.Thread(target=self._agent, args=(i,), daemon=True, name=f"agent-{i}")
                for i in range(len(stores))
            ]
            for t in self._threads:
                t.start()
        finally:
            threading.stack_size(previous)

    def _agent(self, i: int) -> None:
        self._local.rank = i
        node = self._barrier._NodeDesc(addr=f"agent-{i}", pid=os.getpid(), local_id=0)  # noqa: SLF001
        while True:
            self._go.acquire()
            if self._stop:
                return
            try:
                self._states[i].perform_rendezvous(node, self._nodes, self._nodes)
            except BaseException as exc:  # noqa: BLE001 - reported by round()
                self._errors.append(exc)
            self._done[i] = time.monotonic()

    def round(self, opener: Any, store: Any, number: int) -> tuple[float, float]:  # noqa: ANN401
        """Open round `number` (a launcher's `open_rendezvous`; round 0 is open from the start), release
        every agent, return (seconds to the last agent's rank, seconds to the control process's close)."""
        self._done = [0.0] * len(self._threads)
        done_key = f"{opener.prefix}:round_done_{number}"
        start = time.monotonic()
        if number > 0:
            opener._round = number - 1  # noqa: SLF001 - the round the failing launcher trained in
            opener.open_rendezvous()
        self._go.release(len(self._threads))
        closed = None
        while not all(self._done):
            if self._errors:
                raise RuntimeError(f"an agent failed in round {number}: {self._errors[0]!r}")
            if time.monotonic() - start > self._deadline_s:
                raise RuntimeError(f"round {number} did not finish within {self._deadline_s:.0f} s")
            if closed is None and store.check([done_key]) and store.get(done_key) == b"1":
                closed = time.monotonic() - start
            time.sleep(0.01)
        total = max(self._done) - start
        return total, total if closed is None else closed

    def stop(self) -> None:
        self._stop = True
        self._go.release(len(self._threads))


def rendezvous_row(agents: int, *, restart_rounds: int, log_dir: Path, deadline_s: float) -> StoreRow:
    """One agent count: the first rendezvous, then `restart_rounds` restart rounds."""
    from nvidia_resiliency_ext.fault_tolerance import ft_rendezvous_barrier as barrier  # noqa: PLC0415

    store = _Store(nodes=agents, log=log_dir / f"store-{agents}.log")
    clients: list[Any] = []
    pool: _Agents | None = None
    try:
        store.wait_listening(60)
        clients, connect_s = _connect(store.port, agents + 1, deadline_s)
        main = clients.pop()
        opener = barrier._RendezvousBarrierState(store=main, run_id=store.rdzv_id)  # noqa: SLF001
        pool = _Agents(stores=clients, rdzv_id=store.rdzv_id, nodes=agents, deadline_s=deadline_s)
        first_s, _ = pool.round(opener, main, 0)
        cpu0 = (_cpu_s(store.proc.pid), _cpu_s(os.getpid()))
        rounds = [pool.round(opener, main, n) for n in range(1, restart_rounds + 1)]
        store_cpu = (_cpu_s(store.proc.pid) - cpu0[0]) / restart_rounds
        agents_cpu = (_cpu_s(os.getpid()) - cpu0[1]) / restart_rounds
        return StoreRow(
            agents=agents,
            round_s=round(statistics.median(r[0] for r in rounds), 3),
            rss_mb=round(store.rss_mb(), 1),
            first_s=round(first_s, 3),
            closed_s=round(statistics.median(r[1] for r in rounds), 3),
            store_cpu_s=round(store_cpu, 2),
            agents_cpu_s=round(agents_cpu, 2),
            rounds_s=[round(r[0], 3) for r in rounds],
            connect_s=round(connect_s, 2),
        )
    finally:
        if pool is not None:
            pool.stop()
        store.close()
        clients.clear()


def barrier_row(clients: int, *, log_dir: Path, deadline_s: float) -> BarrierRow:
    """`clients` ranks through torch's store barrier at process-group setup, on the store process."""
    from torch.distributed.distributed_c10d import _store_based_barrier  # noqa: PLC0415

    store = _Store(nodes=1, log=log_dir / f"store-barrier-{clients}.log")
    stores: list[Any] = []
    try:
        store.wait_listening(60)
        stores, connect_s = _connect(store.port, clients, deadline_s)
        go = threading.Event()
        done: list[float] = [0.0] * clients
        errors: list[BaseException] = []

        def rank(i: int) -> None:
            go.wait()
            try:
                _store_based_barrier(i, stores[i], "bench", clients, timedelta(seconds=deadline_s))
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
            done[i] = time.monotonic()

        previous = threading.stack_size(_THREAD_STACK)
        try:
            threads = [threading.Thread(target=rank, args=(i,), daemon=True) for i in range(clients)]
            for t in threads:
                t.start()
        finally:
            threading.stack_size(previous)
        start = time.monotonic()
        go.set()
        for t in threads:
            t.join(timeout=max(0.0, deadline_s - (time.monotonic() - start)))
        if errors or not all(done):
            raise RuntimeError(f"the barrier of {clients} did not complete: {errors[:1] or 'deadline'}")
        return BarrierRow(
            clients=clients,
            barrier_s=round(max(done) - start, 3),
            rss_mb=round(store.rss_mb(), 1),
            connect_s=round(connect_s, 2),
        )
    finally:
        store.close()
        stores.clear()


def check_limits(largest: int) -> None:
    """Refuse counts this machine cannot open: one socket per client, in this process and the store's."""
    import resource  # noqa: PLC0415

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = largest + 256
    if need > hard:
        raise UserError(
            f"{largest} clients need {need} open files; this machine allows {hard} (ulimit -Hn): "
            "lower --barrier-clients or --agents"
        )
    if need > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the store inherits it


def run_store_bench(
    *,
    agents: list[int],
    barrier_clients: int,
    restart_rounds: int = RESTART_ROUNDS,
    json_out: Path | None,
    log_dir: Path,
    deadline_s: float = 120.0,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Every agent count, then the barrier; prints a table, writes --json-out."""
    from kitcore.console import make_console  # noqa: PLC0415

    check_limits(max([*agents, barrier_clients]))
    os.environ.setdefault("RES_OPTIONS", _RESOLVER)
    log_dir.mkdir(parents=True, exist_ok=True)
    rows: list[StoreRow] = []
    for count in agents:
        echo(f"{count} agents ...")
        row = rendezvous_row(count, restart_rounds=restart_rounds, log_dir=log_dir, deadline_s=deadline_s)
        rows.append(row)
    barrier = None
    if barrier_clients:
        echo(f"{barrier_clients} clients through one barrier ...")
        barrier = barrier_row(barrier_clients, log_dir=log_dir, deadline_s=deadline_s)
    at_goal = [r for r in rows if r.agents >= GOAL_AGENTS]
    document = {
        "store": [asdict(r) for r in rows],
        "barrier": None if barrier is None else asdict(barrier),
        "goal": {
            "agents": GOAL_AGENTS,
            "round_s": ROUND_GOAL_S,
            "met": bool(at_goal) and all(r.round_s <= ROUND_GOAL_S for r in at_goal),
        },
        "machine": {"cpus": os.cpu_count()},
    }
    _print(make_console(), rows, barrier)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(document, indent=2) + "\n")
    return document


def _print(console: Any, rows: list[StoreRow], barrier: BarrierRow | None) -> None:  # noqa: ANN401
    from rich.table import Table  # noqa: PLC0415

    table = Table(title="Rendezvous store under load (loopback)", title_justify="left")
    for column in ("agents", "round_s", "closed_s", "first_s", "rss_mb", "store cpu_s", "agents cpu_s"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(
            str(r.agents),
            f"{r.round_s:.2f}",
            f"{r.closed_s:.2f}",
            f"{r.first_s:.2f}",
            f"{r.rss_mb:.0f}",
            f"{r.store_cpu_s:.2f}",
            f"{r.agents_cpu_s:.2f}",
        )
    console.print(table)
    if barrier is not None:
        console.print(
            f"barrier: {barrier.clients} clients in {barrier.barrier_s:.2f} s, "
            f"store RSS {barrier.rss_mb:.0f} MB (connect {barrier.connect_s:.1f} s)"
        )
