"""The checkpoint stall's floor: a state's bytes over this host's memory copy bandwidth.

A snapshot into host memory cannot take less than one copy of the state, so the trainer reports its
loop stall against this floor (`startup_done` events) and `bench checkpoint` its rows; both measure it
here, so the two floors are the same quantity.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from nvrx_eks.training.checkpoint.shard import flatten

PROBE_MIN_BYTES = 1 << 20
PROBE_MAX_BYTES = 256 << 20
"""The copy probed is the state's size within these bounds: large enough to leave the caches, small
enough that probing a large state costs milliseconds (the trainer probes at every start)."""


def state_bytes(state: dict[str, Any]) -> int:
    """The bytes a snapshot of `state` copies: its tensors, each aligned as in a shard."""
    return flatten(state)[2].data_bytes


def copy_bandwidth(nbytes: int, *, repeats: int = 1) -> float:
    """Bytes/s of one contiguous copy into a pre-faulted buffer, the best of `repeats` copies."""
    size = max(PROBE_MIN_BYTES, min(nbytes, PROBE_MAX_BYTES))
    src = torch.ones(size, dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)  # fault the pages in: a snapshot's staging buffer is reused, its pages resident
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - started)
    return size / max(best, 1e-9)
