"""Background persistence: one writer thread per disk tier, guarded by a timeout.

A persist writes the slot's tensors as this rank's torch.distributed.checkpoint files (dcp_format.py),
straight from the mapped slot: DCP's writer serializes each tensor from its view, so nothing is copied
in between.

Why threads, not worker processes such as NVRx's AsyncCallsQueue(persistent=True): a persist is a
sequential read of a staged slot, CRC32 and file writes -- `write`, `fsync` and `zlib.crc32` on large
buffers all release the GIL, so a thread costs the loop no more than a process does (the bench's loop,
bench/checkpoint/bench.py `run_loop`, measures them side by side). A process costs what a
thread does not: a spawned interpreter importing torch again, two per rank (local, durable), started
again on every launcher restart, which on a host with few cores is a large share of a hard-fault
recovery's CPU (docs/measurements.md), plus multiprocessing semaphores in /dev/shm and a pynvml warning
per worker in the logs. A thread starts in microseconds and dies with its rank, so a kill -9 leaves no
orphan writing behind the restarted one. On GPU nothing changes: the slot is pinned host memory filled
by a side stream, and the thread persists from it after the copy's event completes, as the process did.

What a thread cannot do is be killed. The timeout guard therefore abandons, never waits: a persist
running past `timeout_s` is reported, its thread is left to finish (or hang) on its own with a
cancel flag set, and the tier's next persist gets a fresh thread. The cancel flag keeps the
no-torn-checkpoint protocol: the writer checks it after it has read every byte of the slot and
before its files are renamed into place, and the trainer reuses an abandoned slot only after setting
it -- so a write that read a slot being overwritten can never commit (storage.py: a private folder,
fsync, rename, then the manifest).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from nvrx_eks.training.checkpoint.dcp_format import Staged
from nvrx_eks.training.checkpoint.shard import fill, header_key, parse_header
from nvrx_eks.training.checkpoint.storage import open_store

if TYPE_CHECKING:
    from torch.distributed.checkpoint.planner import SavePlan


def persist_slot(
    *,
    tier: str,
    location: str,
    fsync: bool,
    slot_path: str,
    header: bytes,
    data_bytes: int,
    step: int,
    rank: int,
    world_size: int,
    keep: int,
    cancelled: threading.Event,
    plan: SavePlan,
    delay_s: float = 0.0,
    complete: int | None = None,
    finalize: bool = False,
) -> dict[str, Any]:
    """Write one staged slot to a tier as this rank's DCP files, commit, prune (job-wide when
    `complete`, the newest step every rank has committed, is given: `ShardStore.prune`); with
    `finalize` (rank 0 of a shared tier), write the global metadata of that complete step too, so
    plain `torch.distributed.checkpoint.load` reads it at any world size. Returns the outcome (never
    raises)."""
    outcome: dict[str, Any] = {"ok": True}
    started = time.monotonic()
    if delay_s and cancelled.wait(delay_s):  # test hook: widen the window a kill or timeout lands in
        return {"ok": False, "error": "Cancelled: abandoned while delayed", "seconds": delay_s}
    try:
        store = open_store(tier=tier, location=location, fsync=fsync)
        skeleton, layout, _ = parse_header(header)
        with open(slot_path, "rb") as source:  # noqa: PTH123
            # Copy-on-write, never written: torch.frombuffer of a read-only mapping warns.
            mapped = mmap.mmap(source.fileno(), data_bytes, access=mmap.ACCESS_COPY) if data_bytes else None
        try:
            data = (
                torch.frombuffer(memoryview(mapped), dtype=torch.uint8, count=data_bytes)
                if mapped is not None
                else torch.empty(0, dtype=torch.uint8)
            )
            staged = Staged(tree=fill(skeleton, layout, data), plan=plan, key=header_key(header))
            manifest = store.commit(
                step=step, rank=rank, world_size=world_size, staged=staged, cancelled=cancelled
            )
        finally:
            # After a failed commit its traceback still holds views of the mapping: then the
            # mapping closes when that traceback is freed, a moment later.
            staged = data = None  # type: ignore[assignment]
            with contextlib.suppress(BufferError):
                if mapped is not None:
                    mapped.close()
        outcome["pruned"] = store.prune(rank=rank, keep=keep, complete=complete)
        outcome["nbytes"] = manifest.nbytes
        if finalize and complete is not None and complete >= 0:
            outcome["finalized"] = complete if store.finalize(complete, world_size) else None
    except Exception as exc:  # noqa: BLE001 - every failure is reported to the trainer, none kills the writer
        outcome = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}
    outcome["seconds"] = time.monotonic() - started
    return outcome


@dataclass
class _Call:
    step: int
    slot: int
    kwargs: dict[str, Any]
    started: float
    cancelled: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    outcome: dict[str, Any] | None = None


def _writer(requests: queue.SimpleQueue[_Call | None]) -> None:
    # Background persistence yields the cores to the loop and its snapshot copy: on a host with few
    # free cores an equal-priority writer delays the copy past the next update's fence.
    # Linux nice values are per thread: this lowers the writer only.
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    while (call := requests.get()) is not None:
        call.outcome = persist_slot(**call.kwargs, step=call.step, cancelled=call.cancelled)
        call.done.set()


class PersistWorker:
    """One tier's background writer. `submit` never blocks on the previous call; `poll` reports."""

    def __init__(self, *, tier: str, rank: int, timeout_s: float) -> None:
        self.tier = tier
        self.rank = rank
        self.timeout_s = timeout_s
        self._thread: threading.Thread | None = None
        self._requests: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self.inflight: _Call | None = None

    @property
    def busy(self) -> bool:
        return self.inflight is not None

    @property
    def alive(self) -> bool:
        """The writer thread runs (started and not yet closed)."""
        return self._thread is not None and self._thread.is_alive()

    def warm(self) -> bool:
        """The writer is ready to take a persist (a thread is ready as soon as it is started)."""
        return self.alive

    def start(self) -> None:
        if self.alive:
            return
        self._requests = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=_writer, args=(self._requests,), name=f"ckpt-persist-{self.tier}", daemon=True
        )
        self._thread.start()

    def submit(self, *, step: int, slot: int, **kwargs: Any) -> None:  # noqa: ANN401
        if self.inflight is not None:
            raise RuntimeError(f"{self.tier} worker is busy")
        self.start()
        call = _Call(step=step, slot=slot, kwargs=kwargs, started=time.monotonic())
        self._requests.put(call)
        self.inflight = call

    def poll(self, *, now: float | None = None) -> dict[str, Any] | None:
        """The finished call's outcome (ok/error/timeout/died), or None while running or idle."""
        call = self.inflight
        if call is None:
            return None
        if call.done.is_set():
            self.inflight = None
            assert call.outcome is not None  # noqa: S101 - set before done
            return {**call.outcome, "step": call.step, "slot": call.slot}
        elapsed = (now or time.monotonic()) - call.started
        if not self.alive:
            return self._abandon(call, "writer thread died", kind="died")
        if elapsed > self.timeout_s:
            return self._abandon(
                call, f"no completion after {elapsed:.1f}s (timeout {self.timeout_s}s)", kind="timeout"
            )
        return None

    def _abandon(self, call: _Call, message: str, *, kind: str) -> dict[str, Any]:
        self.kill()
        return {"ok": False, "kind": kind, "error": message, "step": call.step, "slot": call.slot}

    def wait(self, *, deadline: float) -> dict[str, Any] | None:
        while self.inflight is not None:
            outcome = self.poll()
            if outcome is not None or self.inflight is None:
                return outcome
            if time.monotonic() > deadline:
                return self._abandon(self.inflight, "still running at close", kind="timeout")
            time.sleep(0.01)
        return None

    def kill(self) -> None:
        """Abandon the writer without waiting for it: its call is cancelled (it will not commit), and
        the thread exits once that call returns (or never, if its write hangs); the next submit
        starts a fresh thread."""
        if self.inflight is not None:
            self.inflight.cancelled.set()
        self.inflight = None
        if self._thread is not None:
            self._requests.put(None)
        self._thread = None

    def close(self, *, timeout_s: float = 10.0) -> None:
        thread = self._thread
        if thread is not None and self.inflight is None:
            self._requests.put(None)
            thread.join(timeout=timeout_s)
        self.kill()
