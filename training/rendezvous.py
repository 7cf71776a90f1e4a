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
import logging
import pickle
import signal
import sys
import threading
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


def evict(*, endpoint: str, run_id: str, node_addr: str, timeout_s: float = 30.0) -> int:
    """Mark every node that joined from `node_addr` as dead in the rendezvous state; return how many."""
    from torch.distributed import TCPStore  # noqa: PLC0415
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (  # noqa: PLC0415
        C10dRendezvousBackend,
    )

    host, _, port = endpoint.rpartition(":")
    store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s))
    backend = C10dRendezvousBackend(store, run_id)
    for _attempt in range(10):  # compare-and-set: retry when an agent wrote in between
        current = backend.get_state()
        if current is None:
            return 0
        raw, token = current
        try:
            # The store is this job's own; its content was written by this job's agents.
            state: Any = pickle.loads(raw)  # noqa: S301
            stale = [node for node in state.last_heartbeats if getattr(node, "addr", None) == node_addr]
        except (pickle.UnpicklingError, AttributeError, ImportError) as exc:
            LOG.warning("rendezvous state not understood (%s); leaving it to the keep-alive expiry", exc)
            return 0
        if not stale:
            return 0
        for node in stale:
            state.last_heartbeats[node] = STALE
        _, _, written = backend.set_state(pickle.dumps(state), token)
        if written:
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
    import time  # noqa: PLC0415

    from torch.distributed import TCPStore  # noqa: PLC0415
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (  # noqa: PLC0415
        C10dRendezvousBackend,
    )

    host, _, port = endpoint.rpartition(":")
    store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s))
    if rendezvous == "barrier":
        key = BARRIER_SHUTDOWN_KEY.format(run_id=run_id)
        return bool(store.check([key]) and store.delete_key(key))
    backend = C10dRendezvousBackend(store, run_id)
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
