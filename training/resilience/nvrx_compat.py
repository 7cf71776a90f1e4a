"""Every place the kit reaches into NVRx's internals, in one module.

The kit supports NVRx from the image pin's minor release on (kitcore/pins.py; `make setup` installs the
pin here). Its public API (inprocess.Wrapper, RankMonitorClient, ft_launcher's and nvrx-control's
command lines) is used directly everywhere else. What is private is used only here, and each use is
guarded twice: `require_internal` refuses to patch an NVRx whose internals no longer have the expected
shape (a clear error at start, never a silent no-op), and tests/training/test_training_nvrx_compat.py
fails when the installed NVRx's internals change.

- Heartbeat timeouts with floors: NVRx calculates them from observed intervals and exposes no public
  setter; `_set_calculated_timeouts` installs them as if calculated (so `state_dict` persists them).
- ft_launcher's orphan cleanup (`terminate_mp_processes`) SIGTERMs then SIGKILLs the process group of
  every worker. It assumes each worker leads a group of its own, as a `subprocess` start does. The
  workers of training/resilience/launch.py fork from the forkserver, which is in the launcher's own process
  group, so the cleanup killed the launcher itself at the end of every run (observed: `Failed to send SIGTERM
  to process group`, SignalException in the agent, the pod lost). `keep_launcher_process_group` leaves
  the launcher's group out; the workers themselves are still stopped by ft_launcher's process context.
  With no other group left it skips the cleanup, whose fixed 1 s grace between SIGTERM and SIGKILL
  would otherwise add a second to every restart's teardown for nothing to clean.
- Which nodes a restart round makes active: NVRx's barrier rendezvous waits `last_call_timeout` for the
  previous round's active nodes, but then ranks every node present by its infrastructure rank alone
  (`_sort_rankable_participants`, then `_assign_group_ranks` sorts by it again). A hot spare with a lower
  pod index than an active node therefore took that node's place at every restart round, a SIGKILL's
  included, and the displaced node's ranks restored from a partner (tests/training/test_training_pods.py
  shows it). `keep_previous_actives_first` ranks the previous round's active nodes before all others
  (each group still in infrastructure order), so a spare takes only a place no previous active node
  came back for. It runs in the control process (training/resilience/control.py), the only one that assigns
  ranks.
- In-process restart on a node without GPUs: the Wrapper adds NVML-based GPU, NVLink and NIC health
  checks to every restart whenever LOCAL_RANK is set when it is built (`_construct_restart_health_check`,
  called from `__init__`). Without NVML the GPU check fails, so every soft fault became a process exit
  and a launcher restart (the demo's exception, hang, OOM and skipped collective were all recovered by
  ft_launcher). `inprocess_wrapper(gpu=False)` builds the Wrapper with LOCAL_RANK hidden, so a CPU run
  keeps only the kit's own health checks; on GPU nodes NVRx's checks stay.
- The in-process progress watchdog: a non-daemon thread each call of the Wrapper starts and stops in
  its shutdown, after a termination barrier. When the ranks of a lost node never reach that barrier,
  the barrier raises first, the thread is never stopped, and the interpreter waits for it at exit for
  ever: after a node loss the surviving ranks left the wrapper (RestartAbort) but their processes never
  ended, so their launcher never restarted them and the job hung. `stop_progress_watchdog` stops the
  thread once the Wrapper has returned or raised (a no-op when NVRx stopped it itself).
- A replacement pod whose predecessor trained in the newest round: in NVRx's barrier rendezvous only a
  launcher that saw its workers fail opens the next round; a new agent waits for it. When every active
  node was lost at once (a node and its only partner), no launcher is left to open it, the control
  process keeps the round "closed, training in progress", and the replacement pods waited until their
  join timeout (tests/localrun/test_localrun_node_loss.py). `open_round_for_lost_predecessor` runs in a
  pod's launcher before its agent joins: if the newest closed round made this pod's index active, the
  node that trained there is gone for good (the Job replaces a pod only once the old one has ended),
  so it opens the next round, as a surviving launcher would. With survivors it is a no-op: they
  open it themselves, and `open_rendezvous` writes the key once.
- The launcher's last words. ft_launcher out of restarts logs its failed workers as one line holding
  each ProcessFailure's repr, Python call stacks included; the kubelet keeps only the last 2,048 bytes
  of a failed pod's log as its termination message, so the rank that was SIGKILLed (a short entry,
  first) was cut and the job's failure reason named a collateral rank's gloo error.
  `capture_worker_failures` keeps the failures `launch_agent` raised, and training/resilience/launch.py prints
  them last, one short entry per rank, in the same `rank: ProcessFailure(...)` form k8s/termination.py
  reads.
- Which workers failed. torch's process context for function entrypoints (`MultiprocessContext._poll`,
  which ft_launcher's monitor calls) reports one failed worker per poll: the first dead one in local
  rank order. A SIGKILLed rank's node-mates die of their own collective error (exit 1) within a moment,
  and when both are dead at the poll, local rank 0's error is all the launcher reports: the job's
  failure reason named a collateral rank (1 run in 2 in the storm test of
  tests/training/test_training_pods.py). `report_every_failed_worker` adds every other worker of the
  node that has exited non-zero by then, so the SIGKILL is among the failures the pod reports. Workers
  torch stopped itself while cleaning up exit by SIGTERM, which k8s/termination.py reads as collateral.
- How fast a restart round forms. NVRx's barrier rendezvous polls with hard-coded floors sized for
  thousands of nodes: a node waiting for a round to open sleeps 1 s per poll and looks for a newer round
  only every 10 s (`_wait_for_rendezvous_open`, `stale_check_interval`), and the control process checks
  whether a round can close at most once a second below 2,000 nodes (`_compute_step2_poll_interval`).
  Every restart paid them: a failed node entering the wait with its round already open slept 1 s
  before seeing it, the round closed up to 1 s after its last node joined, and a hot spare took up to
  10 s to notice the round a node loss opened. `poll_rendezvous_faster` polls at `RENDEZVOUS_POLL_S`
  (0.1 s) in both places and looks for a newer round at each poll, and keeps NVRx's own scaling for
  large jobs (the close check's interval grows with the node count exactly as NVRx's does once that
  exceeds the floor). The store's load per waiting node is a few key reads per poll.
- Which lost nodes a restart round waits for. With hot spares, NVRx's control process holds a restart
  round open `last_call_timeout` for every node active in the previous round before a spare may take
  its place (`_PreviousActiveLastCallGate`): right for a node that is restarting its workers (a SIGKILL
  round keeps its nodes), pure waiting for a node that is gone. A node loss whose replacement pod was
  still pending took 10.3 s here, 5 s of it this wait for a launcher that had died with its node.
  Each launcher now adds a wall-clock beat to the store every `LAUNCHER_BEAT_S` (`LauncherBeat`), and
  `wait_only_for_live_previous_actives` makes the gate stop waiting for a previous active node whose
  launcher's last beat is older than `LAUNCHER_GONE_S`: its launcher is not running, so it cannot
  rejoin this round. A node that never beat (an older launcher), or whose training ended
  (`LAUNCHER_DONE`), is waited for as NVRx would. The beat is a wall-clock time: EKS nodes keep their
  clocks within milliseconds (Amazon Time Sync); a node whose clock runs seconds behind would look
  gone and lose its place to a spare, which costs a restore from a partner, never data.
- Who notices a lost node. In NVRx only a launcher whose own workers failed opens a restart round, so
  the survivors of a node that vanished (no process left on it to report anything) restart only once
  their workers fail: after their collective errors or times out (the NCCL timeout, or the in-process
  soft timeout for a hang), then the in-process restart's wait for the lost ranks' heartbeats (3 s
  here, 6 s by default). A node loss took 6.9 s here, 2.9 s of it that wait. With the beats, each
  active node's launcher also watches the next active node's beat (`LostPeerWatch`, a few reads per
  beat whatever the job's size; every active node is watched by one other) and opens the next round
  once it is older than `LAUNCHER_GONE_S`; every launcher polls for an opened round and restarts its
  workers into it, as when a peer's workers failed. The same evidence and threshold as the gate's, so
  a node the gate would not wait for is the node the watch restarts the job without. A launcher judges
  only after its own beats went out on time for that long (`SteadyBeats`): a stalled store or a
  starved launcher delays every beat alike, its own included. A launcher whose workers finished says
  so in its last beat: a node that ends training before its peers is not lost.
- The launcher's first traceback. torch's log formatter (`TorchLogsFormatter.format`, the handler of
  every `torch.*` logger) imports `torch._dynamo` to read one flag whenever a record carries an
  exception, and the launcher logs one for the first worker failure it sees (`MultiprocessContext._poll`
  logs each failed worker with `logger.exception`). The launcher itself never imports torch._dynamo
  (only the forkserver preloads it), so every launcher paid that import -- torch._dynamo, sympy, the
  FX symbolic shapes: 1.6-2.6 s of CPU here -- between a worker's death and its restart, on every hard
  fault (a SIGKILL's restart waited 2.6 s on it under load). `format_tracebacks_without_dynamo` renders
  the traceback with logging's own formatter first and hands torch's formatter the record without the
  exception object, which then appends the same text; only the `graph_breaks` artifact, a compiler
  log the launcher never writes, still goes to torch's formatter unchanged.
- A lost in-process store. The in-process Wrapper's store is a TCPStore its rank 0 hosts. When rank
  0's node is lost, each survivor's monitor thread -- the one that interrupts the main thread for a
  restart -- dies of the store's DistNetworkError (its loop catches only DistStoreError), while the main
  thread, after its collective failed, spins until that thread interrupts it (`spin_till_paused`): for
  ever. Only ft_launcher's heartbeat timeout ended it: 30 s with that timeout at 30 s, 120 s or more
  with the p5 values, and with a warm spare standing by nothing else opens the next round. Nothing can
  restart this rank in process without that store, which lives for one launcher round;
  `on_monitor_thread_death` calls back when a monitor thread dies of an exception it was not stopped
  for, and the in-process layer then ends the process, so its launcher restarts the node's workers at
  once (training/resilience/layers.py).
- When the in-process store's clients connect. Rank 0 hosts the Wrapper's TCPStore, and every rank of a
  new launcher round builds it at about the same moment; a client that comes before its host is
  refused, and torch's client retries only after a randomised backoff: each restart's in-process
  store took 0.4-0.8 s to form here (rank 0's own construction waits for every client), the longest
  part of a SIGKILL's recovery once the workers forked warm. `host_first_store` is NVRx's TCPStore
  whose clients first wait until the host's port accepts connections (training/parallel.py
  `wait_until_listening`); the host itself, and rank 0's monitor process (which NVRx makes a client
  when the host's port is taken), are unchanged.
- Who holds a rank's connection to its launcher. A rank's RankMonitorClient keeps one Unix socket to
  its launcher's rank monitor, and the monitor serves one connection per local rank at a time: a new
  worker's waits (up to 180 s) until the previous one is closed. The in-process Wrapper forks its
  monitor process from the rank after the client connected, so that process held a copy of the
  socket, and it outlives a rank the launcher stopped: after a node loss it waits at the in-process
  barriers for ranks that will never come. The connection stayed open, the restarted worker hung in
  its start for 120 s until the launcher gave up on it, and the job lost its survivors' places (1 run
  in 13 of the warm-spare node-loss test, once the launcher's watch stopped the survivors during
  their in-process recovery). `close_rank_monitor_socket_in_forks` closes the child's copy in every
  process forked from a rank; the rank's own stays open.
- The straggler detector's CUPTI extension (`nvrx_cupti_module`) is a compiled, GPU-only module; the
  image (Python 3.12) has it, a local install (tools/nvrx-wheel.sh) does not. Nothing in the kit uses
  the straggler detector; the self-check reports whether the extension loads.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.util
import inspect
import os
import threading
import time
from datetime import timedelta
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

from packaging.version import Version

from nvrx_eks.kitcore.pins import NVRX_SUPPORTED_SINCE
from nvrx_eks.training.forks import close_in_forks

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch.distributed.elastic.multiprocessing.api import MultiprocessContext

NVRX_VERSION = version("nvidia-resiliency-ext")


def check_supported_nvrx(installed: str = NVRX_VERSION) -> None:
    """Exit with one clear message when the installed NVRx is older than the kit supports."""
    if Version(installed) < Version(NVRX_SUPPORTED_SINCE):
        raise SystemExit(
            f"nvidia-resiliency-ext {installed} is installed; the kit needs {NVRX_SUPPORTED_SINCE} or newer "
            "(the image's pin, kitcore/pins.py): rebuild the image, or run `make setup` for local runs"
        )


def require_internal(owner: Any, name: str, parameters: tuple[str, ...]) -> Any:  # noqa: ANN401
    """`owner.name`, checked to be a callable taking `parameters` in that order; else a clear error."""
    target = getattr(owner, name, None)
    found = tuple(inspect.signature(target).parameters) if callable(target) else None
    if found is None or found[: len(parameters)] != parameters:
        raise RuntimeError(
            f"NVRx {NVRX_VERSION}: {getattr(owner, '__name__', owner)}.{name} is not the expected "
            f"{name}{parameters} (found {found}); "
            "check training/resilience/nvrx_compat.py against this release"
        )
    return target


SET_TIMEOUTS = ("_set_calculated_timeouts", ("self", "new_hb_timeouts", "new_section_timeouts"))
"""RankMonitorClient's private setter of calculated heartbeat/section timeouts."""
ORPHAN_CLEANUP = ("terminate_mp_processes", ("allowed_pgids",))
"""ft_launcher's module-level orphan cleanup (imported there from fault_tolerance.utils)."""


RANK_ORDER = (
    "_sort_rankable_participants",
    ("self", "active_candidate_participants", "standby_only_participants"),
)
"""The barrier rendezvous state's ordering of a round's participants, (node, infra rank, domain, group)."""
BARRIER_STATE_READS = (
    ("__init__", ("self", "store", "run_id")),
    ("_sync_from_per_round_state", ("self",)),
    ("_unpack_participant_value", ("value",)),
    ("_unpack_rank_value", ("value",)),
    ("open_rendezvous", ("self",)),
    ("is_shutdown", ("self",)),
)
"""What `open_round_for_lost_predecessor` calls on the barrier rendezvous state (its slot format)."""
PREVIOUS_ACTIVES = "_previous_active_by_infra_rank"
"""The state's record of the previous round's active nodes: {infra rank: replacement group} or None."""
_NOT_PREVIOUSLY_ACTIVE = 10**12
"""Added to the infra rank of a node that was not active in the previous round: beyond any pod index."""


LAST_CALL_GATE = ("_make_previous_active_last_call_gate", ("self", "min_nodes", "max_nodes"))
"""The barrier state's factory of the restart round's last-call gate (the control process's)."""
GATE_PREVIOUS_ACTIVES = "_previous_active_by_infra_rank"
"""The gate's own copy of the previous round's active nodes: {infra rank: replacement group}."""
LAUNCHER_BEAT_S = 0.5
"""How often each launcher writes its beat (the wall-clock time) to the rendezvous store."""
BEAT_CONNECT_S = 2.0
"""How long the beat waits to connect to the store before it tries again."""
LAUNCHER_GONE_S = 2.0
"""A previous active node whose launcher's beat is older than this is not waited for: four beats missed."""


def check_internals() -> None:
    """Every private NVRx name this module uses has the expected shape (tests call it; so may tools)."""
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient, launcher  # noqa: PLC0415

    require_internal(RankMonitorClient, *SET_TIMEOUTS)
    require_internal(launcher, *ORPHAN_CLEANUP)
    require_internal(launcher, *LAUNCH_AGENT)
    require_internal(_multiprocess_context(), *WORKER_POLL)
    require_internal(_barrier_state(), *RANK_ORDER)
    require_internal(_barrier_state(), *STALE_CHECK)
    require_internal(_barrier_state(), *STEP2_POLL)
    require_internal(_barrier_state(), *LAST_CALL_GATE)
    if not _step0_source_matches():
        raise RuntimeError(f"NVRx {NVRX_VERSION}: _wait_for_rendezvous_open's 1 s polls changed")
    for name, parameters in BARRIER_STATE_READS:
        require_internal(_barrier_state(), name, parameters)
    from nvidia_resiliency_ext import inprocess  # noqa: PLC0415

    require_internal(inprocess.Wrapper, *RESTART_HEALTH_CHECKS)
    _monitor_thread_type()
    host_first_store()


MONITOR_THREAD_STOPPED = "stop_loop"
"""The in-process monitor thread's event that the Wrapper sets when it stops the thread on purpose."""


def _monitor_thread_type() -> Any:  # noqa: ANN401 - NVRx's class: NVRx ships no types
    from nvidia_resiliency_ext.inprocess.monitor_thread import MonitorThread  # noqa: PLC0415

    source = inspect.getsource(MonitorThread)
    if f"self.{MONITOR_THREAD_STOPPED} = threading.Event()" not in source:
        raise RuntimeError(
            f"NVRx {NVRX_VERSION}: inprocess MonitorThread has no {MONITOR_THREAD_STOPPED} event; "
            "check training/resilience/nvrx_compat.py against this release"
        )
    return MonitorThread


def on_monitor_thread_death(callback: Callable[[BaseException | None], None]) -> None:
    """Call `callback(exception)` in the dying thread when an in-process monitor thread ends with an
    exception while its Wrapper had not asked it to stop (see the module docstring), after the usual
    traceback is printed. Other threads' exceptions go to the previous hook unchanged."""
    monitor_thread = _monitor_thread_type()
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        previous(args)
        thread = args.thread
        if isinstance(thread, monitor_thread) and not getattr(thread, MONITOR_THREAD_STOPPED).is_set():
            callback(args.exc_value)

    threading.excepthook = hook


RESTART_HEALTH_CHECKS = ("_construct_restart_health_check", ("self",))
"""inprocess.Wrapper's own restart health checks, chained from LOCAL_RANK when it is built."""


def inprocess_wrapper(*, gpu: bool, **kwargs: Any) -> Any:  # noqa: ANN401
    """`inprocess.Wrapper(**kwargs)`; without GPUs, built with LOCAL_RANK hidden (see the docstring)."""
    from nvidia_resiliency_ext import inprocess  # noqa: PLC0415 - heavy import, only in NVRx modes

    if gpu:
        return inprocess.Wrapper(**kwargs)
    require_internal(inprocess.Wrapper, *RESTART_HEALTH_CHECKS)
    local_rank = os.environ.pop("LOCAL_RANK", None)
    try:
        return inprocess.Wrapper(**kwargs)
    finally:
        if local_rank is not None:
            os.environ["LOCAL_RANK"] = local_rank


STORE_HOST_RANK = "TCP_STORE_HOST_RANK"
"""The rank whose process hosts NVRx's in-process TCPStore (a class attribute of inprocess.store.TCPStore)."""


def host_first_store() -> type:
    """NVRx's in-process TCPStore, whose clients wait until the host listens (see the module docstring);
    the Wrapper's `store_factory`."""
    from nvidia_resiliency_ext.inprocess.store import TCPStore  # noqa: PLC0415

    host_rank = getattr(TCPStore, STORE_HOST_RANK, None)
    if not isinstance(host_rank, int):
        raise RuntimeError(  # noqa: TRY004 - a changed NVRx, reported like every other changed internal
            f"NVRx {NVRX_VERSION}: inprocess.store.TCPStore has no integer {STORE_HOST_RANK}; "
            "check training/resilience/nvrx_compat.py against this release"
        )
    require_internal(TCPStore, "__init__", ("self", "host_name", "port", "world_size", "timeout"))
    from nvrx_eks.training.parallel import wait_until_listening  # noqa: PLC0415

    class HostFirstTCPStore(TCPStore):  # type: ignore[misc]  # NVRx ships no types: its TCPStore is Any
        def __init__(
            self,
            host_name: str | None = None,
            port: int | None = None,
            world_size: int | None = None,
            timeout: timedelta = timedelta(seconds=300),
            **kwargs: Any,  # noqa: ANN401
        ) -> None:
            if int(os.environ["RANK"]) != host_rank:
                wait_until_listening(
                    host_name or os.environ["MASTER_ADDR"],
                    port or int(os.environ["MASTER_PORT"]),
                    timeout.total_seconds(),
                )
            super().__init__(host_name, port, world_size, timeout, **kwargs)

    return HostFirstTCPStore


RANK_MONITOR_SOCKET = "rank_monitor_socket"
"""RankMonitorClient's connection to its launcher's rank monitor (a socket object, None when closed)."""


def close_rank_monitor_socket_in_forks(client: Any) -> None:  # noqa: ANN401 - a RankMonitorClient
    """In every process forked from this one from now on, close that process's copy of `client`'s
    connection to the launcher (see the module docstring; training/forks.py)."""
    if not hasattr(client, RANK_MONITOR_SOCKET):
        raise RuntimeError(
            f"NVRx {NVRX_VERSION}: RankMonitorClient has no {RANK_MONITOR_SOCKET}; "
            "check training/resilience/nvrx_compat.py against this release"
        )
    close_in_forks(lambda: getattr(client, RANK_MONITOR_SOCKET, None))


def stop_progress_watchdog(call_wrapper: Any) -> None:  # noqa: ANN401
    """Stop the Wrapper's progress watchdog thread if NVRx left it running (see the module docstring)."""
    watchdog = getattr(call_wrapper, "progress_watchdog", None)
    if watchdog is not None and watchdog.is_alive():
        watchdog.shutdown()


def _training_round(state: Any) -> int | None:  # noqa: ANN401 - NVRx's barrier state
    """The round the job trains in now: the newest closed one, when the next is not open yet."""
    if state.is_shutdown():
        return None
    state._sync_from_per_round_state()  # noqa: SLF001 - the first round that is not closed
    closed: int = state._round - 1  # noqa: SLF001
    if closed < 0 or state.store.check([f"{state.prefix}:round_done_{closed + 1}"]):
        return None  # no round closed yet, or the next one is open already
    return closed


def _active_in_round(state: Any, round_id: int, active_nodes: int) -> dict[int, int]:  # noqa: ANN401
    """{node rank: infra rank} of the nodes active in `round_id`, read from the round's slots."""
    state_type, store, prefix = type(state), state.store, state.prefix
    active: dict[int, int] = {}
    slot = 1
    while store.check([f"{prefix}:slot_{slot}"]) and store.check([f"{prefix}:slot_{slot}_rank"]):
        participant, ranked = store.get(f"{prefix}:slot_{slot}"), store.get(f"{prefix}:slot_{slot}_rank")
        joined_round, _, infra, _, _ = state_type._unpack_participant_value(participant)  # noqa: SLF001
        rank, _, ranked_round = state_type._unpack_rank_value(ranked)  # noqa: SLF001
        if joined_round == ranked_round == round_id and 0 <= rank < active_nodes:
            active[rank] = infra
        slot += 1
    return active


def _open_after(state: Any, round_id: int) -> int:  # noqa: ANN401
    state._round = round_id  # noqa: SLF001
    state.open_rendezvous()
    return round_id + 1


def open_round_for_lost_predecessor(
    store: Any,  # noqa: ANN401 - a torch.distributed Store
    *,
    run_id: str,
    infra_rank: int,
    active_nodes: int,
) -> int | None:
    """Open the round after the newest closed one if this pod's index was active in it (see the module
    docstring); returns the round opened, or None when there was nothing to open."""
    state = _barrier_state()(store=store, run_id=run_id)
    closed = _training_round(state)
    if closed is None or infra_rank not in _active_in_round(state, closed, active_nodes).values():
        return None
    return _open_after(state, closed)


class LostPeerWatch:
    """Opens the next restart round as soon as the active node this launcher watches has lost its
    launcher (see the module docstring): the next active node in node-rank order, wrapping, so each
    active node is watched by one other, and each beat costs a few store reads at any job size (the
    round's slots are read once per round)."""

    def __init__(self, store: Any, *, run_id: str, infra_rank: int, active_nodes: int) -> None:  # noqa: ANN401
        self.state = _barrier_state()(store=store, run_id=run_id)
        self.infra_rank = infra_rank
        self.active_nodes = active_nodes
        self._watched: tuple[int, int | None] | None = None  # (round, watched infra rank) once read

    def check(self, gone_s: float = LAUNCHER_GONE_S) -> tuple[int, int, float] | None:
        """Open the next round if the watched node's launcher beat is older than `gone_s`; returns
        (round opened, the lost node's infra rank, its beat's age), or None."""
        training = _training_round(self.state)
        if training is None:
            return None
        if self._watched is None or self._watched[0] != training:
            self._watched = (training, self._next_active(training))
        watched = self._watched[1]
        if watched is None:
            return None
        age = launcher_beat_age(self.state.store, self.state.prefix, watched)
        if age is None or age <= gone_s:
            return None
        return _open_after(self.state, training), watched, age

    def _next_active(self, round_id: int) -> int | None:
        active = _active_in_round(self.state, round_id, self.active_nodes)
        ranks = sorted(active)
        mine = [rank for rank in ranks if active[rank] == self.infra_rank]
        if not mine or len(ranks) == 1:
            return None  # a spare, or nothing to watch
        return active[ranks[(ranks.index(mine[0]) + 1) % len(ranks)]]


LAUNCH_AGENT = ("launch_agent", ("config", "entrypoint", "args"))
"""ft_launcher's module-level call that runs the agent and raises ChildFailedError when workers failed."""


def capture_worker_failures() -> dict[int, Any]:
    """Keep the failures ft_launcher's `launch_agent` raises (global rank -> ProcessFailure) in the returned
    dict, which fills only when the workers failed (see the module docstring)."""
    from nvidia_resiliency_ext.fault_tolerance import launcher  # noqa: PLC0415
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError  # noqa: PLC0415

    launch = require_internal(launcher, *LAUNCH_AGENT)
    failures: dict[int, Any] = {}

    @functools.wraps(launch)  # keeps the signature `require_internal` checks
    def launch_agent(*args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
        try:
            return launch(*args, **kwargs)
        except ChildFailedError as exc:
            failures.update(exc.failures)
            raise

    launcher.launch_agent = launch_agent
    return failures


WORKER_POLL = ("_poll", ("self",))
"""torch's MultiprocessContext poll of its worker processes: one failure per call."""


def _multiprocess_context() -> type[MultiprocessContext]:
    from torch.distributed.elastic.multiprocessing.api import MultiprocessContext  # noqa: PLC0415

    return MultiprocessContext


def report_every_failed_worker() -> None:
    """Report every worker of the node that exited non-zero, not only the first (see the module docstring)."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure  # noqa: PLC0415

    context = _multiprocess_context()
    poll = require_internal(context, *WORKER_POLL)
    if getattr(poll, "nvrx_eks_every_failure", False):
        return

    @functools.wraps(poll)  # keeps the signature `require_internal` checks
    def _poll(self: Any) -> Any:  # noqa: ANN401
        result = poll(self)
        processes = getattr(getattr(self, "_pc", None), "processes", None)
        if result is None or not result.failures or not processes:
            return result
        for local_rank, process in enumerate(processes):
            if local_rank in result.failures or process.exitcode in {None, 0}:
                continue
            result.failures[local_rank] = ProcessFailure(
                local_rank=local_rank,
                pid=process.pid,
                exitcode=process.exitcode,
                error_file=self.error_files[local_rank],
            )
        return result

    _poll.nvrx_eks_every_failure = True  # type: ignore[attr-defined]
    context._poll = _poll  # type: ignore[method-assign]  # noqa: SLF001 - torch's method, patched in place


USER_ERROR_REASON = "user_error"
"""Why a job ends without a restart when a rank exited with the configuration error's exit code: its
input or its script is wrong, the same way on every restart."""
RESTART_DECISION = ("_handle_restart_decision", ("self", "role", "spec", "log_msg", "open_rendezvous"))
"""ft_launcher's agent: restart the workers or give up, once a worker failed or a peer opened a round."""
NO_RESTART_REASONS = "RDZV_NO_RESTART_REASONS"
"""The barrier rendezvous' set of shutdown reasons every launcher reads as "end the job, no restart"."""


USER_ERROR_LINE = "local rank {rank} exited {code}: {message}"
"""How the launcher names a rank's bad input or bug on its way out (k8s/termination.py reads it)."""


def user_error_line(failure: Any, exit_code: int) -> str:  # noqa: ANN401 - torch's ProcessFailure
    """The rank and the first line of its error (torch elastic's error file, which training/api.py
    writes), or a pointer to its log."""
    message = failure.message.get("message", "") if isinstance(failure.message, dict) else failure.message
    first = str(message).strip().splitlines()[0][:300] if str(message).strip() else "see the rank's log"
    return USER_ERROR_LINE.format(rank=failure.local_rank, code=exit_code, message=first)


def stop_on_user_error(exit_code: int) -> None:
    """A rank that exits `exit_code` (bad input, or the same bug twice: training/api.py `UserCodeError`)
    ends the job at once, on every node, through NVRx's own no-restart path, instead of restarting into
    the same failure until the launcher's and then the Job's budgets are spent.

    The node whose rank failed broadcasts the reason (`signal_no_restart`) and raises NVRx's
    NoRestartRequested; every launcher then exits NVRx's no-restart code, which the Job's
    podFailurePolicy turns into a failed job (k8s/job_chart.py). The reason must be one the barrier
    rendezvous reports to peers, so it joins that set."""
    from nvidia_resiliency_ext.fault_tolerance import ft_rendezvous_barrier, launcher  # noqa: PLC0415

    reasons = getattr(ft_rendezvous_barrier, NO_RESTART_REASONS, None)
    if not isinstance(reasons, frozenset):
        raise TypeError(
            f"NVRx {NVRX_VERSION}: ft_rendezvous_barrier.{NO_RESTART_REASONS} is not a frozenset; check "
            "training/resilience/nvrx_compat.py against this release"
        )
    setattr(ft_rendezvous_barrier, NO_RESTART_REASONS, reasons | {USER_ERROR_REASON})
    agent = launcher.LocalElasticAgent
    decide = require_internal(agent, *RESTART_DECISION)
    if getattr(decide, "nvrx_eks_user_error", False):
        return
    context = _multiprocess_context()
    poll = require_internal(context, *WORKER_POLL)
    failed: dict[int, Any] = {}  # exit code -> the first failure with it

    @functools.wraps(poll)  # keeps the signature `require_internal` checks
    def _poll(self: Any) -> Any:  # noqa: ANN401
        result = poll(self)
        if result is not None and result.failures:
            for failure in result.failures.values():
                failed.setdefault(failure.exitcode, failure)
        return result

    @functools.wraps(decide)
    def _handle_restart_decision(
        self: Any,  # noqa: ANN401
        role: str,
        spec: Any,  # noqa: ANN401
        log_msg: str,
        open_rendezvous: bool = False,
    ) -> Any:  # noqa: ANN401
        failure = failed.get(exit_code)
        if failure is not None:
            self._rdzv_handler.signal_no_restart(USER_ERROR_REASON)
            self._stop_workers(self._worker_group)
            # The launcher's last line, so the pod's termination message names the rank's own error.
            raise launcher.NoRestartRequested(USER_ERROR_REASON, user_error_line(failure, exit_code))
        return decide(self, role, spec, log_msg, open_rendezvous=open_rendezvous)

    _poll.nvrx_eks_every_failure = getattr(poll, "nvrx_eks_every_failure", False)  # type: ignore[attr-defined]
    _handle_restart_decision.nvrx_eks_user_error = True  # type: ignore[attr-defined]
    context._poll = _poll  # type: ignore[method-assign]  # noqa: SLF001 - torch's method, patched in place
    agent._handle_restart_decision = _handle_restart_decision  # noqa: SLF001


RENDEZVOUS_POLL_S = 0.1
"""The barrier rendezvous's poll while a node waits for a round to open and while a round closes."""
STEP0_SLEEPS = 2
"""`time.sleep(1.0)` calls in `_wait_for_rendezvous_open`: the poll `poll_rendezvous_faster` shortens."""
STEP2_POLL = ("_compute_step2_poll_interval", ("min_nodes", "segment_check_interval"))
"""The control process's interval between checks whether a round can close."""
STALE_CHECK = ("__init__", ("self", "store", "run_id", "is_store_host", "join_timeout_seconds"))
"""The barrier state's constructor: `stale_check_interval` is set there (a keyword NVRx passes as 10 s)."""


def _step0_source_matches() -> bool:
    source = inspect.getsource(_barrier_state()._wait_for_rendezvous_open)  # noqa: SLF001
    return source.count("time.sleep(1.0)") == STEP0_SLEEPS


def poll_rendezvous_faster(poll_s: float = RENDEZVOUS_POLL_S) -> None:
    """The barrier rendezvous polls every `poll_s` where NVRx polls every 1 s (see the module docstring)."""
    import time  # noqa: PLC0415

    from nvidia_resiliency_ext.fault_tolerance import ft_rendezvous_barrier as barrier  # noqa: PLC0415

    state = _barrier_state()
    init = require_internal(state, *STALE_CHECK)
    step2 = require_internal(state, *STEP2_POLL)
    if getattr(init, "nvrx_eks_fast_poll", False):
        return
    if barrier.time is not time or not _step0_source_matches():
        raise RuntimeError(
            f"NVRx {NVRX_VERSION}: _wait_for_rendezvous_open no longer polls with time.sleep(1.0); "
            "check training/resilience/nvrx_compat.py against this release"
        )

    class _StepZeroTime:
        """The module's `time`, with its 1 s polls (its only sleeps over 0.1 s) cut to `poll_s`."""

        def __getattr__(self, name: str) -> Any:  # noqa: ANN401
            return getattr(time, name)

        @staticmethod
        def sleep(seconds: float) -> None:
            time.sleep(min(seconds, poll_s))

    @functools.wraps(init)  # keeps the signature `require_internal` checks
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: ANN401, N807
        init(self, *args, **kwargs)
        self.stale_check_interval = min(self.stale_check_interval, poll_s)

    @functools.wraps(step2)  # keeps the signature `require_internal` checks
    def _compute_step2_poll_interval(min_nodes: int, segment_check_interval: float) -> float:
        interval: float = min(step2(min_nodes, segment_check_interval), max(poll_s, min_nodes / 2000.0))
        return interval

    __init__.nvrx_eks_fast_poll = True  # type: ignore[attr-defined]
    barrier.time = _StepZeroTime()
    state.__init__ = __init__
    state._compute_step2_poll_interval = staticmethod(_compute_step2_poll_interval)  # noqa: SLF001


def _barrier_state() -> Any:  # noqa: ANN401 - NVRx's class: NVRx ships no types
    from nvidia_resiliency_ext.fault_tolerance.ft_rendezvous_barrier import (  # noqa: PLC0415
        _RendezvousBarrierState,
    )

    return _RendezvousBarrierState


def keep_previous_actives_first() -> None:
    """Rank the previous round's active nodes before every other node (see the module docstring)."""
    state = _barrier_state()
    order = require_internal(state, *RANK_ORDER)
    if getattr(order, "nvrx_eks_previous_first", False):
        return

    @functools.wraps(order)  # keeps the signature `require_internal` checks
    def _sort_rankable_participants(self: Any, active: list[Any], standby: list[Any]) -> Any:  # noqa: ANN401
        active, standby = order(self, active, standby)
        previous = getattr(self, PREVIOUS_ACTIVES, None)
        if not previous:  # the first round, or NVRx found the identities unstable: its own order
            return active, standby
        # Only the ordering key changes; NVRx records membership from its own, unchanged lists.
        return [
            (node, infra if infra in previous else infra + _NOT_PREVIOUSLY_ACTIVE, *rest)
            for node, infra, *rest in active
        ], standby

    _sort_rankable_participants.nvrx_eks_previous_first = True  # type: ignore[attr-defined]
    state._sort_rankable_participants = _sort_rankable_participants  # noqa: SLF001


def set_heartbeat_timeouts(client: Any, *, initial: float, subsequent: float) -> None:  # noqa: ANN401
    """Install heartbeat timeouts as if calculated (so `state_dict` persists them)."""
    from nvidia_resiliency_ext.fault_tolerance.data import HeartbeatTimeouts  # noqa: PLC0415

    setter = require_internal(type(client), *SET_TIMEOUTS)
    timeouts = HeartbeatTimeouts(initial=initial, subsequent=subsequent, were_calculated=True)
    setter(client, new_hb_timeouts=timeouts, new_section_timeouts=None)


def keep_launcher_process_group() -> None:
    """ft_launcher's orphan cleanup without the launcher's own process group (see the module docstring)."""
    from nvidia_resiliency_ext.fault_tolerance import launcher  # noqa: PLC0415

    cleanup = require_internal(launcher, *ORPHAN_CLEANUP)
    if getattr(cleanup, "nvrx_eks_keeps_launcher", False):
        return

    @functools.wraps(cleanup)  # keeps the signature `require_internal` checks
    def terminate_mp_processes(allowed_pgids: set[int]) -> None:
        others = {pgid for pgid in allowed_pgids if pgid != os.getpgrp()}
        if others:  # NVRx's cleanup sleeps 1 s between its SIGTERM and SIGKILL, with or without a group
            cleanup(allowed_pgids=others)

    terminate_mp_processes.nvrx_eks_keeps_launcher = True  # type: ignore[attr-defined]
    launcher.terminate_mp_processes = terminate_mp_processes


def straggler_extension_available() -> bool:
    """Whether NVRx's compiled CUPTI straggler extension can be imported here (GPU images only)."""
    return importlib.util.find_spec("nvrx_cupti_module") is not None


def format_tracebacks_without_dynamo() -> None:
    """torch's log formatter renders tracebacks without importing torch._dynamo (see the module docstring).
    A no-op once torch's formatter no longer imports it."""
    import logging  # noqa: PLC0415

    from torch._logging._internal import TorchLogsFormatter  # noqa: PLC0415

    fmt: Callable[[Any, logging.LogRecord], str] = TorchLogsFormatter.format
    if getattr(fmt, "nvrx_eks_plain_tracebacks", False) or not formatter_imports_dynamo():
        return
    plain = logging.Formatter()

    @functools.wraps(fmt)
    def format(self: Any, record: logging.LogRecord) -> str:  # noqa: A001, ANN401
        exc_info = record.exc_info
        artifact = getattr(logging.getLogger(record.name), "artifact_name", None)
        if not exc_info or artifact == "graph_breaks":
            return fmt(self, record)
        record.exc_text = record.exc_text or plain.formatException(exc_info)
        record.exc_info = None
        try:
            return fmt(self, record)
        finally:
            record.exc_info = exc_info

    format.nvrx_eks_plain_tracebacks = True  # type: ignore[attr-defined]
    TorchLogsFormatter.format = format  # type: ignore[method-assign]  # torch's method, patched in place


def formatter_imports_dynamo() -> bool:
    """Whether the installed torch's log formatter imports torch._dynamo to format an exception."""
    from torch._logging._internal import TorchLogsFormatter  # noqa: PLC0415

    return "from torch._dynamo import" in inspect.getsource(TorchLogsFormatter.format)


def launcher_beat_key(prefix: str, infra_rank: int) -> str:
    """The store key of the beat of the launcher with `infra_rank`, under the barrier state's `prefix`."""
    return f"{prefix}:nvrx_eks_launcher_beat_{infra_rank}"


LAUNCHER_DONE = b"done"
"""A launcher's last beat once its node's training ended: it stopped for good, and no node is lost."""


class SteadyBeats:
    """Whether this launcher's own beats have gone out on time for the last `gone_s`: only then may it
    read a peer's old beat as that peer's loss. A store that stalled, or a launcher starved of CPU,
    delays every beat alike (its own included), and for a moment after, every peer's looks old."""

    def __init__(self, *, every_s: float, gone_s: float = LAUNCHER_GONE_S) -> None:
        self.every_s, self.gone_s = every_s, gone_s
        self._since: float | None = None
        self._last = 0.0

    def wrote(self, now: float) -> bool:
        """A beat went out at `now`; returns whether the beats have been steady for `gone_s`."""
        if self._since is None or now - self._last > 2 * self.every_s:
            self._since = now
        self._last = now
        return now - self._since >= self.gone_s

    def broke(self) -> None:
        """A beat could not be written."""
        self._since = None


class LauncherBeat:
    """This launcher's beat in the rendezvous store, and its watch over one peer (see the module
    docstring): a daemon thread that writes the wall-clock time every `every_s` while the launcher
    lives and, when `active_nodes` is given, runs `LostPeerWatch` after each beat once its own beats
    have been steady for `LAUNCHER_GONE_S` (`SteadyBeats`). Store errors only skip beats. `finish`
    ends it; at interpreter exit it ends by itself. Either way it drops its store client first: a
    TCPStore still held by a thread when the interpreter ends aborts the process, which would turn the
    launcher's exit status (what the Job's pod failure policy reads) into a SIGABRT."""

    def __init__(
        self,
        endpoint: str,
        *,
        run_id: str,
        infra_rank: int,
        active_nodes: int | None = None,
        every_s: float = LAUNCHER_BEAT_S,
    ) -> None:
        self.endpoint, self.run_id, self.infra_rank = endpoint, run_id, infra_rank
        self.active_nodes, self.every_s = active_nodes, every_s
        self._stop = threading.Event()
        self._done = False
        self.thread = threading.Thread(target=self._run, name="launcher-beat", daemon=True)

    def start(self) -> LauncherBeat:
        self.thread.start()
        atexit.register(self.finish)
        return self

    def finish(self, *, done: bool = False) -> None:
        """Stop beating; `done`: this node's training ended, so its last beat says so."""
        self._done = self._done or done
        self._stop.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout=BEAT_CONNECT_S + self.every_s)

    def _run(self) -> None:
        from datetime import timedelta  # noqa: PLC0415

        from torch.distributed import TCPStore  # noqa: PLC0415

        host, _, port = self.endpoint.rpartition(":")
        store = watch = None
        key = ""
        steady = SteadyBeats(every_s=self.every_s)
        while not self._stop.is_set():
            try:
                if store is None:
                    store = TCPStore(
                        host, int(port), is_master=False, timeout=timedelta(seconds=BEAT_CONNECT_S)
                    )
                    prefix = _barrier_state()(store=store, run_id=self.run_id).prefix
                    key = launcher_beat_key(prefix, self.infra_rank)
                    if self.active_nodes:
                        watch = LostPeerWatch(
                            store,
                            run_id=self.run_id,
                            infra_rank=self.infra_rank,
                            active_nodes=self.active_nodes,
                        )
                now = time.time()
                store.set(key, repr(now))
                lost = watch.check() if watch is not None and steady.wrote(now) else None
                if lost is not None:
                    opened, infra_rank, age = lost
                    print(
                        f"node with infra rank {infra_rank} lost: its launcher's last beat was {age:.1f} s "
                        f"ago; opened restart round {opened}",
                        flush=True,
                    )
            except Exception:  # noqa: BLE001 - the store may be starting, moving or gone
                store = watch = None
                steady.broke()
            self._stop.wait(self.every_s)
        if self._done and store is not None:
            with contextlib.suppress(Exception):
                store.set(key, LAUNCHER_DONE)  # type: ignore[arg-type]  # torch's stub says str; bytes work
        del store, watch


def wait_only_for_live_previous_actives(gone_s: float = LAUNCHER_GONE_S) -> None:
    """The restart round's last call waits only for previous active nodes whose launcher beats (see the
    module docstring). Runs in the control process, which closes the rounds."""
    state = _barrier_state()
    make = require_internal(state, *LAST_CALL_GATE)
    if getattr(make, "nvrx_eks_live_only", False):
        return

    @functools.wraps(make)  # keeps the signature `require_internal` checks
    def _make_previous_active_last_call_gate(self: Any, min_nodes: int, max_nodes: int) -> Any:  # noqa: ANN401
        gate = make(self, min_nodes, max_nodes)
        previous = getattr(gate, GATE_PREVIOUS_ACTIVES, None)
        if not gate.enabled or previous is None:
            return gate
        evaluate = gate.evaluate

        def evaluate_live(participants: list[Any], now: float, *args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
            present = {participant[1] for participant in participants}
            for infra_rank in [rank for rank in previous if rank not in present]:
                age = launcher_beat_age(self.store, self.prefix, infra_rank)
                if age is not None and age > gone_s:
                    del previous[infra_rank]
                    print(
                        f"restart round: not waiting for infra rank {infra_rank}: its launcher's last beat "
                        f"was {age:.1f} s ago",
                        flush=True,
                    )
            return evaluate(participants, now, *args, **kwargs)

        gate.evaluate = evaluate_live
        return gate

    _make_previous_active_last_call_gate.nvrx_eks_live_only = True  # type: ignore[attr-defined]
    state._make_previous_active_last_call_gate = _make_previous_active_last_call_gate  # noqa: SLF001


def launcher_beat_age(store: Any, prefix: str, infra_rank: int) -> float | None:  # noqa: ANN401
    """Seconds since the launcher with `infra_rank` last beat, or None when it never did or its node's
    training ended (`LAUNCHER_DONE`)."""
    key = launcher_beat_key(prefix, infra_rank)
    if not store.check([key]):
        return None
    value = store.get(key)
    if value == LAUNCHER_DONE:
        return None
    return time.time() - float(value.decode())
