"""`make gpu-check`: the kit's GPU-only paths on one machine with a GPU, in under 5 minutes.

Four checks, each printing its numbers, then `gpu-check.json` in the run folder:

1. the `gpu`-marked tests (FSDP2 over NCCL, save and resume through the checkpointer);
2. the snapshot stall on the GPU path: the trainer's checkpointer copies the state into pinned host
   slots on a side stream; the loop pays only for launching that copy and for the next update's fence.
   The floor is state bytes / device-to-host bandwidth measured in the same run (pinned buffer,
   best of 3); a stall well below 1x the floor means the copy overlapped the step;
3. an in-process restart that aborts NCCL: one GPU, mode `inprocess`, an exception and a real CUDA
   allocation failure injected; NVRx's default abort (AbortTorchDistributed) tears the NCCL communicator
   down and the same process goes on from memory. Each fault's layer, recovery and steps lost come
   from the run's own events (localrun.summary.summarize);
4. NVRx's GPU-only checkpointing rows, which `bench checkpoint` prints as "not measurable on CPU"
   (bench/checkpoint/nvrx_bench.py): TorchAsyncCheckpoint, LocalCheckpointManager (async,
   BasicTensorAwareStateDict) and the async queue with DCP over CUDA IPC, on check 2's loop shape,
   each with its stall over the device-to-host floor of its own (smaller) state, its first save and
   its restore; stopped past NVRX_TIMEOUT_S.
   Local checkpointing's replication needs two ranks on two GPUs; one GPU measures the local save
   and restore it replicates.

Without CUDA it prints "no CUDA: skipped" and exits 0, so it can run anywhere as it is.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TESTS_TIMEOUT_S = 150
RESTART_TIMEOUT_S = 90
STAGING_STATE_GB = 2.0
STAGING_STEP_S = 0.05
STAGING_SNAPSHOTS = 8
NVRX_STATE_GB = 0.5
"""NVRx's rows: a smaller state than check 2's (stall over floor compares, the floor measured on it)
so that their writes fit the budget."""
NVRX_TIMEOUT_S = 40
"""NVRx's rows are stopped past this: a worker that dies leaves NVRx's queue waiting forever."""


def _gpu_tests() -> dict[str, Any]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TESTS_TIMEOUT_S,
        check=False,
    )
    tail = done.stdout.strip().splitlines()[-1:] or [""]
    return {"ok": done.returncode == 0, "summary": tail[0], "seconds": round(time.monotonic() - started, 1)}


def _d2h_bandwidth(nbytes: int) -> float:
    """Bytes/s of one device-to-host copy into a pinned buffer (best of 3): the stall floor's rate."""
    import torch  # noqa: PLC0415

    src = torch.ones(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    best = float("inf")
    for _ in range(3):
        torch.cuda.synchronize()
        started = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - started)
    return nbytes / best


def _staging_stall(workdir: Path) -> dict[str, Any]:
    import torch  # noqa: PLC0415

    from nvrx_eks.training.checkpoint.config import CheckpointConfig  # noqa: PLC0415
    from nvrx_eks.training.checkpoint.factory import build_checkpointer  # noqa: PLC0415

    per = int(STAGING_STATE_GB * 1e9) // 4 // 8
    model = {f"w{i}": torch.randn(per, device="cuda") for i in range(8)}
    data = {"step": 0}
    state: dict[str, Any] = {"model": model, "data": data}
    nbytes = per * 4 * 8
    floor_s = nbytes / _d2h_bandwidth(nbytes)
    config = CheckpointConfig(memory_dir=workdir / "shm", memory_every=1, local_every=0, durable_every=0)
    ckpt = build_checkpointer(config, rank=0, world_size=1, device=torch.device("cuda"))
    # The trainer's loop shape: compute (the GPU busy, the host free), fence, update, save.
    cycles = int(STAGING_STEP_S * torch.cuda.get_device_properties(0).clock_rate * 1e3)
    stalls: list[float] = []
    try:
        ckpt.save(0, state)  # allocates, pins and pre-faults the slots: setup, not steady state
        ckpt.wait()
        for step in range(1, STAGING_SNAPSHOTS + 1):
            torch.cuda._sleep(cycles)  # noqa: SLF001 - a kernel that holds the device, not the host
            before = time.perf_counter()
            ckpt.fence()
            model["w0"].mul_(1.0001)  # the update: the first write to what the copy reads
            data["step"] = step
            ckpt.save(step, state)
            stalls.append(time.perf_counter() - before)
        ckpt.wait()
    finally:
        ckpt.close()
    stalls.sort()
    median = stalls[len(stalls) // 2]
    return {
        "ok": median < floor_s,
        "state_bytes": nbytes,
        "d2h_gbps": round(nbytes / floor_s / 1e9, 1),
        "floor_s": round(floor_s, 4),
        "stall_median_s": round(median, 4),
        "stall_over_floor": round(median / floor_s, 3),
    }


def _staging_stall_in_tmpfs() -> dict[str, Any]:
    # The memory tier lives in tmpfs, as the pod's memory-backed emptyDir does.
    with tempfile.TemporaryDirectory(dir="/dev/shm") as workdir:
        return _staging_stall(Path(workdir))


def _gpu_state(gb: float) -> tuple[dict[str, Any], int]:
    import torch  # noqa: PLC0415

    per = int(gb * 1e9) // 4 // 8
    return {
        "model": {f"w{i}": torch.randn(per, device="cuda") for i in range(8)},
        "data": {"step": 0},
    }, per * 4 * 8


def _nvrx_loop(save: Any, fence: Any, state: dict[str, Any]) -> dict[str, float]:  # noqa: ANN401
    """Check 2's loop shape around one of NVRx's savers: compute, fence, update, save; the first
    save timed apart (a restarted rank's), the median stall of the rest."""
    import torch  # noqa: PLC0415

    cycles = int(STAGING_STEP_S * torch.cuda.get_device_properties(0).clock_rate * 1e3)
    started = time.perf_counter()
    save(0)
    first_s = time.perf_counter() - started
    stalls: list[float] = []
    for step in range(1, STAGING_SNAPSHOTS + 1):
        torch.cuda._sleep(cycles)  # noqa: SLF001 - a kernel that holds the device, not the host
        before = time.perf_counter()
        fence()
        state["model"]["w0"].mul_(1.0001)
        state["data"]["step"] = step
        save(step)
        stalls.append(time.perf_counter() - before)
    stalls.sort()
    return {"first_save_s": round(first_s, 4), "stall_median_s": round(stalls[len(stalls) // 2], 4)}


def _nvrx_rows(workdir: Path) -> dict[str, Any]:
    """NVRx's GPU-only checkpointing on one GPU, against the same device-to-host floor as check 2."""
    import torch.distributed as dist  # noqa: PLC0415
    from nvidia_resiliency_ext.checkpointing.async_ckpt.core import AsyncCallsQueue  # noqa: PLC0415
    from nvidia_resiliency_ext.checkpointing.async_ckpt.torch_ckpt import TorchAsyncCheckpoint  # noqa: PLC0415
    from nvidia_resiliency_ext.checkpointing.local.basic_state_dict import (  # noqa: PLC0415
        BasicTensorAwareStateDict,
    )
    from nvidia_resiliency_ext.checkpointing.local.ckpt_managers.local_manager import (  # noqa: PLC0415
        LocalCheckpointManager,
    )

    from nvrx_eks.bench.checkpoint.nvrx_bench import NvrxAsyncDcp  # noqa: PLC0415

    state, nbytes = _gpu_state(NVRX_STATE_GB)
    floor_s = nbytes / _d2h_bandwidth(nbytes)
    rows: dict[str, Any] = {"floor_s": round(floor_s, 4)}
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch_ckpt = TorchAsyncCheckpoint()
        try:
            row = _nvrx_loop(
                lambda step: torch_ckpt.async_save(state, workdir / f"torch-{step % 2}.pt"),
                torch_ckpt.finalize_async_save,
                state,
            )
            torch_ckpt.finalize_async_save(blocking=True)
            row["restore_s"] = round(_timed_load(workdir / f"torch-{STAGING_SNAPSHOTS % 2}.pt"), 4)
        finally:
            torch_ckpt.close()
        rows["torch_async_checkpoint"] = row | {"stall_over_floor": round(row["stall_median_s"] / floor_s, 3)}

        manager = LocalCheckpointManager(workdir / "local")
        calls = AsyncCallsQueue()

        def local_save(step: int) -> None:
            # A fresh nesting per save: the wrapper swaps its tensors for host copies in place.
            wrapped = BasicTensorAwareStateDict({"model": dict(state["model"])})
            calls.schedule_async_request(manager.save(wrapped, step + 1, is_async=True))

        try:
            row = _nvrx_loop(local_save, lambda: calls.maybe_finalize_async_calls(no_dist=True), state)
            calls.maybe_finalize_async_calls(blocking=True, no_dist=True)
        finally:
            calls.close()
        started = time.perf_counter()
        manager.find_latest()
        manager.load()
        row["restore_s"] = round(time.perf_counter() - started, 4)
        rows["local_checkpoint_manager"] = row | {
            "stall_over_floor": round(row["stall_median_s"] / floor_s, 3)
        }

        ipc = NvrxAsyncDcp(workdir / "dcp", cpu_shm=False)
        try:
            row = _nvrx_loop(lambda step: ipc.save(step, state), ipc.fence, state)
            ipc.fence(blocking=True)
            row["restore_s"] = round(ipc.restore(state), 4)
        finally:
            ipc.close()
        rows["async_dcp_cuda_ipc"] = row | {"stall_over_floor": round(row["stall_median_s"] / floor_s, 3)}
    finally:
        dist.destroy_process_group()
    rows["ok"] = True  # figures to compare with check 2's kit row, not a pass/fail of their own
    return rows


def _timed_load(path: Path) -> float:
    import torch  # noqa: PLC0415

    started = time.perf_counter()
    torch.load(path, map_location="cuda", weights_only=True)
    torch.cuda.synchronize()
    return time.perf_counter() - started


def _nvrx_rows_in_tmpfs() -> dict[str, Any]:
    def expired(signum: int, frame: object) -> None:  # noqa: ARG001
        raise TimeoutError(f"NVRx's rows took over {NVRX_TIMEOUT_S} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(NVRX_TIMEOUT_S)
    try:
        with tempfile.TemporaryDirectory(dir="/dev/shm") as workdir:
            return _nvrx_rows(Path(workdir))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _inprocess_restart(run_dir: Path) -> dict[str, Any]:
    from nvrx_eks.localrun.summary import summarize  # noqa: PLC0415
    from nvrx_eks.training.resilience.config import CONFIG_ENV  # noqa: PLC0415

    cmd = [
        str(Path(sys.executable).parent / "torchrun"),
        "--standalone",
        "--nproc-per-node=1",
        *("-m", "nvrx_eks.training", "--model", "small", "--steps", "30"),
    ]
    # The kit's settings as any script gets them (the chart renders the same variable).
    kit = {
        "dist": {"device": "cuda"},
        "mode": "inprocess",
        "faults": {"plan": ["exception@8:0", "oom@18:0"]},
        "run_dir": str(run_dir),
        "checkpoint": {"memory_dir": str(run_dir / "shm")},
    }
    done = subprocess.run(
        cmd,
        cwd=REPO,
        env={**os.environ, CONFIG_ENV: json.dumps(kit)},
        capture_output=True,
        text=True,
        timeout=RESTART_TIMEOUT_S,
        check=False,
    )
    summary = summarize(run_dir)
    faults = [
        {"class": f.cls, "layer": f.layer, "recovery_s": f.recovery_s, "steps_lost": f.steps_lost}
        for f in summary.faults
    ]
    ok = (
        done.returncode == 0
        and summary.completed
        and len(faults) == 2
        and all(f["layer"] == "inprocess" and f["steps_lost"] == 0 for f in faults)
    )
    return {"ok": ok, "exit_code": done.returncode, "faults": faults, "stderr_tail": done.stderr[-800:]}


def main() -> int:
    import torch  # noqa: PLC0415

    if not torch.cuda.is_available():
        print("no CUDA: skipped")
        return 0
    out = REPO / "runs" / time.strftime("gpu-check-%Y%m%d-%H%M%S")
    out.mkdir(parents=True)
    results: dict[str, Any] = {"device": torch.cuda.get_device_name(0)}
    checks = (
        ("gpu_tests", _gpu_tests),
        ("staging_stall", _staging_stall_in_tmpfs),
        ("inprocess_nccl_restart", lambda: _inprocess_restart(out / "inprocess")),
        ("nvrx_checkpointing", _nvrx_rows_in_tmpfs),
    )
    for name, check in checks:
        started = time.monotonic()
        try:
            results[name] = check()
        except Exception as exc:  # noqa: BLE001 - one failed check must not hide the others' numbers
            results[name] = {"ok": False, "error": repr(exc)[:500]}
        results[name]["seconds"] = round(time.monotonic() - started, 1)
        print(f"{name}: {json.dumps(results[name])}", flush=True)
    (out / "gpu-check.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"gpu-check.json: {out / 'gpu-check.json'}")
    return 0 if all(results[name]["ok"] for name, _ in checks) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
