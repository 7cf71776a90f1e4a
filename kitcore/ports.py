"""A TCP port held for a server that binds it later, so that nothing else takes it meanwhile.

A port found by binding port 0 and closing the socket is free only at that moment. Until its server
binds it, the kernel may hand it to any other socket: another bind to port 0, or the local end of an
outgoing connection (both draw from the same ephemeral range, `net.ipv4.ip_local_port_range`). The
server then fails with EADDRINUSE; a client that keeps connecting to the free port may even connect to
itself (TCP's simultaneous open) and hold it.

`ReservedPort` keeps the port bound, never listening, with SO_REUSEADDR set once bound. On Linux the
kernel then gives it neither to a bind to port 0 nor to an outgoing connection nor to another hold, and
a server that sets SO_REUSEADDR too binds and listens on it beside the hold: torch's TCPStore, Python's
`http.server` (so the trainer's metrics endpoint), Go's listeners (Prometheus). A server without
SO_REUSEADDR cannot bind it while it is held. Hold it for as long as a server of this port may bind it
again (a restarted store binds the same port), and release it after. The hold is the process's own: a
process forked from it closes its copy, so that a fork that outlives its parent (NVRx's in-process
monitor) does not keep the port.
"""

from __future__ import annotations

import os
import socket
import weakref
from typing import TYPE_CHECKING, Self

if TYPE_CHECKING:
    from types import TracebackType

_holds: weakref.WeakSet[socket.socket] = weakref.WeakSet()


def _close_copies() -> None:
    for held in list(_holds):
        held.close()  # this process's copy of the descriptor; the parent's hold stays


os.register_at_fork(after_in_child=_close_copies)


def _hold(port: int) -> socket.socket:
    held = socket.socket()
    try:
        held.bind(("", port))
    except OSError:
        held.close()
        raise
    return held


RESERVE_TRIES = 100
"""How many first ports `ReservedPort` tries before it gives up finding a free run of `count` after one."""


class ReservedPort:
    """`count` consecutive free TCP ports on every interface from `port` on, held by this process until
    `release` (or the `with` ends). Several servers of one kind each bind the base port plus their index
    (the trainer's metrics endpoint: one per local rank)."""

    def __init__(self, count: int = 1) -> None:
        for _ in range(RESERVE_TRIES):
            first = _hold(0)
            self.port: int = int(first.getsockname()[1])
            self._held = [first]
            try:
                self._held += [_hold(self.port + offset) for offset in range(1, count)]
            except (OSError, OverflowError):  # a port after the first is taken, or past 65535: another run
                self.release()
                continue
            for held in self._held:
                # Set only now: a hold binds without address reuse, so it fails where anything else is
                # bound, even another hold; with reuse set afterwards, the port's server binds beside it.
                held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                _holds.add(held)
            return
        raise OSError(f"no {count} consecutive free TCP ports found in {RESERVE_TRIES} tries")

    def release(self) -> None:
        """Let the kernel hand the ports to any socket again; idempotent."""
        for held in self._held:
            held.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.release()
