"""Background persistence: one NVRx persistent worker process per disk tier, guarded by a timeout.

Why NVRx's AsyncCallsQueue (persistent=True, our own AsyncRequest, no_dist=True) rather than
torch.distributed.checkpoint.async_save: measured on this machine (`nvrx-eks bench checkpoint`,
shared notes section 5), DCP's default stager allocates fresh buffers on every call and stalled the
loop 6-14x the memcpy floor, while staging into our own reused, pre-faulted shared-memory buffers and
handing only their *path* to the NVRx worker stalls ~1x the floor: the request pickles a few hundred
bytes, the worker maps the slot itself. The same holds on GPU, where the slot is additionally pinned
(cudaHostRegister) and filled on a side stream; NVRx's CUDA-only helpers (TorchAsyncCheckpoint) are not
needed for that. DCP stays the comparison in the benchmark.

NVRx 0.4.1 gaps handled here (shared notes section 6): a dead worker would leave its caller waiting
forever, so completions are polled without blocking and every call carries a deadline; a hung or dead
worker is killed and replaced, never joined. The worker dies with its trainer (PR_SET_PDEATHSIG), so a
kill -9 of a rank leaves no orphan writing behind the restarted one.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import mmap
import os
import signal
import time
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from training.checkpoint.storage import open_store

if TYPE_CHECKING:
    from nvidia_resiliency_ext.checkpointing.async_ckpt.core import AsyncCallsQueue

_PR_SET_PDEATHSIG = 1
_worker_ready = False


def _become_worker() -> None:
    """Once per worker process: die with the parent."""
    global _worker_ready  # noqa: PLW0603 - per-process one-time setup
    if _worker_ready:
        return
    _worker_ready = True
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass  # not Linux: the orphan finishes its write and exits with the queue
    if os.getppid() == 1:  # parent already gone before prctl took effect
        os._exit(1)
    # Background persistence yields the cores to the loop and its snapshot copy: on a host with few
    # free cores (2 here) an equal-priority writer delayed the copy past the next update's fence.
    with contextlib.suppress(OSError):
        os.nice(10)


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
    result_path: str,
    delay_s: float = 0.0,
) -> None:
    """Runs in the worker: write one staged slot to a tier, commit, prune, and record the outcome."""
    _become_worker()
    outcome: dict[str, Any] = {"ok": True}
    started = time.monotonic()
    try:
        if delay_s:  # test hook: widen the window a kill can land in
            time.sleep(delay_s)
        store = open_store(tier=tier, location=location, fsync=fsync)
        with open(slot_path, "rb") as source:  # noqa: PTH123
            mapped = mmap.mmap(source.fileno(), data_bytes, prot=mmap.PROT_READ) if data_bytes else None
            view = memoryview(mapped) if mapped is not None else memoryview(b"")
            try:
                manifest = store.commit(step=step, rank=rank, world_size=world_size, chunks=[header, view])
            finally:
                view.release()
                if mapped is not None:
                    mapped.close()
        outcome["pruned"] = store.prune(rank=rank, keep=keep)
        outcome["nbytes"] = manifest.nbytes
    except Exception as exc:  # noqa: BLE001 - every failure is reported to the trainer, none kills the worker
        outcome = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}
    outcome["seconds"] = time.monotonic() - started
    tmp = f"{result_path}.tmp"
    with open(tmp, "w") as out:  # noqa: PTH123
        json.dump(outcome, out)
    Path(tmp).replace(result_path)


def _noop() -> None:
    _become_worker()


@dataclass
class _InFlight:
    call_idx: int
    step: int
    slot: int
    started: float
    result_path: Path


class PersistWorker:
    """One tier's background writer. `submit` never blocks on the previous call; `poll` reports."""

    def __init__(self, *, tier: str, rank: int, timeout_s: float, result_dir: Path) -> None:
        self.tier = tier
        self.rank = rank
        self.timeout_s = timeout_s
        self.result_dir = result_dir
        self._queue: Any = None
        self.inflight: _InFlight | None = None

    @property
    def busy(self) -> bool:
        return self.inflight is not None

    def warm(self) -> bool:
        """The worker process is up (its warm-up call finished)."""
        if self._queue is None:
            return False
        self._queue.maybe_finalize_async_calls(blocking=False, no_dist=True)
        return self.inflight is not None or not self._queue.async_calls

    def _ensure_queue(self) -> AsyncCallsQueue:
        if self._queue is None:
            from nvidia_resiliency_ext.checkpointing.async_ckpt.core import (  # noqa: PLC0415
                AsyncCallsQueue,
                PersistentAsyncCaller,
            )

            self._queue = AsyncCallsQueue(persistent=True)
            caller = PersistentAsyncCaller()
            # schedule_async_call asks torch.distributed for the rank when unset; there may be no
            # process group (single process, or between in-process restarts).
            caller.rank = self.rank
            self._queue.persistent_caller = caller
        return self._queue

    def start(self) -> None:
        """Spawn the worker now (it imports torch: seconds) instead of at the first persist."""
        from nvidia_resiliency_ext.checkpointing.async_ckpt.core import AsyncRequest  # noqa: PLC0415

        # Not counted as in flight: the queue is FIFO, a persist submitted meanwhile runs after it.
        self._ensure_queue().schedule_async_request(AsyncRequest(_noop, (), []))

    def submit(self, *, step: int, slot: int, **kwargs: object) -> None:
        from nvidia_resiliency_ext.checkpointing.async_ckpt.core import AsyncRequest  # noqa: PLC0415

        if self.inflight is not None:
            raise RuntimeError(f"{self.tier} worker is busy")
        result_path = self.result_dir / f"result-{self.tier}-{step}-{uuid.uuid4().hex[:8]}.json"
        request = AsyncRequest(
            persist_slot,
            (),
            [],
            async_fn_kwargs={**kwargs, "step": step, "result_path": str(result_path)},
        )
        idx = self._ensure_queue().schedule_async_request(request)
        self.inflight = _InFlight(idx, step, slot, time.monotonic(), result_path)

    def poll(self, *, now: float | None = None) -> dict[str, Any] | None:
        """The finished call's outcome (ok/error/timeout/died), or None while running or idle."""
        call = self.inflight
        if call is None:
            return None
        self._queue.maybe_finalize_async_calls(blocking=False, no_dist=True)
        # The indices that call returns are the requests' own call_idx, which NVRx 0.4.1 leaves at 0
        # on the copy it keeps; what is still queued is what is reliable.
        if all(active.idx != call.call_idx for active in self._queue.async_calls):
            self.inflight = None
            try:
                outcome = json.loads(call.result_path.read_text())
            except (OSError, ValueError) as exc:
                outcome = {"ok": False, "error": f"worker finished without a result: {exc}"}
            call.result_path.unlink(missing_ok=True)
            return {**outcome, "step": call.step, "slot": call.slot}
        process = self._queue.persistent_caller.process
        elapsed = (now or time.monotonic()) - call.started
        if process is not None and not process.is_alive():
            return self._abandon(call, f"worker died (exit code {process.exitcode})", kind="died")
        if elapsed > self.timeout_s:
            return self._abandon(
                call, f"no completion after {elapsed:.1f}s (timeout {self.timeout_s}s)", kind="timeout"
            )
        return None

    def _abandon(self, call: _InFlight, message: str, *, kind: str) -> dict[str, Any]:
        self.kill()
        call.result_path.unlink(missing_ok=True)
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
        """Kill the worker without joining anything (its queues may be wedged); the next submit
        starts a fresh one."""
        queue, self._queue, self.inflight = self._queue, None, None
        if queue is None or queue.persistent_caller is None:
            return
        caller = queue.persistent_caller
        if caller.process is not None:
            caller.process.kill()
            caller.process.join(timeout=5)
        caller.process = None  # makes NVRx's close()/__del__ a no-op instead of a join on a dead queue
        queue.async_calls.clear()

    def close(self, *, timeout_s: float = 10.0) -> None:
        queue = self._queue
        if queue is None:
            return
        caller = queue.persistent_caller
        if self.inflight is None and caller is not None and caller.process is not None:
            caller.queue.put("DONE")
            caller.process.join(timeout=timeout_s)
        self.kill()
