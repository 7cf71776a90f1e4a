"""`nvrx-eks bench store`: the rendezvous store under load, on loopback.

The store is the process the store Deployment runs: `python -m nvrx_eks.training.resilience.control`
with the command line k8s/launcher.py `control_command` renders (NVRx's control process: it hosts the
TCPStore and closes every rendezvous round). Against it:

- Rendezvous rounds: N simulated agents, one thread each with its own TCPStore client, each running
  NVRx's own barrier-rendezvous join (`_RendezvousBarrierState.perform_rendezvous`: the same keys and
  store operations an ft_launcher's agent issues per round, from the installed NVRx). Round 0 is the
  job's first rendezvous; each later round is a restart round, opened as a launcher that saw its
  workers fail opens it (`open_rendezvous`). A round lasts from its opening until the last agent holds
  its rank; `closed_s` is when the control process closed it (every agent joined, ranks written).
- A process-group barrier: M clients through the store operations of torch's store barrier
  (`_store_based_barrier`: add, add, the last sets a key, wait; the same round trips per rank as NVRx's
  in-process barrier), from release to the last client through, once per client simulation
  (`ClientSim`: so many threads in so many processes of this machine). The store's CPU is read per
  thread: its event loop serves every request one after another, so the loop's CPU over a barrier is
  the store's own share of it; the clients' processes' CPU is what this machine spent being 16,384
  ranks, which on a cluster each host spends for its own.

`rss_mb` is the store process's peak resident memory (VmHWM). Agents and clients share this machine's
cores with the store: the figures are an upper bound on the store's share of a round.

Every client's connect makes torch resolve its own socket address (a reverse lookup, for a log line);
where the resolver drops queries, as in some sandboxes, a connect waits for the resolver's timeout
(5 s by default). The bench sets `RES_OPTIONS=timeout:1 attempts:1` for its own process so setup stays
bounded; rounds are timed after every client connected, so the figures do not include it.
"""

from __future__ import annotations

import contextlib
import itertools
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

from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.kitcore.ports import ReservedPort
from nvrx_eks.kitcore.runtime import runtime_versions

if TYPE_CHECKING:
    from collections.abc import Callable

    from rich.table import Table

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
        from nvrx_eks.k8s.launcher import control_command  # noqa: PLC0415
        from nvrx_eks.k8s.load import load_values  # noqa: PLC0415

        self._port = ReservedPort()  # held until the store has exited: kitcore/ports.py
        self.port = self._port.port
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
        self._port.release()


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

        from nvrx_eks.training.resilience.nvrx_compat import poll_rendezvous_faster  # noqa: PLC0415

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


# ---- the process-group barrier ------------------------------------------------------------------------
def barrier_key(group: str) -> str:
    """torch's barrier key for a process group named `group` (distributed_c10d
    STORE_BASED_BARRIER_PREFIX + the group's name)."""
    return f"store_based_barrier_key:{group}"


def barrier_arrive(store: Any, key: str, world: int) -> None:  # noqa: ANN401 - a torch Store
    """One rank's arrival, the store operations of torch's `_store_based_barrier` in its order: add 1,
    read the count back (add 0), and the last to arrive sets the release key."""
    store.add(key, 1)
    if store.add(key, 0) == world:
        store.set(f"{key}:last_worker", "1")


def barrier_wait(store: Any, key: str, timeout: timedelta) -> None:  # noqa: ANN401 - a torch Store
    """One rank's wait for the release key (the server answers when the last arrival set it)."""
    store.wait([f"{key}:last_worker"], timeout)


@dataclass(frozen=True)
class ClientSim:
    """How the barrier's clients are simulated on this machine: `threads` threads spread over `procs`
    processes, each thread driving its share of the clients. With one client per thread every rank runs
    torch's sequence as a rank would; with several, a thread issues its clients' arrivals one after
    another, then their waits (most of which the server answers at once: the release key is set by
    then). Same store operations either way; what changes is how much CPU this machine spends being
    the clients, which is the point of comparing rows."""

    procs: int
    threads: int

    @property
    def label(self) -> str:
        return f"{self.procs}x{self.threads}"


DEFAULT_BARRIER_SIMS = (ClientSim(1, 16), ClientSim(1, 1024), ClientSim(4, 1024))
NVRX_BARRIER_S = 0.5
"""NVRx's published TCPStore-based barrier at 16K ranks (its in-process restart guide, "Restart latency":
its own barrier issues the same number of round trips per rank: add, append, wait)."""


def parse_sims(texts: list[str], *, clients: int) -> list[ClientSim]:
    """`1x16` -> ClientSim(procs=1, threads=16); at least one thread per process, at most one per client."""
    sims: list[ClientSim] = []
    for text in texts:
        procs, _, threads = text.partition("x")
        try:
            sim = ClientSim(int(procs), int(threads))
        except ValueError:
            sim = ClientSim(0, 0)
        if not 1 <= sim.procs <= sim.threads <= max(1, clients):
            raise UserError(
                f"--barrier-sim {text!r}: give PROCSxTHREADS with 1 <= PROCS <= THREADS <= "
                f"--barrier-clients ({clients}), e.g. --barrier-sim 1x16"
            )
        sims.append(sim)
    return sims


def _split(total: int, parts: int) -> list[int]:
    """`total` as `parts` counts that differ by at most one."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


@dataclass
class BarrierRow:
    """One barrier of `clients` ranks, timed from the release (every client connected, every thread
    waiting) to the last rank through. Phases, from client-side stamps (CLOCK_MONOTONIC, one clock for
    every process on the machine):
    wake: release -> the first arrival counted (this machine waking the simulated clients);
    arrive: first -> last arrival (the adds: the store serves 2 per client while the clients compete for
    the cores); release: last arrival -> last client through (the waits)."""

    clients: int
    procs: int
    threads: int
    barrier_s: float
    wake_s: float
    arrive_s: float
    release_s: float
    store_loop_cpu_s: float
    """CPU of the store's busiest thread over the barrier: its event loop, which serves every request
    one after another -- the store's own floor for this barrier on this machine's cores."""
    store_cpu_s: float
    """CPU of the whole store process over the barrier (the control process's own threads included)."""
    clients_cpu_s: float
    """CPU the simulated clients' processes used over the barrier."""
    connect_s: float
    """Every client connected (all processes at once), before the barrier's clock starts."""
    store_connect_cpu_s: float
    rss_mb: float

    @property
    def store_share(self) -> float:
        """The share of the barrier the store's loop was busy; the rest is the client simulation."""
        return self.store_loop_cpu_s / self.barrier_s if self.barrier_s > 0 else 0.0


def _thread_cpu(pid: int) -> dict[int, float]:
    import psutil  # noqa: PLC0415

    return {t.id: t.user_time + t.system_time for t in psutil.Process(pid).threads()}


def _client_worker(port: int, key: str, count: int, world: int, threads: int, deadline_s: float) -> None:
    """A process of simulated clients (`python -m nvrx_eks.bench.store`), one step per line on stdin,
    one JSON line on stdout after each: import torch (while the store starts), connect, run the barrier
    and report the stamps and this process's CPU."""
    import resource  # noqa: PLC0415

    import torch.distributed  # noqa: F401, PLC0415 - the slow import, done before the store listens

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(json.dumps({"imported": True}), flush=True)
    sys.stdin.readline()
    stores, connect_s = _connect(port, count, deadline_s)
    go = threading.Event()
    arrived = [0.0] * count
    through = [0.0] * count
    errors: list[str] = []
    timeout = timedelta(seconds=deadline_s)

    def drive(lo: int, hi: int) -> None:
        go.wait()
        try:
            for i in range(lo, hi):
                barrier_arrive(stores[i], key, world)
                arrived[i] = time.monotonic()
            for i in range(lo, hi):
                barrier_wait(stores[i], key, timeout)
                through[i] = time.monotonic()
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            errors.append(repr(exc))

    bounds = [0]
    for size in _split(count, threads):
        bounds.append(bounds[-1] + size)
    previous = threading.stack_size(_THREAD_STACK)
    try:
        workers = [
            threading.Thread(target=drive, args=(lo, hi), daemon=True)
            for lo, hi in itertools.pairwise(bounds)
        ]
        for t in workers:
            t.start()
    finally:
        threading.stack_size(previous)
    print(json.dumps({"connect_s": connect_s}), flush=True)
    sys.stdin.readline()
    cpu0 = time.process_time()
    go.set()
    end = time.monotonic() + deadline_s
    for t in workers:
        t.join(timeout=max(0.0, end - time.monotonic()))
    if not errors and not all(through):
        errors.append(f"deadline: {sum(1 for t in through if not t)} clients not through")
    print(
        json.dumps(
            {
                "first_arrival": min(arrived),
                "last_arrival": max(arrived),
                "last_through": max(through),
                "cpu_s": time.process_time() - cpu0,
                "errors": errors[:1],
            }
        ),
        flush=True,
    )


def _read_line(proc: subprocess.Popen[str], what: str, log: Path) -> dict[str, Any]:
    assert proc.stdout is not None  # noqa: S101 - opened with stdout=PIPE
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"a client process exited before {what} ({proc.wait()}); see {log}")
    answer: dict[str, Any] = json.loads(line)
    return answer


def _tell(procs: list[subprocess.Popen[str]], line: str) -> None:
    for p in procs:
        assert p.stdin is not None  # noqa: S101 - opened with stdin=PIPE
        p.stdin.write(line + "\n")
        p.stdin.flush()


def barrier_row(clients: int, sim: ClientSim, *, log_dir: Path, deadline_s: float) -> BarrierRow:
    """`clients` ranks through one barrier on a store process of its own, simulated as `sim` says (a
    store per barrier: the control process ends itself once its own rendezvous times out, 300 s)."""
    store = _Store(nodes=1, log=log_dir / f"store-barrier-{clients}-{sim.label}.log")
    procs: list[subprocess.Popen[str]] = []
    client_log = log_dir / f"clients-barrier-{clients}-{sim.label}.log"
    try:
        env = {**os.environ, "PYTHONPATH": str(_REPO)}
        with client_log.open("w") as log:
            for count, threads in zip(
                _split(clients, sim.procs), _split(sim.threads, sim.procs), strict=True
            ):
                argv = [
                    str(a) for a in (store.port, barrier_key("bench"), count, clients, threads, deadline_s)
                ]
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "nvrx_eks.bench.store", *argv],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=log,
                        text=True,
                        env=env,
                        cwd=_REPO,
                    )
                )
        # The clients import torch while the store starts; they connect once it listens.
        store.wait_listening(60)
        for p in procs:
            _read_line(p, "importing torch", client_log)
        connect_cpu0 = sum(_thread_cpu(store.proc.pid).values())
        _tell(procs, "connect")
        connect_s = max(_read_line(p, "connecting", client_log)["connect_s"] for p in procs)
        store_cpu0 = _thread_cpu(store.proc.pid)
        start = time.monotonic()
        _tell(procs, "go")
        results = [_read_line(p, "the barrier ended", client_log) for p in procs]
        store_cpu1 = _thread_cpu(store.proc.pid)
        errors = [e for r in results for e in r["errors"]]
        if errors:
            raise RuntimeError(f"the barrier of {clients} ({sim.label}) did not complete: {errors[0]}")
        per_thread = [store_cpu1[t] - store_cpu0.get(t, 0.0) for t in store_cpu1]
        first_arrival = min(r["first_arrival"] for r in results)
        last_arrival = max(r["last_arrival"] for r in results)
        last_through = max(r["last_through"] for r in results)
        return BarrierRow(
            clients=clients,
            procs=sim.procs,
            threads=sim.threads,
            barrier_s=round(last_through - start, 3),
            wake_s=round(first_arrival - start, 3),
            arrive_s=round(last_arrival - first_arrival, 3),
            release_s=round(last_through - last_arrival, 3),
            store_loop_cpu_s=round(max(per_thread), 3),
            store_cpu_s=round(sum(per_thread), 3),
            clients_cpu_s=round(sum(r["cpu_s"] for r in results), 3),
            connect_s=round(connect_s, 2),
            store_connect_cpu_s=round(sum(store_cpu0.values()) - connect_cpu0, 3),
            rss_mb=round(store.rss_mb(), 1),
        )
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            for pipe in (p.stdin, p.stdout):
                if pipe is not None:
                    with contextlib.suppress(OSError):  # a killed worker's stdin may be broken
                        pipe.close()
        store.close()


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


def barrier_breakdown(rows: list[BarrierRow]) -> dict[str, Any]:
    """Where the barrier's time goes across the simulations run: the store's loop does the same work in
    each (its CPU is the store's share); what the fastest and the slowest barrier add to it is this
    machine being the clients."""
    fast = min(rows, key=lambda r: r.barrier_s)
    slow = max(rows, key=lambda r: r.barrier_s)
    return {
        "clients": fast.clients,
        "store_loop_cpu_s": [min(r.store_loop_cpu_s for r in rows), max(r.store_loop_cpu_s for r in rows)],
        "fastest": f"{fast.procs}x{fast.threads}",
        "fastest_barrier_s": fast.barrier_s,
        "fastest_store_share": round(fast.store_share, 3),
        "slowest": f"{slow.procs}x{slow.threads}",
        "slowest_barrier_s": slow.barrier_s,
        "slowest_store_share": round(slow.store_share, 3),
        "slowest_clients_cpu_s": slow.clients_cpu_s,
        "nvrx_published_s": NVRX_BARRIER_S,
        "cpus": os.cpu_count(),
    }


def breakdown_line(b: dict[str, Any]) -> str:
    low, high = b["store_loop_cpu_s"]
    return (
        f"store: its event loop busy {low:.2f}-{high:.2f} s for {b['clients']:,} clients whichever the "
        f"simulation; the barrier took {b['fastest_barrier_s']:.2f} s ({b['fastest']}, the store "
        f"{b['fastest_store_share']:.0%} of it) to {b['slowest_barrier_s']:.2f} s ({b['slowest']}, the store "
        f"{b['slowest_store_share']:.0%}: the other {1 - b['slowest_store_share']:.0%} this machine being "
        f"the clients, {b['slowest_clients_cpu_s']:.1f} CPU s on {b['cpus']} cores). NVRx publishes "
        f"{b['nvrx_published_s']:g} s for its store barrier at 16K ranks."
    )


def run_store_bench(
    *,
    agents: list[int],
    barrier_clients: int,
    barrier_sims: list[ClientSim] | None = None,
    restart_rounds: int = RESTART_ROUNDS,
    json_out: Path | None,
    log_dir: Path,
    deadline_s: float = 120.0,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Every agent count, then the barrier once per client simulation; prints tables, writes --json-out."""
    from nvrx_eks.kitcore.console import make_console  # noqa: PLC0415

    sims = list(DEFAULT_BARRIER_SIMS) if barrier_sims is None else barrier_sims
    check_limits(max([*agents, barrier_clients]))
    os.environ.setdefault("RES_OPTIONS", _RESOLVER)
    log_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    rows: list[StoreRow] = []
    for count in agents:
        echo(f"{count} agents ...")
        row = rendezvous_row(count, restart_rounds=restart_rounds, log_dir=log_dir, deadline_s=deadline_s)
        rows.append(row)
    rendezvous_s = time.monotonic() - started
    barriers: list[BarrierRow] = []
    failed: dict[str, str] = {}
    for sim in sims if barrier_clients else []:
        echo(f"{barrier_clients} clients through one barrier, simulated as {sim.label} (procs x threads) ...")
        try:
            barriers.append(barrier_row(barrier_clients, sim, log_dir=log_dir, deadline_s=deadline_s))
        except RuntimeError as exc:  # one simulation past its deadline: the others still measure the store
            echo(f"{sim.label}: {exc}")
            failed[sim.label] = str(exc)
    barrier_s = time.monotonic() - started - rendezvous_s
    elapsed = {"rendezvous": round(rendezvous_s, 1), "barrier": round(barrier_s, 1)}
    at_goal = [r for r in rows if r.agents >= GOAL_AGENTS]
    document = {
        "store": [asdict(r) for r in rows],
        "barrier": [asdict(b) | {"store_share": round(b.store_share, 3)} for b in barriers],
        "barrier_failed": failed,
        "barrier_breakdown": barrier_breakdown(barriers) if barriers else None,
        "goal": {
            "agents": GOAL_AGENTS,
            "round_s": ROUND_GOAL_S,
            "met": bool(at_goal) and all(r.round_s <= ROUND_GOAL_S for r in at_goal),
        },
        "machine": {"cpus": os.cpu_count()},
        "versions": runtime_versions(),
        "elapsed_s": elapsed,
    }
    console = make_console()
    _print(console, rows)
    if barriers:
        console.print(barrier_table(barriers))
        console.print(breakdown_line(barrier_breakdown(barriers)), soft_wrap=True)
    echo(f"bench: rendezvous rows {rendezvous_s:.0f} s, barriers {barrier_s:.0f} s (setup included)")
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(document, indent=2) + "\n")
    return document


def _print(console: Any, rows: list[StoreRow]) -> None:  # noqa: ANN401 - a rich Console
    from rich.table import Table  # noqa: PLC0415

    if not rows:
        return
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


def barrier_table(rows: list[BarrierRow]) -> Table:
    """A row per client simulation: the barrier, its phases, and the CPU each side used."""
    from rich.table import Table  # noqa: PLC0415

    table = Table(
        title=f"{rows[0].clients:,} clients through one process-group store barrier (torch's "
        "_store_based_barrier operations), by how this machine simulates them",
        title_justify="left",
    )
    columns = ("procs x threads", "barrier s", "wake", "arrive", "release", "store loop cpu_s",
               "store cpu_s", "clients cpu_s", "store share", "connect s", "rss_mb")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(
            f"{r.procs}x{r.threads}",
            f"{r.barrier_s:.2f}",
            f"{r.wake_s:.2f}",
            f"{r.arrive_s:.2f}",
            f"{r.release_s:.2f}",
            f"{r.store_loop_cpu_s:.2f}",
            f"{r.store_cpu_s:.2f}",
            f"{r.clients_cpu_s:.2f}",
            f"{r.store_share:.0%}",
            f"{r.connect_s:.1f}",
            f"{r.rss_mb:.0f}",
        )
    return table


if __name__ == "__main__":
    # A process of simulated barrier clients (barrier_row starts it): PORT KEY COUNT WORLD THREADS DEADLINE_S.
    _port, _key, _count, _world, _threads, _deadline = sys.argv[1:7]
    _client_worker(int(_port), _key, int(_count), int(_world), int(_threads), float(_deadline))
