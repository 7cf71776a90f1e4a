"""The kit's patches to NVRx's internals, and to the torch and stdlib internals NVRx runs on.

Everywhere else the kit uses NVRx's public API (inprocess.Wrapper, RankMonitorClient, ft_launcher's and
nvrx-control's command lines); what is private is reached only here, grouped by the process that applies
it:

- control: NVRx's control process, the job's rendezvous store (training/resilience/control.py), which
  closes each restart round and ranks the nodes;
- launcher: ft_launcher on each node (training/resilience/launch.py);
- rank: each training process (training/resilience/layers.py).

docs/nvrx-seam.md has one row per patch: what it replaces, the symptom without it and the NVRx or torch
change that would retire it; tests/training/test_training_nvrx_compat.py fails when that table and this
module disagree. The kit's own launcher-liveness protocol is not a patch: it lives in
launcher_liveness.py, and `wait_only_for_live_previous_actives` is given its reading.

Guards: `check_supported_nvrx` refuses an NVRx older than the image pin's minor release
(kitcore/pins.py). `require_internal` refuses to patch an internal that no longer has the expected
signature, so a changed NVRx is a clear error at start, never a silent no-op; `check_internals` checks
every internal at once, and the tests run it against the installed release. Each patch that replaces an
NVRx or torch attribute marks its replacement and returns when it finds the mark: a second call changes
nothing.
"""

from __future__ import annotations

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

from nvrx_eks.kitcore.lines import say
from nvrx_eks.kitcore.pins import NVRX_SUPPORTED_SINCE
from nvrx_eks.training.forks import close_in_forks

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch.distributed.elastic.multiprocessing.api import MultiprocessContext

    from nvrx_eks.training.resilience.shrink import ShrinkConfig

NVRX_VERSION = version("nvidia-resiliency-ext")


# ----- guards ------------------------------------------------------------------------------------------


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


def check_internals() -> None:
    """Every private NVRx name this module uses has the expected shape (tests call it; so may tools)."""
    from nvidia_resiliency_ext import inprocess  # noqa: PLC0415
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient, launcher  # noqa: PLC0415

    state = _barrier_state()
    for name, parameters in BARRIER_STATE_READS:
        require_internal(state, name, parameters)
    require_internal(state, *RANK_ORDER)
    require_internal(state, *LAST_CALL_GATE)
    require_internal(state, *STALE_CHECK)
    require_internal(state, *STEP2_POLL)
    require_internal(state, *ROUND_CLOSE)
    require_internal(state, *PARTICIPANTS)
    require_internal(state, *ROUND_DONE)
    require_internal(_handler_type(), *HANDLER_RENDEZVOUS)
    if not _step0_source_matches():
        raise RuntimeError(f"NVRx {NVRX_VERSION}: _wait_for_rendezvous_open's 1 s polls changed")
    require_internal(launcher, *ORPHAN_CLEANUP)
    require_internal(launcher, *LAUNCH_AGENT)
    require_internal(_multiprocess_context(), *WORKER_POLL)
    require_internal(RankMonitorClient, *SET_TIMEOUTS)
    require_internal(inprocess.Wrapper, *RESTART_HEALTH_CHECKS)
    require_internal(inprocess.store.StoreMixin, *INITIAL_RANKS)
    _monitor_thread_type()
    host_first_store()


# ----- NVRx's barrier rendezvous state, read and written by the patches below and launcher_liveness.py -


BARRIER_STATE_READS = (
    ("__init__", ("self", "store", "run_id")),
    ("_sync_from_per_round_state", ("self",)),
    ("_unpack_participant_value", ("value",)),
    ("_unpack_rank_value", ("value",)),
    ("open_rendezvous", ("self",)),
    ("is_shutdown", ("self",)),
)
"""What the kit calls on the barrier rendezvous state to read a round's slots and open the next round."""


def _barrier_state() -> Any:  # noqa: ANN401 - NVRx's class: NVRx ships no types
    from nvidia_resiliency_ext.fault_tolerance.ft_rendezvous_barrier import (  # noqa: PLC0415
        _RendezvousBarrierState,
    )

    return _RendezvousBarrierState


def _handler_type() -> Any:  # noqa: ANN401 - NVRx's class
    from nvidia_resiliency_ext.fault_tolerance.ft_rendezvous_barrier import (  # noqa: PLC0415
        FtRendezvousBarrierHandler,
    )

    return FtRendezvousBarrierHandler


def barrier_state(store: Any, *, run_id: str) -> Any:  # noqa: ANN401 - a torch Store; NVRx's state
    """NVRx's barrier rendezvous state of `run_id` over `store`; its `prefix` starts every key of the run."""
    return _barrier_state()(store=store, run_id=run_id)


def training_round(state: Any) -> int | None:  # noqa: ANN401 - NVRx's barrier state
    """The round the job trains in now: the newest closed one, when the next is not open yet."""
    if state.is_shutdown():
        return None
    state._sync_from_per_round_state()  # noqa: SLF001 - the first round that is not closed
    closed: int = state._round - 1  # noqa: SLF001
    if closed < 0 or state.store.check([f"{state.prefix}:round_done_{closed + 1}"]):
        return None  # no round closed yet, or the next one is open already
    return closed


def round_size_key(prefix: str, round_id: int) -> str:
    """The store key where the control process records the node count a round closed at, when it closed
    below the job's full size (`shrink_when_replacements_stay_away`)."""
    return f"{prefix}:nvrx_eks_round_size_{round_id}"


def round_size(state: Any, round_id: int) -> int | None:  # noqa: ANN401 - NVRx's barrier state
    """The node count round `round_id` trains at when the job shrank for it, else None (its full size,
    NVRx's `min_nodes`)."""
    key = round_size_key(state.prefix, round_id)
    return int(state.store.get(key).decode()) if state.store.check([key]) else None


def active_in_round(state: Any, round_id: int, active_nodes: int) -> dict[int, int]:  # noqa: ANN401
    """{node rank: infra rank} of the nodes active in `round_id`, read from the round's slots; fewer than
    `active_nodes` when the job shrank for the round."""
    active_nodes = round_size(state, round_id) or active_nodes
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


def open_round_after(state: Any, round_id: int) -> int:  # noqa: ANN401 - NVRx's barrier state
    """Open the round after `round_id` as a launcher whose workers failed does (`open_rendezvous`, which
    writes the round's key once however many call it); returns the round opened."""
    state._round = round_id  # noqa: SLF001
    state.open_rendezvous()
    return round_id + 1


# ----- control process (training/resilience/control.py) ------------------------------------------------


RANK_ORDER = (
    "_sort_rankable_participants",
    ("self", "active_candidate_participants", "standby_only_participants"),
)
"""The barrier rendezvous state's ordering of a round's participants, (node, infra rank, domain, group)."""
PREVIOUS_ACTIVES = "_previous_active_by_infra_rank"
"""The state's record of the previous round's active nodes: {infra rank: replacement group} or None."""
_NOT_PREVIOUSLY_ACTIVE = 10**12
"""Added to the infra rank of a node that was not active in the previous round: beyond any pod index."""


def keep_previous_actives_first() -> None:
    """A restart round ranks the previous round's active nodes before every other node, each group in
    infrastructure-rank order, so a hot spare takes only a place no previous active node came back for.

    NVRx's barrier rendezvous waits `last_call_timeout` for the previous round's active nodes, but then
    ranks every node present by its infrastructure rank (the pod index) alone
    (`_sort_rankable_participants`, sorted again by `_assign_group_ranks`). A spare with a lower pod index
    than an active node takes that node's place at every restart round, a SIGKILL's included, and the
    displaced node's ranks restore from a partner instead of their own RAM. Only the ordering key
    changes: NVRx records the round's membership from its own lists."""
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
        return [
            (node, infra if infra in previous else infra + _NOT_PREVIOUSLY_ACTIVE, *rest)
            for node, infra, *rest in active
        ], standby

    _sort_rankable_participants.nvrx_eks_previous_first = True  # type: ignore[attr-defined]
    state._sort_rankable_participants = _sort_rankable_participants  # noqa: SLF001


LAST_CALL_GATE = ("_make_previous_active_last_call_gate", ("self", "min_nodes", "max_nodes"))
"""The barrier state's factory of the restart round's last-call gate."""
GATE_PREVIOUS_ACTIVES = "_previous_active_by_infra_rank"
"""The gate's own copy of the previous round's active nodes: {infra rank: replacement group}."""


def wait_only_for_live_previous_actives(gone_age: Callable[[Any, str, int], float | None]) -> None:
    """A restart round's last call waits only for the previous active nodes that can still rejoin.
    `gone_age(store, prefix, infra_rank)` is how long ago the node's launcher last showed life when it
    counts as gone, else None (launcher_liveness.py `gone_launcher_age`).

    With hot spares, NVRx's control process holds a restart round open `last_call_timeout` for every
    node active in the previous round before a spare may take its place (`_PreviousActiveLastCallGate`):
    right for a node restarting its workers, pure waiting for a node lost with its launcher, which
    delays every node loss with a spare standing by by that timeout. The patch wraps the gate's
    `evaluate` and drops such nodes from the gate's previous actives; a node `gone_age` does not call
    gone is waited for as NVRx does."""
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
                age = gone_age(self.store, self.prefix, infra_rank)
                if age is not None:
                    del previous[infra_rank]
                    say(
                        f"restart round: not waiting for infra rank {infra_rank}: its launcher's last beat "
                        f"was {age:.1f} s ago"
                    )
            return evaluate(participants, now, *args, **kwargs)

        gate.evaluate = evaluate_live
        return gate

    _make_previous_active_last_call_gate.nvrx_eks_live_only = True  # type: ignore[attr-defined]
    state._make_previous_active_last_call_gate = _make_previous_active_last_call_gate  # noqa: SLF001


ROUND_CLOSE = (
    "_host_close_round",
    ("self", "node_desc", "min_nodes", "max_nodes", "segment_check_interval", "stop_event"),
)
"""The control process's Step 2: poll a round's participants until it can close, rank them, close it."""
PARTICIPANTS = ("get_all_participants", ("self", "total_participants", "start_index", "expected_round_id"))
"""A round's participants by slot: (node, infra rank, domain, replacement group), None where missing."""


def _present_infra_ranks(state: Any) -> set[int]:  # noqa: ANN401 - NVRx's barrier state
    """The infra ranks of the nodes that joined the state's current round."""
    if not state.store.check([state.join_count_key]):
        return set()
    joined = int(state.store.get(state.join_count_key).decode())
    participants = state.get_all_participants(joined, 1, state._round)  # noqa: SLF001
    return {participant[1] for participant in participants if participant is not None}


def shrink_when_replacements_stay_away(
    policy: ShrinkConfig,
    live_launchers: Callable[[Any, str, int], set[int]],
    *,
    poll_s: float = 0.1,
) -> None:
    """A restart round closes below the job's full size when a lost node's replacement stays away.
    `live_launchers(store, prefix, max_nodes)` is the infra ranks whose launcher beats now
    (launcher_liveness.py `live_launchers`).

    NVRx closes a round only once `min_nodes` (the job's full size) have joined: after a node loss with
    no spare, every survivor waits for the replacement pod, for as long as it stays Pending, up to the
    join timeout. The patch wraps the control process's close of every restart round (the first round
    is NVRx's own). Each poll it looks at the nodes present: the full size present closes the round as
    NVRx does; a node of the previous round missing (lost), or a live launcher not yet joined (a
    replacement on its way in), is waited for up to `policy.after_s` from the round's start; after
    that, or at once when nobody is missing, the round closes at the largest of `policy.node_counts`
    the nodes present fill, recorded under `round_size_key` before the round closes so every launcher
    reads it with its rank (`train_at_the_rounds_size`). A round the nodes present fill no size of waits
    on, as NVRx does."""
    from nvidia_resiliency_ext.fault_tolerance.ft_rendezvous_barrier import (  # noqa: PLC0415
        RendezvousGracefulExitError,
    )

    state = _barrier_state()
    close = require_internal(state, *ROUND_CLOSE)
    require_internal(state, *PARTICIPANTS)
    if getattr(close, "nvrx_eks_shrink", False):
        return

    def size_to_close_at(self: Any, full: int, max_nodes: int) -> int | None:  # noqa: ANN401
        present = _present_infra_ranks(self)
        if len(present) >= full:
            return full
        missing = set(getattr(self, PREVIOUS_ACTIVES, None) or {}) - present
        coming = live_launchers(self.store, self.prefix, max_nodes) - present
        waited = time.monotonic() - self._rendezvous_start_time
        if (missing or coming) and waited < policy.after_s:
            return None
        return policy.size_for(len(present))

    @functools.wraps(close)  # keeps the signature `require_internal` checks
    def _host_close_round(
        self: Any,  # noqa: ANN401
        node_desc: Any,  # noqa: ANN401
        min_nodes: int,
        max_nodes: int,
        segment_check_interval: float,
        stop_event: threading.Event | None = None,
    ) -> None:
        if self._round == 0:
            close(self, node_desc, min_nodes, max_nodes, segment_check_interval, stop_event)
            return
        while (size := size_to_close_at(self, min_nodes, max_nodes)) is None:
            if stop_event is not None and stop_event.is_set():
                raise RendezvousGracefulExitError("Control rendezvous stop requested")
            self._check_timeout_and_closure(node_desc)
            time.sleep(poll_s)
        if size < min_nodes:
            self.store.set(round_size_key(self.prefix, self._round), str(size))
            say(
                f"restart round {self._round}: closing with {size} of {min_nodes} nodes "
                f"(present: {sorted(_present_infra_ranks(self))}) at {time.time():.3f}; the job trains "
                "shrunk until its nodes come back"
            )
        close(self, node_desc, size, max_nodes, segment_check_interval, stop_event)

    _host_close_round.nvrx_eks_shrink = True  # type: ignore[attr-defined]
    state._host_close_round = _host_close_round  # noqa: SLF001


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
    """The barrier rendezvous polls every `poll_s` where NVRx's floors are 1 s and 10 s. Applied in the
    control process and in every launcher.

    NVRx's floors are sized for thousands of nodes, and every restart pays them: a node waiting for a
    round to open sleeps 1 s per poll (`_wait_for_rendezvous_open`) and looks for a newer round only every
    `stale_check_interval` (10 s), so a hot spare sees the round a node loss opened up to 10 s late; the
    control process checks whether a round can close at most once a second below 2,000 nodes
    (`_compute_step2_poll_interval`). The patch replaces the barrier module's `time` with one whose
    sleeps are capped at `poll_s` (its only sleeps over 0.1 s are those 1 s polls), caps
    `stale_check_interval` at `poll_s`, and makes the close check's interval `min_nodes / 2000` s, at
    least `poll_s`: NVRx's own from 2,000 nodes on. A waiting node costs the store a few key reads per
    poll."""
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


# ----- launcher (training/resilience/launch.py) --------------------------------------------------------


ROUND_DONE = ("_wait_for_round_done", ("self", "node_desc", "rank_key"))
"""A participant's Step 3: wait for the round to close, read its rank (and the participant count)."""
HANDLER_RENDEZVOUS = ("_perform_rendezvous", ("self",))
"""The launcher's rendezvous handler's round: sets its group rank and its world size (NVRx: min_nodes)."""
_STANDBY_OFFSET = 10**9
"""Added to the rank of a node beyond a shrunk round's size: NVRx keeps it standing by (rank >= min_nodes)."""


def train_at_the_rounds_size() -> None:
    """A launcher trains at the node count its round closed at: the job's full size (NVRx's
    `min_nodes`), or the smaller one the control process recorded when the job shrank for the round
    (`shrink_when_replacements_stay_away`).

    NVRx makes every round's world `min_nodes` nodes and takes every rank below `min_nodes` as active.
    The patch reads the round's size with the rank (`_wait_for_round_done`: the control process
    recorded it before it closed the round): a node ranked beyond it stands by as a spare does, and the
    handler's world size is the round's (`_perform_rendezvous`), so each worker's WORLD_SIZE is the
    round's nodes times the ranks per node."""
    state = _barrier_state()
    wait = require_internal(state, *ROUND_DONE)
    perform = require_internal(_handler_type(), *HANDLER_RENDEZVOUS)
    if getattr(wait, "nvrx_eks_round_size", False):
        return

    @functools.wraps(wait)  # keeps the signature `require_internal` checks
    def _wait_for_round_done(self: Any, node_desc: Any, rank_key: str) -> tuple[int, int]:  # noqa: ANN401
        rank, participants = wait(self, node_desc, rank_key)
        size = round_size(self, self._round)
        self.nvrx_eks_round_size = size
        if size is not None and rank >= size:
            return rank + _STANDBY_OFFSET, participants
        return rank, participants

    @functools.wraps(perform)  # keeps the signature `require_internal` checks
    def _perform_rendezvous(self: Any) -> None:  # noqa: ANN401
        perform(self)
        size = getattr(self._barrier_state, "nvrx_eks_round_size", None)
        if size is not None:
            self._world_size = size

    _wait_for_round_done.nvrx_eks_round_size = True  # type: ignore[attr-defined]
    state._wait_for_round_done = _wait_for_round_done  # noqa: SLF001
    _handler_type()._perform_rendezvous = _perform_rendezvous  # noqa: SLF001


ORPHAN_CLEANUP = ("terminate_mp_processes", ("allowed_pgids",))
"""ft_launcher's module-level orphan cleanup (imported there from fault_tolerance.utils)."""


def keep_launcher_process_group() -> None:
    """ft_launcher's orphan cleanup leaves the launcher's own process group alone.

    `LocalElasticAgent._shutdown` passes every worker's process group to `terminate_mp_processes`:
    SIGTERM, a fixed 1 s grace, SIGKILL. It assumes each worker leads a group of its own, as a
    `subprocess` start does. Workers forked from the forkserver (launch.py) are in the forkserver's
    group, which is the launcher's: unpatched, the cleanup kills the launcher itself at the end of every
    run (`Failed to send SIGTERM to process group`, a SignalException in the agent, the pod failed). The
    workers themselves are still stopped by torch's process context; with no other group left the
    cleanup, and its 1 s grace on every restart's teardown, is skipped."""
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


def open_round_for_lost_predecessor(
    store: Any,  # noqa: ANN401 - a torch.distributed Store
    *,
    run_id: str,
    infra_rank: int,
    active_nodes: int,
) -> int | None:
    """Before this pod's agent joins: open the round after the newest closed one if this pod's index
    was active in it; returns the round opened, or None when there was nothing to open.

    In NVRx's barrier rendezvous only a launcher that saw its workers fail opens the next round
    (`open_rendezvous`); a new agent waits for it (`_wait_for_rendezvous_open`). When every active node
    is lost at once (a node and its only partner), no launcher is left to open it: the control process
    keeps the round "closed, training in progress", and the replacement pods wait until their join
    timeout. A pod whose index was active in the newest closed round replaces a node that trained there
    and is gone for good (the Job replaces a pod only once the old one has ended), so it opens the next
    round, as a surviving launcher would. With survivors it is a no-op: they open the round themselves,
    and `open_rendezvous` writes its key once."""
    state = barrier_state(store, run_id=run_id)
    closed = training_round(state)
    if closed is None or infra_rank not in active_in_round(state, closed, active_nodes).values():
        return None
    return open_round_after(state, closed)


WORKER_POLL = ("_poll", ("self",))
"""torch's MultiprocessContext poll of its worker processes: one failure per call."""


def _multiprocess_context() -> type[MultiprocessContext]:
    from torch.distributed.elastic.multiprocessing.api import MultiprocessContext  # noqa: PLC0415

    return MultiprocessContext


def report_every_failed_worker() -> None:
    """torch's poll of a node's workers reports every worker that has exited non-zero, not only the
    first.

    torch's process context for function entrypoints (`MultiprocessContext._poll`, which ft_launcher's
    monitor calls) reports one failed worker per poll: the first dead one in local-rank order. A
    SIGKILLed rank's node-mates die of their own collective error (exit 1) a moment later; when both
    are dead at the poll, local rank 0's error is all the launcher reports, and the job's failure reason
    names a collateral rank. Patched, the SIGKILL is among the failures the pod reports. Workers torch
    stopped itself while cleaning up exit by SIGTERM, which k8s/termination.py reads as collateral."""
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


def _user_error_line(failure: Any, exit_code: int) -> str:  # noqa: ANN401 - torch's ProcessFailure
    """The rank and its error in one line (torch elastic's error file, which the rank writes:
    kitcore/supervisor.py), or a pointer to its log."""
    said = rank_reason(failure) or "it wrote no reason: see the rank's log"
    return USER_ERROR_LINE.format(rank=failure.local_rank, code=exit_code, message=said)


def rank_reason(failure: Any) -> str:  # noqa: ANN401 - torch's ProcessFailure
    """What a failed rank said of its failure, in one line (kitcore/supervisor.py); "" when it said
    nothing (torch's generic "To enable traceback see: ..." names nothing)."""
    # Here, not at the top: the store's image holds this module and only the kit's pins besides.
    from nvrx_eks.kitcore.supervisor import MAX_CHARS, TORCH_NO_REASON, one_line  # noqa: PLC0415

    message = failure.message.get("message", "") if isinstance(failure.message, dict) else failure.message
    line = one_line(str(message))[:MAX_CHARS]
    return "" if line.startswith(TORCH_NO_REASON) else line


def stop_on_user_error(exit_code: int) -> None:
    """A rank that exits `exit_code` (bad input, or the same bug twice: training/api.py `UserCodeError`)
    ends the job at once, on every node, through NVRx's own no-restart path, instead of restarting into
    the same failure until the launcher's and then the Job's budgets are spent.

    The node whose rank failed broadcasts the reason (`signal_no_restart`) and raises NVRx's
    NoRestartRequested from the agent's `_handle_restart_decision`; every launcher then exits NVRx's
    no-restart code, which the Job's podFailurePolicy turns into a failed job (k8s/job_chart.py). The
    reason must be one the barrier rendezvous reports to peers, so it joins that set. The failures'
    exit codes are read from torch's poll of the workers (`MultiprocessContext._poll`)."""
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
            raise launcher.NoRestartRequested(USER_ERROR_REASON, _user_error_line(failure, exit_code))
        return decide(self, role, spec, log_msg, open_rendezvous=open_rendezvous)

    _poll.nvrx_eks_every_failure = getattr(poll, "nvrx_eks_every_failure", False)  # type: ignore[attr-defined]
    _handle_restart_decision.nvrx_eks_user_error = True  # type: ignore[attr-defined]
    context._poll = _poll  # type: ignore[method-assign]  # noqa: SLF001 - torch's method, patched in place
    agent._handle_restart_decision = _handle_restart_decision  # noqa: SLF001


def format_tracebacks_without_dynamo() -> None:
    """torch's log formatter renders a traceback without importing torch._dynamo; a no-op once torch's
    formatter no longer imports it (`formatter_imports_dynamo`).

    `TorchLogsFormatter.format`, the formatter of every `torch.*` logger, imports `torch._dynamo` to read
    one flag whenever a record carries an exception, and the launcher logs one for the first failed
    worker it sees (`MultiprocessContext._poll` logs each failed worker with `logger.exception`). The
    launcher needs torch._dynamo for nothing else (only the forkserver preloads it), so every hard
    fault's restart waits for that import -- torch._dynamo, sympy, the FX symbolic shapes -- between a
    worker's death and its restart. The patch renders the traceback with logging's own formatter first
    and hands torch's formatter the record without the exception object; torch's then appends the same
    text. Records of the `graph_breaks` artifact, a compiler log the launcher never writes, go to
    torch's formatter unchanged."""
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


LAUNCH_AGENT = ("launch_agent", ("config", "entrypoint", "args"))
"""ft_launcher's module-level call that runs the agent and raises ChildFailedError when workers failed."""


def capture_worker_failures() -> dict[int, Any]:
    """Keep the failures ft_launcher's `launch_agent` raises (global rank -> ProcessFailure) in the
    returned dict, which fills only when the workers failed; launch.py prints them last, one short entry
    per rank, in the `rank: ProcessFailure(...)` form k8s/termination.py reads.

    ft_launcher out of restarts logs its failed workers as one line of ProcessFailure reprs, Python call
    stacks included. The kubelet keeps only the last 2,048 bytes of a failed pod's log as its
    termination message, so the first entries -- the rank that was SIGKILLed among them, a short one --
    are cut, and the job's failure reason names a collateral rank's error."""
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


# ----- rank (training/resilience/layers.py) ------------------------------------------------------------


SET_TIMEOUTS = ("_set_calculated_timeouts", ("self", "new_hb_timeouts", "new_section_timeouts"))
"""RankMonitorClient's private setter of calculated heartbeat/section timeouts."""


def set_heartbeat_timeouts(client: Any, *, initial: float, subsequent: float) -> None:  # noqa: ANN401
    """Install heartbeat timeouts as if NVRx had calculated them, so `state_dict` persists them with the
    checkpoint and a restarted rank is watched with them at once.

    NVRx calculates the timeouts from observed step intervals and has no public setter; the kit raises
    them to configured floors (a small model's calculated timeout is milliseconds, and the launcher would
    kill a rank for its first pause) through RankMonitorClient's `_set_calculated_timeouts`."""
    from nvidia_resiliency_ext.fault_tolerance.data import HeartbeatTimeouts  # noqa: PLC0415

    setter = require_internal(type(client), *SET_TIMEOUTS)
    timeouts = HeartbeatTimeouts(initial=initial, subsequent=subsequent, were_calculated=True)
    setter(client, new_hb_timeouts=timeouts, new_section_timeouts=None)


RESTART_HEALTH_CHECKS = ("_construct_restart_health_check", ("self",))
"""inprocess.Wrapper's own restart health checks, chained from LOCAL_RANK when it is built."""


def inprocess_wrapper(*, gpu: bool, **kwargs: Any) -> Any:  # noqa: ANN401
    """`inprocess.Wrapper(**kwargs)`; without GPUs, built with LOCAL_RANK hidden, so a CPU run keeps only
    the kit's own restart health checks. On GPU nodes NVRx's checks stay.

    The Wrapper chains NVML-based GPU, NVLink and NIC health checks to every in-process restart whenever
    LOCAL_RANK is set when it is built (`_construct_restart_health_check`, called from `__init__`).
    Without NVML the GPU check fails, so every soft fault (exception, hang, OOM, a skipped collective)
    ends the process and becomes a launcher restart."""
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
    """NVRx's in-process TCPStore, whose clients first wait until the host's port accepts connections
    (training/parallel.py `wait_until_listening`): the Wrapper's `store_factory`.

    Rank 0 hosts the Wrapper's TCPStore, and every rank of a new launcher round builds it at about the
    same moment. A client that comes before its host is refused, and torch's client retries only after
    a randomised backoff, while the host's own construction waits for every client: forming the store
    becomes the longest part of a SIGKILL's recovery once the workers fork warm. The host itself, and
    rank 0's monitor process (which NVRx makes a client when the host's port is taken), are unchanged."""
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


INITIAL_RANKS = ("get_initial_ranks", ("self", "ranks"))
"""The in-process store's lookup of ranks' initial ranks (`inprocess.store.StoreMixin`)."""


def initial_ranks_as_ints() -> None:
    """The in-process store's `get_initial_ranks` returns ints, as its annotation says, not the raw
    bytes of torch's `multi_get`.

    When a rank's sibling monitor finds a peer unresponsive (its monitor process silent for the
    in-process `heartbeat_timeout`: a loaded node, or a rank that finished and left while a peer still
    waits at the end of training), it enters the termination barrier on the peer's behalf with those
    initial ranks. Unpatched, the bytes are written into the barrier's `arrived` list as `b'1'`, and
    every later termination barrier of the job -- each rank's `CallWrapper.shutdown` at the end of
    training -- fails parsing it (`ValueError: invalid literal for int()`). The rank then exits non-zero
    after training completed: its launcher restarts the node's workers while the other nodes have
    finished, and the job waits for them until its rendezvous join timeout."""
    from nvidia_resiliency_ext.inprocess.store import StoreMixin  # noqa: PLC0415

    lookup = require_internal(StoreMixin, *INITIAL_RANKS)
    if getattr(lookup, "nvrx_eks_ints", False):
        return

    @functools.wraps(lookup)  # keeps the signature `require_internal` checks
    def get_initial_ranks(self: Any, ranks: Any) -> list[int]:  # noqa: ANN401
        return [int(value) for value in lookup(self, ranks)]

    get_initial_ranks.nvrx_eks_ints = True  # type: ignore[attr-defined]
    StoreMixin.get_initial_ranks = get_initial_ranks


MONITOR_THREAD_STOPPED = "stop_loop"
"""The in-process monitor thread's event that the Wrapper sets when it stops the thread on purpose."""
MONITOR_THREAD_JOINED = "stop_raising"
"""Its event that the Wrapper sets when the call failed and it joins the thread (`maybe_join`)."""
_MONITOR_THREAD_SHAPE = (
    f"self.{MONITOR_THREAD_STOPPED} = threading.Event()",
    f"self.{MONITOR_THREAD_JOINED} = threading.Event()",
    # The order `hold_restart_until_call_ends` relies on: abort, then the interrupt, which `shutdown`
    # catches.
    "self.abort(state)",
    "async_abort_main_thread(msg)",
    "except RankShouldRestart:",
)


def _monitor_thread_type() -> Any:  # noqa: ANN401 - NVRx's class: NVRx ships no types
    from nvidia_resiliency_ext.inprocess.monitor_thread import MonitorThread  # noqa: PLC0415

    source = inspect.getsource(MonitorThread)
    missing = [line for line in _MONITOR_THREAD_SHAPE if line not in source]
    if missing or source.index("self.abort(state)") > source.index("async_abort_main_thread(msg)"):
        raise RuntimeError(
            f"NVRx {NVRX_VERSION}: inprocess MonitorThread is not as the kit knows it (missing: "
            f"{missing}, or the interrupt before abort); check training/resilience/nvrx_compat.py against "
            "this release"
        )
    return MonitorThread


def hold_restart_until_call_ends(poll_s: float = 0.05) -> None:
    """From the Wrapper's abort hook, in the monitor thread that decided a restart: wait until the main
    thread ends its call -- `MonitorThread.shutdown` once the completion barrier passed (`stop_loop`), or
    `maybe_join` once the call failed (`stop_raising`).

    NVRx's monitor thread interrupts the main thread right after the abort hook, wherever that thread
    is. A restart decided after every rank finished training -- a peer that left the Wrapper first and
    whose monitor fell silent, read as unresponsive; a rank silent past the soft timeout in the last
    wait -- interrupts ranks in the completion barrier, and restarts them into a world whose other ranks
    have left: they wait for it until the launcher's rendezvous timeout. Held here, the interrupt comes
    once the main thread is in `shutdown`, whose loop catches it, or on the failure path NVRx restarts
    from anyway."""
    thread = threading.current_thread()
    if not isinstance(thread, _monitor_thread_type()):
        raise TypeError("hold_restart_until_call_ends: call it from the in-process monitor thread")
    stopped, joined = getattr(thread, MONITOR_THREAD_STOPPED), getattr(thread, MONITOR_THREAD_JOINED)
    while not (stopped.is_set() or joined.is_set()):
        stopped.wait(poll_s)


def on_monitor_thread_death(callback: Callable[[BaseException | None], None]) -> None:
    """Call `callback(exception)` in the dying thread when an in-process monitor thread ends with an
    exception while its Wrapper had not asked it to stop, after the usual traceback is printed; other
    threads' exceptions go to the previous `threading.excepthook` unchanged.

    The Wrapper's store is a TCPStore its rank 0 hosts. When rank 0's node is lost, each survivor's
    monitor thread -- the one that interrupts the main thread for a restart -- dies of the store's
    DistNetworkError (its loop catches only DistStoreError), while the main thread, after its collective
    failed, spins until that thread interrupts it (`spin_till_paused`): for ever. Only ft_launcher's
    heartbeat timeout would end it, and with a warm spare standing by nothing else opens the next
    round. No in-process restart is possible without that store, which lives for one launcher round,
    so the in-process layer's callback ends the process (training/resilience/layers.py) and its
    launcher restarts the node's workers at once."""
    monitor_thread = _monitor_thread_type()
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        previous(args)
        thread = args.thread
        if isinstance(thread, monitor_thread) and not getattr(thread, MONITOR_THREAD_STOPPED).is_set():
            callback(args.exc_value)

    threading.excepthook = hook


def stop_progress_watchdog(call_wrapper: Any) -> None:  # noqa: ANN401
    """Stop the Wrapper's progress watchdog thread if NVRx left it running (a no-op when NVRx stopped
    it); called once the Wrapper has returned or raised.

    The watchdog is a non-daemon thread that each call of the Wrapper starts and stops in its shutdown,
    after a termination barrier. When the ranks of a lost node never reach that barrier, the barrier
    raises first and the thread is never stopped: the surviving ranks leave the wrapper (RestartAbort)
    but the interpreter waits for the thread at exit for ever, so their processes never end, their
    launcher never restarts them, and the job hangs."""
    watchdog = getattr(call_wrapper, "progress_watchdog", None)
    if watchdog is not None and watchdog.is_alive():
        watchdog.shutdown()


RANK_MONITOR_SOCKET = "rank_monitor_socket"
"""RankMonitorClient's connection to its launcher's rank monitor (a socket object, None when closed)."""


def close_rank_monitor_socket_in_forks(client: Any) -> None:  # noqa: ANN401 - a RankMonitorClient
    """In every process forked from this one from now on, close that process's copy of `client`'s
    connection to its launcher's rank monitor (training/forks.py); the rank's own stays open.

    The rank monitor serves one connection per local rank at a time: a new worker's waits until the
    previous one is closed. The in-process Wrapper forks its monitor process from the rank after the
    client connected, so that process holds a copy of the socket, and it outlives a rank the launcher
    stopped (after a node loss it waits at the in-process barriers for ranks that will never come).
    Unpatched, the connection stays open, the restarted worker hangs in its start until the launcher
    gives up on it, and the job loses its survivors' places."""
    if not hasattr(client, RANK_MONITOR_SOCKET):
        raise RuntimeError(
            f"NVRx {NVRX_VERSION}: RankMonitorClient has no {RANK_MONITOR_SOCKET}; "
            "check training/resilience/nvrx_compat.py against this release"
        )
    close_in_forks(lambda: getattr(client, RANK_MONITOR_SOCKET, None))


# ----- self-check (training/node/selfcheck.py) ---------------------------------------------------------


def straggler_extension_available() -> bool:
    """Whether NVRx's compiled CUPTI straggler extension (`nvrx_cupti_module`) can be imported here. It is
    a GPU-only build: the image has it, a local install (tools/nvrx-wheel.sh) does not. Nothing in the
    kit uses the straggler detector; the self-check reports whether the extension loads."""
    return importlib.util.find_spec("nvrx_cupti_module") is not None
