"""NVRx's own checkpointing on `bench checkpoint`'s loop, beside the kit's rows.

Measurable on CPU: NVRx's async queue with DCP -- `AsyncCallsQueue` (its persistent worker process)
with `FileSystemWriterAsync` and `save_state_dict_async_plan`, in the CPU shared-memory mode
(`cpu_shm_mode=True`, `use_cpu_shm_for_gpu_tensors=True`): each save copies every tensor into
shared-memory snapshots on the caller's thread, the worker writes them to disk. The writer's
structure cache is on (`use_cached_data_structure`), so the snapshots are allocated once and reused,
as a training job runs it.

Two seams of that path call CUDA and are replaced here by what they do for one rank, nothing more:
`save_state_dict_async_finalize` broadcasts its failure flag from
`torch.cuda.current_device()`, so the finalize here writes the metadata itself
(`retrieve_write_results` then `finish`, its one-rank body); and `AsyncRequest.execute_finalize_fns`
all-reduces the call index on CUDA unless `no_dist=True`, which one rank passes.

Not measurable on CPU: the paths in `CPU_ONLY_REASONS`, each with the line of NVRx that stops it
(printed as the row); bench/gpu_check.py measures them on a GPU.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from nvrx_eks.bench.checkpoint.benchstate import forward_backward, make_state

ROW_TIMEOUT_S = 600
"""A row's child process is killed past this: a worker that dies leaves NVRx's queue waiting forever
(`PersistentAsyncCaller.is_current_async_call_done` polls its completion queue with no deadline)."""

CPU_ONLY_REASONS = {
    "nvrx async DCP (CUDA IPC)": (
        "async_ckpt/core.py PersistentAsyncCaller.async_process_target: `device_id = rank % "
        "torch.cuda.device_count()` unless cpu_shm_mode (ZeroDivisionError with no GPU)"
    ),
    "nvrx TorchAsyncCheckpoint": (
        "async_ckpt/torch_ckpt.py TorchAsyncCheckpoint.async_save calls torch.cuda.synchronize() "
        "after preload_tensors (AssertionError: Torch not compiled with CUDA enabled)"
    ),
    "nvrx local + replication": (
        "local/basic_state_dict.py BasicTensorAwareStateDict: `assert state_dict_value.is_cuda`; "
        "BaseCheckpointManager.save(is_async=True) calls torch.cuda.synchronize(); a replica's "
        "retrieval (GroupWrapper.isend_state_dict) sends `ten.cuda()`"
    ),
}
"""NVRx's checkpointing paths this CPU cannot run, with the line of NVRx that stops each."""


@dataclass(frozen=True)
class NvrxRow:
    """One NVRx row: the columns the side-by-side table prints for the kit's rows too."""

    implementation: str
    every: int
    interval_s: float
    stall_s: float
    """Median loop stall per checkpoint: its save plus the next update's fence."""
    efficiency: float
    """1 - (time in save and fence) / wall."""
    first_save_s: float
    """The first save of a fresh process (a restarted rank), one interval after its start: allocating
    and sending the shared-memory snapshots, planning without a cache."""
    restore_s: float
    """Reading the newest checkpoint back into the state (DCP load, NVRx's metadata reader)."""
    persisted: dict[str, int] = field(default_factory=dict)
    persist_s: float | None = None
    """Median seconds from scheduling a save to its finalize seeing it written."""


def _timed(fn: Any) -> float:  # noqa: ANN401 - any callable
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


class NvrxAsyncDcp:
    """NVRx's async DCP save of one rank (see the module docstring). `cpu_shm`: the CPU shared-memory
    mode this machine runs; without it (a GPU), the worker receives CUDA IPC handles and copies the
    tensors to host itself while the caller waits."""

    def __init__(self, root: Path, *, cpu_shm: bool = True) -> None:
        from nvidia_resiliency_ext.checkpointing.async_ckpt.core import AsyncCallsQueue  # noqa: PLC0415
        from nvidia_resiliency_ext.checkpointing.async_ckpt.state_dict_saver import (  # noqa: PLC0415
            CheckpointMetadataCache,
        )

        self.root = root
        # Started now, as a trainer starts it at launch, not inside the first save.
        AsyncCallsQueue.warmup_persistent_caller(rank=0, cpu_shm_mode=cpu_shm)
        self.queue = AsyncCallsQueue(persistent=True, cpu_shm_mode=cpu_shm)
        self.cpu_shm = cpu_shm
        self.cache = CheckpointMetadataCache()
        self.scheduled: dict[int, float] = {}
        self.persist_s: list[float] = []
        self.committed: list[int] = []

    def save(self, step: int, state: dict[str, Any]) -> None:
        from nvidia_resiliency_ext.checkpointing.async_ckpt.core import AsyncRequest  # noqa: PLC0415
        from nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async import (  # noqa: PLC0415
            FileSystemWriterAsync,
        )
        from nvidia_resiliency_ext.checkpointing.async_ckpt.state_dict_saver import (  # noqa: PLC0415
            save_state_dict_async_plan,
        )
        from torch.distributed.checkpoint import CheckpointException  # noqa: PLC0415
        from torch.distributed.checkpoint.default_planner import DefaultSavePlanner  # noqa: PLC0415
        from torch.distributed.checkpoint.utils import _get_failure_dict  # noqa: PLC0415

        writer = FileSystemWriterAsync(
            self.root / f"step-{step:07d}",
            use_cached_data_structure=True,
            use_cpu_shm_for_gpu_tensors=self.cpu_shm,
        )
        writer, metadata, _ = save_state_dict_async_plan(
            state, writer, None, 0, planner=DefaultSavePlanner(), enable_cache=True, metadata_cache=self.cache
        )
        cached = self.cache.cached_global_metadata
        write, preload, args = writer.get_save_function_and_args()

        def finalize() -> None:
            # save_state_dict_async_finalize's one-rank body, without its CUDA failure broadcast.
            results = writer.retrieve_write_results()
            failures = _get_failure_dict([results])
            if failures:
                raise CheckpointException("write", failures)
            writer.finish(metadata if metadata is not None else cached, [results])
            self.persist_s.append(time.perf_counter() - self.scheduled.pop(step))
            self.committed.append(step)

        self.scheduled[step] = time.perf_counter()
        self.queue.schedule_async_request(AsyncRequest(write, args, [finalize], preload_fn=preload))

    def fence(self, *, blocking: bool = False) -> None:
        self.queue.maybe_finalize_async_calls(blocking=blocking, no_dist=True)

    def restore(self, state: dict[str, Any]) -> float:
        import torch.distributed.checkpoint as dcp  # noqa: PLC0415
        from nvidia_resiliency_ext.checkpointing.async_ckpt.cached_metadata_filesystem_reader import (  # noqa: PLC0415
            CachedMetadataFileSystemReader,
        )

        newest = self.root / f"step-{self.committed[-1]:07d}"
        return _timed(lambda: dcp.load(state, storage_reader=CachedMetadataFileSystemReader(newest)))

    def close(self) -> None:
        self.queue.close()


def _async_dcp_row(kwargs: dict[str, Any], out: str) -> None:
    """The row's child process: its own group (killed whole on a timeout) and a one-rank gloo group
    (NVRx reads its rank from torch.distributed)."""
    import torch.distributed as dist  # noqa: PLC0415

    os.setpgid(0, 0)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    root = Path(kwargs["root"])
    kind, step_s, every, checkpoints = (
        kwargs["kind"],
        kwargs["step_s"],
        kwargs["every"],
        kwargs["checkpoints"],
    )
    state = make_state(kwargs["state_bytes"])
    ckpt = NvrxAsyncDcp(root)
    try:
        work = torch.randn(256, 256)
        update = state["model"]["layer0.weight"][:4096]
        # A restarted rank's first save: one interval of steps after start (the worker warmed up
        # meanwhile), then the shared-memory snapshots allocated, sent to the worker and planned
        # without a cache. run_loop times the kit's first save the same way.
        for _ in range(every):
            forward_backward(kind, step_s, work)

        def first_save() -> None:
            ckpt.save(0, state)
            ckpt.fence()

        first = _timed(first_save)
        ckpt.fence(blocking=True)
        ckpt.persist_s.clear()
        stalls: list[float] = []
        stalled = pending = 0.0
        started = time.perf_counter()
        for step in range(1, every * checkpoints + 1):
            forward_backward(kind, step_s, work)
            fence_s = _timed(ckpt.fence)
            stalled += fence_s
            if pending:
                stalls.append(pending + fence_s)
                pending = 0.0
            update.add_(1.0)
            state["data"]["step"] = step
            if step % every == 0:
                pending = _timed(lambda s=step: ckpt.save(s, state))
                stalled += pending
        wall = time.perf_counter() - started
        ckpt.fence(blocking=True)
        row = NvrxRow(
            implementation="nvrx async DCP",
            every=every,
            interval_s=every * step_s,
            stall_s=statistics.median(stalls) if stalls else 0.0,
            efficiency=1 - stalled / wall,
            first_save_s=first,
            restore_s=ckpt.restore(state),
            persisted={"local": len(ckpt.committed) - 1},
            persist_s=statistics.median(ckpt.persist_s) if ckpt.persist_s else None,
        )
        Path(out).write_text(json.dumps(asdict(row)))
    finally:
        ckpt.close()
        dist.destroy_process_group()


def run_async_dcp_row(
    *, root: Path, state_bytes: int, kind: str, step_s: float, every: int, checkpoints: int
) -> NvrxRow:
    """NVRx's async DCP row: run_loop's shape (forward/backward, fence, update, save every `every`
    steps, `checkpoints` of them) on the same state, in a spawned process killed past
    `ROW_TIMEOUT_S` with everything it started."""
    root.mkdir(parents=True, exist_ok=True)
    out = root / "row.json"
    kwargs = {
        "root": str(root),
        "state_bytes": state_bytes,
        "kind": kind,
        "step_s": step_s,
        "every": every,
        "checkpoints": checkpoints,
    }
    child = multiprocessing.get_context("spawn").Process(target=_async_dcp_row, args=(kwargs, str(out)))
    child.start()
    try:
        child.join(ROW_TIMEOUT_S)
    finally:
        with contextlib.suppress(ProcessLookupError, TypeError):  # TypeError: no pid, never started
            os.killpg(child.pid, signal.SIGKILL)  # type: ignore[arg-type]  # its NVRx worker too
        child.kill()  # before its setpgid, the group does not exist yet
        child.join()
    try:
        if child.exitcode != 0 or not out.exists():
            raise RuntimeError(f"NVRx async DCP row exited {child.exitcode} (timeout {ROW_TIMEOUT_S} s)")
        return NvrxRow(**json.loads(out.read_text()))
    finally:
        shutil.rmtree(root, ignore_errors=True)
