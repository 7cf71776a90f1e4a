"""What a process forked from a rank (without exec) must not keep of it.

NVRx's in-process Wrapper forks its monitor process from the rank, and that process can outlive the
rank (it waits at the in-process barriers for ranks that will never come). A copy of a socket the rank
owns keeps that socket's connection or port alive after the rank ended: the launcher waited for the
rank's monitor connection to close before it let the next worker in, and the next worker could not bind
the rank's metrics port. `close_in_forks` closes the child's copy; the rank's own stays open.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import socket
    from collections.abc import Callable


def close_in_forks(current: Callable[[], socket.socket | None]) -> None:
    """In every process forked from this one from now on, close that process's copy of the socket
    `current()` returns then (None: nothing to close). Only the copy: `close`, never `shutdown`, which
    would end the connection or the listener for this process too."""

    def close_copy() -> None:
        sock = current()
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    os.register_at_fork(after_in_child=close_copy)
