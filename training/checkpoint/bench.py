"""`nvrx-eks bench checkpoint`: loop stall against the memcpy floor, efficiency, restore, torture.

Everything is measured side by side in one run (this machine is shared and noisy; compare ratios,
not absolute times). Two step models (shared notes section 5): `device` emulates a GPU host (the step
waits holding no core), `cpu` computes on the cores the background writer also needs.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from collections.abc import Callable


def make_state(total_bytes: int) -> dict[str, Any]:
    """A model-like state: several large float32 tensors plus optimizer moments and small values."""
    per = total_bytes // 4 // 12
    return {
        "model": {f"layer{i}.weight": torch.randn(per) for i in range(4)},
        "optim": {
            "exp_avg": [torch.randn(per) for _ in range(4)],
            "exp_avg_sq": [torch.rand(per) for _ in range(4)],
        },
        "data": {"step": 0, "epoch": 0},
    }


def state_bytes(state: dict[str, Any]) -> int:
    from training.checkpoint.shard import flatten  # noqa: PLC0415

    return flatten(state)[2].data_bytes


def memcpy_bandwidth(nbytes: int) -> float:
    """Bytes/s of one contiguous copy into a reused, pre-faulted buffer (best of 3): the floor's rate."""
    src = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
    dst = torch.zeros(nbytes, dtype=torch.uint8)
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - started)
    return nbytes / best


def _step(kind: str, seconds: float, work: torch.Tensor) -> None:
    if kind == "device":
        time.sleep(seconds)  # a GPU host's step: the cores are idle while the device computes
        return
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        work @ work


def run_loop(
    *, root: Path, state: dict[str, Any], kind: str, step_s: float, every: int, steps: int, durable_every: int
) -> dict[str, Any]:
    from training.checkpoint.config import CheckpointConfig  # noqa: PLC0415
    from training.checkpoint.factory import build_checkpointer  # noqa: PLC0415

    config = CheckpointConfig(
        memory_dir=root / "shm",
        memory_every=every,
        local_dir=root / "local",
        local_every=every,
        durable_dir=str(root / "durable"),
        durable_every=durable_every,
        keep=2,
        persist_timeout_s=600,
    )
    ckpt = build_checkpointer(config, rank=0, world_size=1, device=torch.device("cpu"))
    work = torch.randn(256, 256)
    time.sleep(0.0)
    ckpt.save(0, state)  # first snapshot allocates and pre-faults the slots: setup, not steady state
    deadline = time.monotonic() + 120
    while not all(worker.warm() for worker in ckpt.workers.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    ckpt.stats.__init__()
    stalls = []
    started = time.perf_counter()
    for step in range(1, steps + 1):
        _step(kind, step_s, work)
        state["data"]["step"] = step
        before = time.perf_counter()
        ckpt.save(step, state)
        if step % every == 0:
            stalls.append(time.perf_counter() - before)
    wall = time.perf_counter() - started
    stats = ckpt.stats.as_dict()
    ckpt.close()
    return {"wall_s": wall, "stalls": stalls, "stats": stats, "efficiency": 1 - stats["stall_s"] / wall}


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def bench(  # noqa: PLR0915 - one linear report
    *, state_gb: float, step_s: float, intervals: list[int], torture_trials: int, workdir: Path | None
) -> None:
    import torch.distributed.checkpoint as dcp  # noqa: PLC0415

    from training.checkpoint.config import CheckpointConfig  # noqa: PLC0415
    from training.checkpoint.factory import disk_stores  # noqa: PLC0415
    from training.checkpoint.restore import StoreSource  # noqa: PLC0415
    from training.checkpoint.tiered import MemoryTier  # noqa: PLC0415
    from training.checkpoint.torture import run_trials  # noqa: PLC0415

    base = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=workdir))
    shm = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir="/dev/shm"))
    try:
        state = make_state(int(state_gb * (1 << 30)))
        nbytes = state_bytes(state)
        bandwidth = memcpy_bandwidth(nbytes)
        floor = nbytes / bandwidth
        print(f"state {nbytes / 1e9:.2f} GB; memcpy {bandwidth / 1e9:.2f} GB/s; floor {floor * 1e3:.0f} ms")

        # Synchronous baselines and DCP async_save's loop stall, same state, same run.
        t_save = timed(lambda: torch.save(state, base / "torch.pt"))
        (base / "torch.pt").unlink()
        t_dcp = timed(lambda: dcp.save(state, checkpoint_id=str(base / "dcp"), no_dist=True))
        shutil.rmtree(base / "dcp")
        future = None

        def dcp_async() -> None:
            nonlocal future
            future = dcp.async_save(state, checkpoint_id=str(base / "dcp-async"), no_dist=True)

        t_dcp_async = timed(dcp_async)
        t_dcp_async_total = t_dcp_async + timed(future.result)
        shutil.rmtree(base / "dcp-async", ignore_errors=True)
        print(
            f"sync torch.save {t_save:.2f} s ({t_save / floor:.1f}x floor); sync DCP {t_dcp:.2f} s "
            f"({t_dcp / floor:.1f}x); DCP async_save stall {t_dcp_async:.2f} s ({t_dcp_async / floor:.1f}x), "
            f"until done {t_dcp_async_total:.2f} s"
        )

        rows = []
        for kind in ("device", "cpu"):
            for every in intervals:
                steps = max(3 * every, 6)
                root = shm / f"{kind}-{every}"
                # Disk tiers on real disk under `base`; slots in shared memory.
                result = run_loop(
                    root=root,
                    state=state,
                    kind=kind,
                    step_s=step_s,
                    every=every,
                    steps=steps,
                    durable_every=every,
                )
                for tier in ("local", "durable"):
                    shutil.rmtree(root / tier, ignore_errors=True)
                interval = every * step_s
                stalls = sorted(result["stalls"])
                median = stalls[len(stalls) // 2] if stalls else 0.0
                sync_eff = [
                    1 - t / (interval * (steps // every) / (steps // every) + t) for t in (t_save, t_dcp)
                ]
                rows.append(
                    (
                        kind,
                        interval,
                        median / floor,
                        (median - floor) * 1e3,
                        result["efficiency"],
                        *sync_eff,
                        result["stats"]["skipped"],
                        result["stats"]["persisted"],
                    )
                )
        print(
            "\nmodel   interval  stall/floor  stall-floor  tiered-eff  torch.save-eff  DCP-eff"
            "  skipped  persisted"
        )
        for kind, interval, ratio, extra, eff, eff_save, eff_dcp, skipped, persisted in rows:
            print(
                f"{kind:7} {interval:7.1f}s  {ratio:10.2f}  {extra:8.0f} ms  {eff:9.2%}  {eff_save:13.2%}  "
                f"{eff_dcp:7.2%}  {skipped}  {persisted}"
            )
        print("(sync efficiencies: 1 - save / (interval + save), from the sync save times above)")

        # Restore time per tier: memory slots, local folder, durable folder (FSx emulated by a folder).
        config = CheckpointConfig(
            memory_dir=shm / "restore" / "shm",
            memory_every=1,
            local_dir=shm / "restore" / "local",
            local_every=1,
            durable_dir=str(base / "restore-durable"),
            durable_every=1,
            keep=1,
        )
        from training.checkpoint.factory import build_checkpointer  # noqa: PLC0415

        ckpt = build_checkpointer(config, rank=0, world_size=1, device=torch.device("cpu"))
        ckpt.save(1, state)
        ckpt.wait()
        ckpt.close()
        memory = MemoryTier(
            root=config.memory_dir, rank=0, world_size=1, num_slots=2, device=torch.device("cpu")
        )
        times = {"memory": timed(lambda: memory.load(1, 0))}
        for store, _, shared in disk_stores(config):
            times[store.tier] = timed(lambda s=store, sh=shared: StoreSource(s, shared=sh).load(1, 0))
        print(
            "\nrestore "
            + ", ".join(f"{tier} {t:.2f} s ({t / floor:.1f}x floor)" for tier, t in times.items())
        )

        if torture_trials:
            result = run_trials(root=shm / "torture", trials=torture_trials, seed=0)
            print(
                f"\nkill -9 torture: {result['ok']}/{result['trials']} resumed from the newest committed "
                f"checkpoint with exact state (wrong step {result['wrong_step']}, "
                f"inexact {result['inexact']}, "
                f"failed start {result['failed_start']})"
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
