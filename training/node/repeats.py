"""Node problems the job's pods report, compared across nodes: one that repeats on another node is the
configuration's, not a node's.

The self-check classes a failure as the node's (exit 75) when another node may well pass: GPUs or EFA
devices missing, a driver that does not answer, the node's own disk. The Job then replaces the pod
without charging its budget. But a cause every node shares (a driver the image's CUDA does not accept,
a device plugin that advertises nothing, a node image without the array) fails every pod the same way,
and replacing pods for free never ends. So each pod records its node problems in the job's rendezvous
store, which every pod of the job reaches and which outlives any one of them, and reads what the other
nodes recorded: the same check failed on another node since any pod last passed makes it a
configuration problem, with both nodes named, and the Job fails with that reason (exit 2).

A pass starts a new count: a node that passes shows the configuration can work, so two nodes that
fail the same check weeks apart, each with a pass between, stay node problems. Two nodes that fail
the same check before any pod has passed read as configuration: a job whose first pods meet two bad
nodes at once fails with the reason, rather than waiting on a configuration fault pod by pod.

The keys live under `nvrx-eks/selfcheck/` beside NVRx's own; when the store restarts (the rendezvous
closed for good), the count starts again.
"""

from __future__ import annotations

import socket
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence

PREFIX = "nvrx-eks/selfcheck"
STORE_TIMEOUT_S = 10.0
"""How long a pod waits for the rendezvous store (it may start beside the first pods; its headless
Service's name resolves only once its pod is ready)."""


class Store(Protocol):
    """What is used of torch.distributed.TCPStore."""

    def add(self, key: str, amount: int, /) -> int: ...
    def append(self, key: str, value: str, /) -> None: ...
    def get(self, key: str, /) -> bytes: ...


def connect(endpoint: str, *, timeout_s: float = STORE_TIMEOUT_S) -> Store:
    """A client of the job's rendezvous store at HOST:PORT; OSError when it does not answer within
    `timeout_s`. The port is tried with a plain socket first: TCPStore's own retries log a C++ stack
    trace per attempt into the pod's log, whose tail is the pod's termination message."""
    from torch.distributed import TCPStore  # noqa: PLC0415 - the self-check imports torch anyway

    host, _, port = endpoint.rpartition(":")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=max(0.1, min(2.0, timeout_s))).close()
            break
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise ConnectionError(f"{endpoint}: {exc}") from None
            time.sleep(0.5)
    # torch's stub of TCPStore leaves out append, which the class has (torch.distributed.Store).
    return TCPStore(  # type: ignore[return-value]
        host, int(port), is_master=False, wait_for_workers=False, timeout=timedelta(seconds=timeout_s)
    )


def record_pass(store: Store) -> None:
    """This pod's node passed: what failed before counts again from nought."""
    store.add(f"{PREFIX}/passes", 1)


def record_failures(store: Store, *, node: str, checks: Sequence[str]) -> dict[str, list[str]]:
    """Record that `checks` (node problems) failed on `node`; for each, the other nodes where it failed
    since any pod last passed, in the order they reported it."""
    passes = store.add(f"{PREFIX}/passes", 0)
    elsewhere = {}
    for check in checks:
        base = f"{PREFIX}/{passes}/{check}"
        if store.add(f"{base}/on/{node}", 1) == 1:
            store.append(f"{base}/nodes", f"{node}\n")
        nodes = dict.fromkeys(store.get(f"{base}/nodes").decode().split())
        elsewhere[check] = [other for other in nodes if other != node]
    return elsewhere
