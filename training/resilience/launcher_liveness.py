"""The kit's launcher-liveness protocol: each launcher beats in the rendezvous store, and two readers act
on a beat that stopped.

NVRx has no signal for "this node's launcher is gone". A node lost with everything on it reports
nothing: NVRx opens a restart round only when a launcher's own workers fail, so the survivors restart
only after their collectives fail or time out, and a restart round's last call waits its full
`last_call_timeout` for a previous active node that will never come back. The kit adds that signal.

- The beat (`LauncherBeat`, started by training/resilience/launch.py `beat`): every launcher writes
  the wall-clock time to `launcher_beat_key(prefix, infra_rank)` every `LAUNCHER_BEAT_S`, under the
  barrier rendezvous' key prefix of its run. A launcher whose node's training ended writes
  `LAUNCHER_DONE` last: a node that finished before its peers is not lost.
- Gone: a launcher whose last beat is older than `LAUNCHER_GONE_S` (`gone_launcher_age`). A launcher
  that never beat (one without this protocol) or wrote `LAUNCHER_DONE` is never gone: NVRx's own waits
  apply to it.
- The readers, with the same threshold, so the node the control process stops waiting for is the node
  the launchers restart the job without:
  - the control process's restart-round last call (nvrx_compat.py
    `wait_only_for_live_previous_actives`, given `gone_launcher_age`) does not wait for a previous
    active node whose launcher is gone: a warm spare takes its place at once;
  - each active node's launcher watches the next active node in node-rank order, wrapping
    (`LostPeerWatch`), and opens the next restart round once that node's launcher is gone. Every
    launcher polls for an opened round and restarts its workers into it, as when a peer's workers
    failed. Each active node is watched by one other, at a few store reads per beat at any job size.
- A launcher judges its peer only once its own beats have gone out on time for `LAUNCHER_GONE_S`
  (`SteadyBeats`): a stalled store or a starved launcher delays every beat alike, its own included,
  and for a moment after, every peer's beat looks old.

The beat is a wall-clock time read on another node: EKS nodes keep their clocks within milliseconds
(Amazon Time Sync). A node whose clock ran seconds behind would look gone and lose its place to a
spare, which costs a restore from a partner, never data.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
from typing import TYPE_CHECKING, Any

from nvrx_eks.kitcore.lines import say
from nvrx_eks.training.resilience.nvrx_compat import (
    active_in_round,
    barrier_state,
    open_round_after,
    round_size,
    training_round,
)

if TYPE_CHECKING:
    from nvrx_eks.training.resilience.shrink import ShrinkConfig

LAUNCHER_BEAT_S = 0.5
"""How often each launcher writes its beat (the wall-clock time) to the rendezvous store."""
BEAT_CONNECT_S = 2.0
"""How long the beat waits to connect to the store before it tries again."""
LAUNCHER_GONE_S = 2.0
"""A launcher whose beat is older than this is gone: four beats missed."""
LAUNCHER_DONE = b"done"
"""A launcher's last beat once its node's training ended: it stopped for good, and no node is lost."""


def launcher_beat_key(prefix: str, infra_rank: int) -> str:
    """The store key of the beat of the launcher with `infra_rank`, under the barrier state's `prefix`."""
    return f"{prefix}:nvrx_eks_launcher_beat_{infra_rank}"


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


def gone_launcher_age(
    store: Any,  # noqa: ANN401 - a torch.distributed Store
    prefix: str,
    infra_rank: int,
    gone_s: float = LAUNCHER_GONE_S,
) -> float | None:
    """The age of the last beat of the launcher with `infra_rank` when it is gone (older than `gone_s`);
    None while it beats, when it never beat, or when its node's training ended."""
    age = launcher_beat_age(store, prefix, infra_rank)
    return age if age is not None and age > gone_s else None


def live_launchers(store: Any, prefix: str, max_nodes: int, gone_s: float = LAUNCHER_GONE_S) -> set[int]:  # noqa: ANN401
    """The infra ranks below `max_nodes` whose launcher beats now (its last beat younger than `gone_s`):
    nodes that are in the job or can join its next round."""
    live = set()
    for infra_rank in range(max_nodes):
        age = launcher_beat_age(store, prefix, infra_rank)
        if age is not None and age <= gone_s:
            live.add(infra_rank)
    return live


def durable_key(prefix: str, rank: int) -> str:
    """The store key where a shrunk job's rank `rank` reports its newest committed durable step."""
    return f"{prefix}:nvrx_eks_durable_{rank}"


def durable_everywhere(store: Any, prefix: str) -> int | None:  # noqa: ANN401 - a torch Store
    """The newest durable step every rank of the shrunk world has reported committed, or None when a
    rank of it has not reported one (each value is `WORLD_SIZE:STEP`; rank 0's gives the world)."""
    first = durable_key(prefix, 0)
    if not store.check([first]):
        return None
    world = int(store.get(first).decode().partition(":")[0])
    steps = []
    for rank in range(world):
        key = durable_key(prefix, rank)
        reported = store.get(key).decode().partition(":") if store.check([key]) else ("", "", "")
        if reported[0] != str(world):
            return None
        steps.append(int(reported[2]))
    return min(steps)


class DurableReport:
    """A shrunk job's rank, telling the control process each durable step it committed: an event
    listener (`EventLog.subscribe`) of ranks whose launcher handed them the store
    (`RENDEZVOUS_ENV`). The grown job restores the newest durable step; `GrowBack` waits for a new one
    so that growing loses only the steps since it. One short store connection per durable commit;
    a store that cannot be reached costs only the wait (`ShrinkConfig.grow_wait_s`)."""

    def __init__(self, endpoint: str, *, run_id: str, rank: int, world_size: int) -> None:
        self.endpoint, self.run_id, self.rank, self.world_size = endpoint, run_id, rank, world_size

    def __call__(self, event: dict[str, Any]) -> None:
        if event.get("kind") != "checkpoint_committed" or event.get("tier") != "durable":
            return
        from datetime import timedelta  # noqa: PLC0415

        from torch.distributed import TCPStore  # noqa: PLC0415

        host, _, port = self.endpoint.rpartition(":")
        try:
            store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=BEAT_CONNECT_S))
            prefix = barrier_state(store, run_id=self.run_id).prefix
            store.set(durable_key(prefix, self.rank), f"{self.world_size}:{int(event['step'])}")
            del store  # no client outlives the report (one held at interpreter exit aborts it)
        except Exception as exc:  # noqa: BLE001 - the grow-back then waits its limit instead
            say(f"durable step not reported to the rendezvous store: {type(exc).__name__}: {exc}")


class GrowBack:
    """While the job trains shrunk, grows it back once enough launchers beat for a larger size: the lost
    node's replacement (or a new spare) has started and waits for a round to join. It then lets the
    shrunk job train on until its next durable step is committed on every rank (`DurableReport`), at
    most `policy.grow_wait_s`, and opens the next restart round: the round closes at the job's full
    size (or the largest size the nodes present fill) and the ranks restore that step, resharded, so
    growing loses only the steps since it. The control process runs it
    (training/resilience/control.py)."""

    def __init__(self, store: Any, *, run_id: str, policy: ShrinkConfig, max_nodes: int) -> None:  # noqa: ANN401
        self.state = barrier_state(store, run_id=run_id)
        self.policy, self.max_nodes = policy, max_nodes
        self._waiting: tuple[int, float, int | None] | None = None
        """(round, since, newest durable step then) while a possible growth waits for a durable step."""

    def check(self, now: float | None = None) -> tuple[int, int, int, str] | None:
        """Open the next round when the job trains shrunk, the live launchers fill a larger size and
        its next durable step is committed (or the wait is over); returns (round opened, size trained
        at, size to grow to, why now), or None."""
        now = time.monotonic() if now is None else now
        training = training_round(self.state)
        size = round_size(self.state, training) if training is not None else None
        if training is None or size is None:
            self._waiting = None
            return None
        live = len(live_launchers(self.state.store, self.state.prefix, self.max_nodes))
        target = self.policy.nodes if live >= self.policy.nodes else self.policy.size_for(live)
        if target is None or target <= size:
            self._waiting = None
            return None
        newest = durable_everywhere(self.state.store, self.state.prefix)
        if self._waiting is None or self._waiting[0] != training:
            self._waiting = (training, now, newest)
        _, since, before = self._waiting
        if newest is not None and (before is None or newest > before):
            why = f"after durable step {newest}"
        elif now - since >= self.policy.grow_wait_s:
            why = f"no new durable step within {self.policy.grow_wait_s:g} s"
        else:
            return None
        self._waiting = None
        return open_round_after(self.state, training), size, target, why


class SteadyBeats:
    """Whether this launcher's own beats have gone out on time for the last `gone_s`: only then may it
    read a peer's old beat as that peer's loss."""

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


class LostPeerWatch:
    """Opens the next restart round as soon as the launcher of the active node this launcher watches is
    gone: the next active node in node-rank order, wrapping. The round's slots are read once per round,
    so each check costs a few store reads at any job size."""

    def __init__(self, store: Any, *, run_id: str, infra_rank: int, active_nodes: int) -> None:  # noqa: ANN401
        self.state = barrier_state(store, run_id=run_id)
        self.infra_rank = infra_rank
        self.active_nodes = active_nodes
        self._watched: tuple[int, int | None] | None = None  # (round, watched infra rank) once read

    def check(self, gone_s: float = LAUNCHER_GONE_S) -> tuple[int, int, float] | None:
        """Open the next round if the watched node's launcher is gone (its beat older than `gone_s`);
        returns (round opened, the lost node's infra rank, its beat's age), or None."""
        training = training_round(self.state)
        if training is None:
            return None
        if self._watched is None or self._watched[0] != training:
            self._watched = (training, self._next_active(training))
        watched = self._watched[1]
        if watched is None:
            return None
        age = gone_launcher_age(self.state.store, self.state.prefix, watched, gone_s)
        if age is None:
            return None
        return open_round_after(self.state, training), watched, age

    def _next_active(self, round_id: int) -> int | None:
        active = active_in_round(self.state, round_id, self.active_nodes)
        ranks = sorted(active)
        mine = [rank for rank in ranks if active[rank] == self.infra_rank]
        if not mine or len(ranks) == 1:
            return None  # a spare, or nothing to watch
        return active[ranks[(ranks.index(mine[0]) + 1) % len(ranks)]]


class LauncherBeat:
    """This launcher's beat in the rendezvous store, and its watch over one peer: a daemon thread that
    writes the wall-clock time every `every_s` while the launcher lives and, when `active_nodes` is
    given, runs `LostPeerWatch` after each beat once its own beats have been steady for
    `LAUNCHER_GONE_S`. Store errors only skip beats. `finish` ends it; at interpreter exit it ends by
    itself. Either way it drops its store client first: a TCPStore still held by a thread when the
    interpreter ends aborts the process, which would turn the launcher's exit status (what the Job's
    pod failure policy reads) into a SIGABRT."""

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
                    key = launcher_beat_key(barrier_state(store, run_id=self.run_id).prefix, self.infra_rank)
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
                    say(
                        f"node with infra rank {infra_rank} lost: its launcher's last beat was {age:.1f} s "
                        f"ago; opened restart round {opened}"
                    )
            except Exception:  # noqa: BLE001 - the store may be starting, moving or gone
                store = watch = None
                steady.broke()
            self._stop.wait(self.every_s)
        if self._done and store is not None:
            with contextlib.suppress(Exception):
                store.set(key, LAUNCHER_DONE)  # type: ignore[arg-type]  # torch's stub says str; bytes work
        del store, watch
