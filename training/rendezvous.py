"""The job's rendezvous store, in its own process, and the replacement pod's eviction of its predecessor.

`python -m training.rendezvous --port 29400` serves torch's TCPStore until SIGTERM. Every launcher
agent connects to it with `--rdzv-conf is_host=0`, so no training pod hosts the store: measured with
ft_launcher 0.4.1, losing the agent that hosted the store stopped every other agent within a second,
while with the store in its own process losing any node left the survivors running (shared README
section 6). The job chart runs this as a one-replica Deployment on the system nodes.

`hand_over()` runs in every training pod's launcher before its agent joins (training/launch.py
`--evict-predecessor`; it was an init container of its own until the node-loss path was measured). A
node that dies without leaving stays in the rendezvous state until
its keep-alive expires (NVRx 0.4.1 hard-codes 5 s x 3), and the survivors cannot complete the next round
with the replacement until it does. The replacement knows its predecessor is gone (the Job controller
replaces a pod only once the old one has terminated, podReplacementPolicy: Failed), so it back-dates
the predecessor's last heartbeat in the stored state; the next sync of any agent then drops it through
NVRx's own dead-node removal. Nodes are recognized by the address they joined with (`--local-addr`,
the pod's stable DNS name). The state format is NVRx's private one: anything unexpected is reported
and left alone, and recovery falls back to waiting out the keep-alive.

The same step reopens a closed rendezvous (budgets that nest, issue 16 part 5). A launcher that has
used its `--max-restarts` leaves with ChildFailedError, and on the way out NVRx's launcher calls
`clean_rdzv_shutdown(close=True)` (0.4.1; 0.7 calls `rdzv_handler.shutdown()`), which marks the
rendezvous closed for good: with 0.4.1 `closed=True` in the pickled state (torch's dynamic rendezvous
does the same), with 0.7's barrier rendezvous a `ft_rendezvous_barrier:<run id>:shutdown` key. Every
replacement pod the Job controller starts would then die at once with RendezvousClosedError, and the
Job's backoffLimitPerIndex would be dead weight. A replacement pod exists only while the Job has budget
left, so the pod's own start is the place that knows the close was not the job's end: it waits
until the closing agents have left (a closed rendezvous's remaining members are all on their way out),
then clears the close. NVRx offers no flag for this (0.4.1 and 0.7 close on every exit but a signal or
an unhealthy node), and patching the launcher in-process would tie us to its private call order.
The round number is kept: the store's keys are prefixed by it, so a reset would meet the previous
generation's keys. With the `min-healthy` policy (0.4.1-0.5) NVRx counts restarts by that global round,
so after a first exhaustion every further fault costs a pod per index (the Job's budget) rather than a
launcher restart; with `any-failed` each new launcher starts with its whole budget.
"""

from __future__ import annotations

import argparse
import json
import logging
import pickle
import signal
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

LOG = logging.getLogger("nvrx_eks.rendezvous")
STALE = datetime(2000, 1, 1)  # noqa: DTZ001 - NVRx keeps naive UTC heartbeat times
"""Heartbeat time written for an evicted node: older than any keep-alive window."""
KEEP_ALIVE_WINDOW = timedelta(seconds=15)
"""NVRx 0.4.1's hard-coded keep-alive: 5 s x 3 attempts; a member silent longer is dead."""
BARRIER_SHUTDOWN_KEY = "ft_rendezvous_barrier:{run_id}:shutdown"
"""NVRx 0.7's permanent close of the barrier rendezvous (ft_rendezvous_barrier.py, `shutdown_key`)."""
Rendezvous = Literal["keep-alive", "barrier"]


def serve(*, host: str, port: int, stop: threading.Event | None = None) -> None:
    """Serve a TCPStore on host:port until SIGTERM/SIGINT (or `stop` is set)."""
    from torch.distributed import TCPStore  # noqa: PLC0415 - torch import is slow; keep --help fast

    stop = stop or threading.Event()
    store = TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    print(f"rendezvous store listening on {host}:{store.port}", flush=True)
    stop.wait()
    print("rendezvous store stopping", flush=True)


def _connect(endpoint: str, run_id: str, timeout_s: float) -> tuple[Any, Any]:
    """(a client of the job's store, torch's c10d rendezvous backend of run `run_id` on it)."""
    from torch.distributed import TCPStore  # noqa: PLC0415 - torch import is slow; keep --help fast
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (  # noqa: PLC0415
        C10dRendezvousBackend,
    )

    host, _, port = endpoint.rpartition(":")
    store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s))
    return store, C10dRendezvousBackend(store, run_id)


def evict(*, endpoint: str, run_id: str, node_addr: str, timeout_s: float = 30.0) -> int:
    """Mark every node that joined from `node_addr` as dead in the rendezvous state; return how many.
    An eviction also posts a vacancy (`post_vacancy`): a warm spare may take the place at once."""
    store, backend = _connect(endpoint, run_id, timeout_s)
    return _evict(store, backend, run_id=run_id, node_addr=node_addr)


def _evict(store: Any, backend: Any, *, run_id: str, node_addr: str) -> int:  # noqa: ANN401
    for _attempt in range(10):  # compare-and-set: retry when an agent wrote in between
        current = backend.get_state()
        if current is None:
            return 0
        raw, token = current
        try:
            # The store is this job's own; its content was written by this job's agents.
            state: Any = pickle.loads(raw)  # noqa: S301
            stale = [  # not yet evicted: a second eviction would post a second vacancy
                node
                for node, last in state.last_heartbeats.items()
                if getattr(node, "addr", None) == node_addr and last != STALE
            ]
        except (pickle.UnpicklingError, AttributeError, ImportError) as exc:
            LOG.warning("rendezvous state not understood (%s); leaving it to the keep-alive expiry", exc)
            return 0
        if not stale:
            return 0
        for node in stale:
            state.last_heartbeats[node] = STALE
        _, _, written = backend.set_state(pickle.dumps(state), token)
        if written:
            post_vacancy(store, run_id=run_id, node_addr=node_addr)
            return len(stale)
    LOG.warning("could not write the rendezvous state (busy); leaving it to the keep-alive expiry")
    return 0


def _leaving_members(state: Any, now: datetime) -> list[Any]:  # noqa: ANN401 - NVRx's private state
    """Members of a closed rendezvous still listed with a live heartbeat (they are on their way out)."""
    listed = set(state.participants) | set(state.wait_list) | set(state.redundancy_list)
    return [n for n in listed if state.last_heartbeats.get(n, STALE) > now - KEEP_ALIVE_WINDOW]


def reopen(*, endpoint: str, run_id: str, rendezvous: Rendezvous, timeout_s: float = 30.0) -> bool:
    """Clear a permanent close of run `run_id`'s rendezvous, once its closing members have left.

    Returns whether it was closed. Called only from a pod the Job controller started, i.e. while the
    Job still has budget (see the module docstring).
    """
    store, backend = _connect(endpoint, run_id, timeout_s)
    if rendezvous == "barrier":
        key = BARRIER_SHUTDOWN_KEY.format(run_id=run_id)
        return bool(store.check([key]) and store.delete_key(key))
    deadline = time.monotonic() + timeout_s
    while True:
        current = backend.get_state()
        if current is None:
            return False
        raw, token = current
        try:
            state: Any = pickle.loads(raw)  # noqa: S301 - this job's own store, written by its agents
            if not state.closed:
                return False
            leaving = _leaving_members(state, datetime.utcnow())  # noqa: DTZ003 - NVRx's naive UTC
        except (pickle.UnpicklingError, AttributeError, ImportError) as exc:
            LOG.warning("rendezvous state not understood (%s); not reopening it", exc)
            return False
        if leaving and time.monotonic() < deadline:
            time.sleep(0.2)  # a closing agent removes itself, then closes: let it finish first
            continue
        if leaving:
            LOG.warning("members %s still listed after %.0f s; reopening anyway", leaving, timeout_s)
        state.closed = False
        _, _, written = backend.set_state(pickle.dumps(state), token)
        if written:
            return True


# --- warm spares (NVRx 0.4.1's keep-alive rendezvous) ------------------------------------------------
VACANCY_COUNT_KEY = "nvrx-eks:{run_id}:vacancies"
VACANCY_KEY = "nvrx-eks:{run_id}:vacancy:{n}"
CLAIM_KEY = "nvrx-eks:{run_id}:claim:{n}"
CLAIMED_BY_KEY = "nvrx-eks:{run_id}:claimed-by:{n}"
"""This kit's own keys in the job's store: vacancies 1..count, each JSON {addr, t}; a claim counter each,
and the winner's JSON {addr, t}."""
CLAIM_JOIN_S = 60.0
"""A claimed place counts as taken this long before its claimer shows up in the rendezvous (it joins
within a second or two; one that died on the way frees the place after this)."""
SILENT_AFTER = timedelta(seconds=10)
"""A member whose keep-alive is older than this is dead: live ones write every 5 s (hard-coded in 0.4.1),
so twice that leaves a starved heartbeat thread 5 s of slack; NVRx's own expiry waits 15 s."""
OWN_VACANCY_GRACE_S = 2.0
"""A replacement pod posts its dead predecessor's vacancy and lets a warm spare take it first; it takes
the place itself only if no standby has after this long."""
ROOM_GRACE_S = 5.0
"""Fewer live members than active nodes, with no vacancy posted (an active pod that never started, a
Job's replacements after every launcher left): a standby joins once that has lasted this long. A restart
round empties briefly too (each agent leaves and rejoins within a second): that must not take a spare."""
POLL_S = 0.1


def post_vacancy(store: Any, *, run_id: str, node_addr: str) -> int:  # noqa: ANN401
    """Record that the node of `node_addr` is gone for good (it was evicted); returns the vacancy's number."""
    n = int(store.add(VACANCY_COUNT_KEY.format(run_id=run_id), 1))
    record = {"addr": node_addr, "t": time.time()}
    store.set(VACANCY_KEY.format(run_id=run_id, n=n), json.dumps(record))
    return n


@dataclass(frozen=True)
class Member:
    addr: str
    silent_s: float
    """Seconds since its last keep-alive (infinite when none is recorded)."""
    place: Literal["participant", "waiting", "redundant"]
    evicted: bool = False
    """Its keep-alive was back-dated (`evict`): the agents' next sync drops it."""


@dataclass(frozen=True)
class View:
    """What a standby reads of NVRx 0.4.1's rendezvous state."""

    round: int
    complete: bool
    closed: bool
    members: tuple[Member, ...]

    def live(self) -> set[str]:
        """The live nodes' addresses (an address listed twice, an old pid's leftover, counts once)."""
        return {m.addr for m in self.members if m.silent_s <= SILENT_AFTER.total_seconds()}

    def silent_participants(self) -> list[str]:
        limit = SILENT_AFTER.total_seconds()
        silent = {m.addr for m in self.members if m.place == "participant" and m.silent_s > limit}
        return sorted(silent - {m.addr for m in self.members if m.evicted})


def view_of(state: Any, now: datetime) -> View:  # noqa: ANN401 - NVRx's private state
    def silent(node: Any) -> float:  # noqa: ANN401
        last = state.last_heartbeats.get(node)
        return float("inf") if last is None else (now - last).total_seconds()

    places: list[tuple[Any, Literal["participant", "waiting", "redundant"]]] = [
        *((n, "participant") for n in state.participants),
        *((n, "waiting") for n in state.wait_list),
        *((n, "redundant") for n in state.redundancy_list),
    ]
    members = tuple(
        Member(
            addr=node.addr,
            silent_s=silent(node),
            place=place,
            evicted=state.last_heartbeats.get(node) == STALE,
        )
        for node, place in places
    )
    return View(round=state.round, complete=state.complete, closed=state.closed, members=members)


def _read_view(backend: Any) -> View | None:  # noqa: ANN401
    current = backend.get_state()
    if current is None:
        return None
    try:
        state = pickle.loads(current[0])  # noqa: S301 - this job's own store, written by its agents
        return view_of(state, datetime.utcnow())  # noqa: DTZ003 - NVRx keeps naive UTC
    except (pickle.UnpicklingError, AttributeError, ImportError, TypeError) as exc:
        raise RuntimeError(f"rendezvous state not understood ({exc}): cannot stand by") from exc


class Standby:
    """A warm spare's wait outside the rendezvous, until a place is free for it.

    Why outside: NVRx 0.4.1 keeps agents beyond `--nnodes` max in a redundancy list, and every restart
    round admits whoever joins first. A spare waiting there took a place at each SIGKILL's restart (the
    ranks then moved to it and restored from a partner's RAM, 2-3 steps lost where 0-1 were). Standing
    by before its agent's first join, a spare takes only a place that is free for good:
    - a posted vacancy (`post_vacancy`): a replacement pod evicted its dead predecessor, or this
      standby evicted a participant silent beyond SILENT_AFTER (a node lost with no replacement yet: on
      a cluster the Job controller replaces a pod only once Kubernetes has given up on its node, minutes);
      one standby claims each vacancy (an atomic counter in the store);
    - room that lasts ROOM_GRACE_S with no vacancy (the fallback: a pod that never started).
    A pod of an active index (< nodes) joins at once while the first round forms. Everything here reads
    NVRx's private state format: anything unexpected raises, and the launcher then joins as before.
    """

    def __init__(
        self,
        *,
        store: Any,  # noqa: ANN401
        backend: Any,  # noqa: ANN401
        run_id: str,
        node_addr: str,
        active_nodes: int,
        index: int,
    ) -> None:
        self.store, self.backend = store, backend
        self.run_id, self.node_addr = run_id, node_addr
        self.active_nodes, self.index = active_nodes, index
        self._taken: set[int] = set()
        """Vacancies another standby claimed: never looked at again."""

    def wait(self, *, poll_s: float = POLL_S, deadline_s: float | None = None) -> str:
        """Block until this pod has a place; returns why it has one."""
        view = _read_view(self.backend)
        if self.index < self.active_nodes and (view is None or (view.round == 0 and not view.complete)):
            return "an active index while the first round forms"
        room_since: float | None = None
        until = None if deadline_s is None else time.monotonic() + deadline_s
        while until is None or time.monotonic() < until:
            if view is not None and not view.closed:
                for addr in view.silent_participants():
                    if _evict(self.store, self.backend, run_id=self.run_id, node_addr=addr):
                        print(f"standby: evicted {addr}, silent over {SILENT_AFTER.seconds} s", flush=True)
                claimed = self._claim()
                if claimed:
                    return claimed
                taken = view.live() | self._joining()
                if len(taken) < self.active_nodes:
                    room_since = room_since or time.monotonic()
                    if time.monotonic() - room_since >= ROOM_GRACE_S:
                        return f"{len(taken)} live nodes of {self.active_nodes} for {ROOM_GRACE_S:g} s"
                else:
                    room_since = None
            time.sleep(poll_s)
            view = _read_view(self.backend)
        raise TimeoutError("standby: no place within the deadline")

    def _claim(self) -> str | None:
        count = int(self.store.add(VACANCY_COUNT_KEY.format(run_id=self.run_id), 0))
        for n in range(1, count + 1):
            if n in self._taken:
                continue
            claim_key = CLAIM_KEY.format(run_id=self.run_id, n=n)
            if int(self.store.add(claim_key, 0)) > 0:
                self._taken.add(n)
                continue
            record = json.loads(self.store.get(VACANCY_KEY.format(run_id=self.run_id, n=n)))
            if record["addr"] == self.node_addr and time.time() - record["t"] < OWN_VACANCY_GRACE_S:
                continue  # our own predecessor's place: a warm spare first
            if int(self.store.add(claim_key, 1)) == 1:
                winner = {"addr": self.node_addr, "t": time.time()}
                self.store.set(CLAIMED_BY_KEY.format(run_id=self.run_id, n=n), json.dumps(winner))
                return f"took the place of {record['addr']} (vacancy {n})"
            self._taken.add(n)
        return None

    def _joining(self) -> set[str]:
        """Addresses that claimed a place recently: on their way into the rendezvous."""
        joining = set()
        for n in self._taken:
            key = CLAIMED_BY_KEY.format(run_id=self.run_id, n=n)
            if not self.store.check([key]):
                continue  # claimed a moment ago, the winner's record not written yet: next poll
            winner = json.loads(self.store.get(key))
            if time.time() - winner["t"] < CLAIM_JOIN_S:
                joining.add(winner["addr"])
        return joining


def stand_by(*, endpoint: str, run_id: str, node_addr: str, active_nodes: int, index: int) -> str:
    """`Standby.wait` on a fresh client of the job's store (training/launch.py `--warm-spares`)."""
    store, backend = _connect(endpoint, run_id, timeout_s=60.0)
    return Standby(
        store=store,
        backend=backend,
        run_id=run_id,
        node_addr=node_addr,
        active_nodes=active_nodes,
        index=index,
    ).wait()


REOPEN_TIMEOUT_S = 10.0
"""How long the hand-over lets the members of a closed rendezvous leave before it reopens it."""


def hand_over(
    *, endpoint: str, run_id: str, node_addr: str, rendezvous: Rendezvous, store_timeout_s: float = 60.0
) -> None:
    """A (replacement) pod's start: evict its dead predecessor (keep-alive rendezvous only), then reopen
    a rendezvous that a launcher out of restarts closed. On a first start there is nothing to do."""
    if rendezvous == "keep-alive":
        count = evict(endpoint=endpoint, run_id=run_id, node_addr=node_addr, timeout_s=store_timeout_s)
        print(f"evicted {count} stale rendezvous node(s) of {node_addr}", flush=True)
    if reopen(endpoint=endpoint, run_id=run_id, rendezvous=rendezvous, timeout_s=REOPEN_TIMEOUT_S):
        print(f"reopened rendezvous {run_id}: a launcher out of restarts had closed it", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.rendezvous", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (all interfaces)")  # noqa: S104
    parser.add_argument("--port", type=int, default=29400)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve(host=args.host, port=args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
