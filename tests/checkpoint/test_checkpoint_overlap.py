"""The snapshot copy off the critical path (save/fence) and the ranks' agreement, with real processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch

from nvrx_eks.training.checkpoint.base import Placement
from nvrx_eks.training.checkpoint.config import CheckpointConfig
from nvrx_eks.training.checkpoint.stats import make_emitter
from nvrx_eks.training.checkpoint.tiered import TieredCheckpointer

if TYPE_CHECKING:
    from collections.abc import Callable

CPU = torch.device("cpu")


def memory_only(tmp_path: Path, **extra: object) -> TieredCheckpointer:
    config = CheckpointConfig(memory_dir=tmp_path / "shm", memory_every=1, **extra)
    return TieredCheckpointer(
        config=config,
        placement=Placement(rank=0, world_size=1, node_index=0, device=CPU, emit=make_emitter(None)),
    )


def test_fence_makes_the_snapshot_consistent_with_mutation_right_after(tmp_path):
    """Like the loop: save, fence, then the in-place update. The staged snapshot is always the state
    as it was at save, never a mix with the update (32 MiB per tensor keeps the copy running past
    `save`'s return)."""
    ckpt = memory_only(tmp_path)
    params = {"w": torch.zeros(8 << 20), "v": torch.zeros(8 << 20)}
    try:
        for step in range(1, 6):
            ckpt.save(step, {"model": params, "data": {"step": step}})
            ckpt.fence()
            for tensor in params.values():
                tensor.add_(1.0)  # the optimizer update
            restored = ckpt.load_latest()
            assert restored.step == step
            for name in params:
                got = restored.state["model"][name]
                assert float(got.min()) == float(got.max()) == step - 1, (step, name)
        assert ckpt.stats.staged == 5
        assert ckpt.stats.stall_s >= ckpt.stats.fence_s > 0
    finally:
        ckpt.close()


def test_save_returns_before_the_copy_and_fence_waits_for_it(tmp_path, monkeypatch):
    """The copy runs on the background thread: save returns while it is blocked; fence waits."""
    ckpt = memory_only(tmp_path)
    release = threading.Event()
    original = ckpt.memory._copy_and_commit

    def slow_copy(*args: object) -> None:
        assert release.wait(30)
        original(*args)

    monkeypatch.setattr(ckpt.memory, "_copy_and_commit", slow_copy)
    try:
        ckpt.save(1, {"w": torch.ones(10)})
        assert ckpt.memory.slots[0].pending or ckpt.memory.slots[1].pending  # save did not copy
        assert ckpt.memory.committed_steps() == set()
        threading.Timer(0.3, release.set).start()
        started = time.perf_counter()
        ckpt.fence()
        assert time.perf_counter() - started >= 0.2
        assert ckpt.memory.committed_steps() == {1}
        assert ckpt.stats.fence_s >= 0.2
    finally:
        release.set()
        ckpt.close()


def _rank_checkpointer(
    config: CheckpointConfig,
    rank: int,
    world_size: int,
    *,
    emit: Callable[[str, dict[str, Any]], None] | None = None,
    persist_delay_s: float = 0.0,
) -> TieredCheckpointer:
    """A gloo rank's checkpointer, one rank a node."""
    placement = Placement(
        rank=rank, world_size=world_size, node_index=rank, device=CPU, emit=emit or make_emitter(None)
    )
    return TieredCheckpointer(config=config, placement=placement, persist_delay_s=persist_delay_s)


def _train(ckpt: TieredCheckpointer, *, steps: int, step_s: float) -> None:
    """The trainer's loop shape: forward/backward (a sleep), the gradient all_reduce, fence, the
    in-place update, save; then wait for what runs behind."""
    import torch.distributed as dist  # noqa: PLC0415

    weights, grad = torch.zeros(64), torch.zeros(4)
    for step in range(steps):
        time.sleep(step_s)
        dist.all_reduce(grad)
        ckpt.fence()
        weights += 1.0
        ckpt.save(step, {"w": weights, "data": {"step": step}})
    ckpt.wait()


def _rank_main(rank: int, world_size: int, root: Path) -> None:
    """One gloo rank: every step a save, fence, a gradient-like all_reduce; rank 1 persists slowly."""
    import torch.distributed as dist  # noqa: PLC0415

    dist.init_process_group("gloo", init_method=f"file://{root / 'pg'}", rank=rank, world_size=world_size)
    config = CheckpointConfig(
        memory_dir=root / "shm",
        memory_every=1,
        local_dir=root / "local",
        local_every=1,
        keep=100,
        fsync=False,
        persist_timeout_s=60,
    )
    ckpt = _rank_checkpointer(config, rank, world_size, persist_delay_s=0.8 if rank == 1 else 0.0)
    deadline = time.monotonic() + 60
    while not ckpt.workers["local"].warm() and time.monotonic() < deadline:
        time.sleep(0.05)
    dist.barrier()
    grad = torch.zeros(4)
    for step in range(1, 16):
        ckpt.save(step, {"w": torch.full((64,), float(step)), "data": {"step": step}})
        ckpt.fence()
        dist.all_reduce(grad)
        time.sleep(0.1)
    ckpt.wait()
    committed = sorted(ckpt.stores[0][0].manifests(rank))
    report = {
        "rank": rank,
        "skipped": ckpt.stats.skipped.get("local", 0),
        "persisted": ckpt.stats.persisted.get("local", 0),
        "committed": committed,
        "blocking_rounds": ckpt.agreement.blocking_rounds,
        "memory_skipped": ckpt.stats.skipped.get("memory", 0),
    }
    restored = ckpt.load_latest()  # collective: the newest step both ranks hold
    report["restored"] = [restored.step, restored.tier]
    ckpt.close()
    dist.destroy_process_group()
    print(json.dumps(report), flush=True)


def _replica_rank_main(rank: int, world_size: int, root: Path) -> None:
    """One gloo rank, one per node, in the trainer's loop shape: forward/backward (a sleep), the
    gradient all_reduce, fence, the in-place update, save. A RAM snapshot every 2 steps, each copied
    to the partner node's RAM."""
    import torch.distributed as dist  # noqa: PLC0415

    dist.init_process_group("gloo", init_method=f"file://{root / 'pg'}", rank=rank, world_size=world_size)
    config = CheckpointConfig(memory_dir=root / f"shm-{rank}", memory_every=2, peer_replicas=1, fsync=False)
    ckpt = _rank_checkpointer(config, rank, world_size)
    _train(ckpt, steps=12, step_s=0.15)  # a step far longer than one exchange of 512 bytes
    report = {
        "blocking_rounds": ckpt.agreement.blocking_rounds,
        "replicated": ckpt.stats.persisted.get("peer", 0),
        "skipped": ckpt.stats.skipped.get("peer", 0),
        "staged": ckpt.stats.staged,
    }
    ckpt.close()
    dist.destroy_process_group()
    report["threads_after_close"] = sorted(t.name for t in threading.enumerate() if t.daemon)
    print(json.dumps(report), flush=True)


def _start_exchanges_late(seconds: float) -> None:
    """In this rank's process: every replica exchange starts `seconds` late (a slow network)."""
    from nvrx_eks.training.checkpoint.replica import ReplicaWorker  # noqa: PLC0415

    exchange = ReplicaWorker._exchange

    def late(self: ReplicaWorker, **kwargs: object) -> None:
        time.sleep(seconds)
        exchange(self, **kwargs)

    ReplicaWorker._exchange = late  # type: ignore[method-assign]


def _replica_wait_rank_main(rank: int, world_size: int, root: Path) -> None:
    """One gloo rank whose replica exchange is still running when `wait()` is called (each exchange
    starts 0.5 s late here), as after the bench's warm-up save, then one more snapshot."""
    import torch.distributed as dist  # noqa: PLC0415

    _start_exchanges_late(0.5)
    dist.init_process_group("gloo", init_method=f"file://{root / 'pg'}", rank=rank, world_size=world_size)
    config = CheckpointConfig(memory_dir=root / f"shm-{rank}", memory_every=1, peer_replicas=1, fsync=False)
    ckpt = _rank_checkpointer(config, rank, world_size)
    weights = torch.zeros(64)
    ckpt.save(0, {"w": weights})
    ckpt.wait()
    report = {"replicated_at_wait": ckpt.stats.persisted.get("peer", 0)}
    ckpt.save(1, {"w": weights + 1})
    ckpt.wait()
    report["replicated"] = ckpt.stats.persisted.get("peer", 0)
    report["skipped"] = ckpt.stats.skipped.get("peer", 0)
    ckpt.close()
    dist.destroy_process_group()
    print(json.dumps(report), flush=True)


def _catch_up_rank_main(rank: int, world_size: int, root: Path) -> None:
    """One gloo rank, the trainer's loop shape, a snapshot every 3 steps of 0.2 s, each exchange 0.5 s
    (slowed down here): longer than the two steps before the flags for a due step are sampled, shorter
    than the interval."""
    import torch.distributed as dist  # noqa: PLC0415

    _start_exchanges_late(0.5)
    dist.init_process_group("gloo", init_method=f"file://{root / 'pg'}", rank=rank, world_size=world_size)
    config = CheckpointConfig(
        memory_dir=root / f"shm-{rank}",
        memory_every=3,
        local_every=0,  # no disk tier: the replica alone
        durable_every=0,
        peer_replicas=1,
        fsync=False,
    )
    events: list[tuple[str, dict[str, object]]] = []
    ckpt = _rank_checkpointer(
        config, rank, world_size, emit=lambda kind, fields: events.append((kind, fields))
    )
    _train(ckpt, steps=24, step_s=0.2)
    report = {
        "replicated_steps": [
            f["step"] for k, f in events if k == "checkpoint_committed" and f["tier"] == "peer"
        ],
        "catch_up_steps": [f["step"] for k, f in events if k == "checkpoint_staged" and f.get("catch_up")],
        "blocking_rounds": ckpt.agreement.blocking_rounds,
    }
    ckpt.close()
    dist.destroy_process_group()
    print(json.dumps(report), flush=True)


def _run_ranks(tmp_path: Path, world_size: int, *extra: str) -> list[dict[str, object]]:
    """Each rank's report and its stderr, once every rank has exited 0 (a rank that exits otherwise
    fails the test: an abort at interpreter exit included)."""
    with contextlib.ExitStack() as stack:  # every pipe closed and every rank reaped, whatever fails
        procs = [
            stack.enter_context(
                subprocess.Popen(
                    [sys.executable, __file__, str(rank), str(world_size), str(tmp_path), *extra],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    start_new_session=True,
                    env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
                )
            )
            for rank in range(world_size)
        ]
        try:
            finished = [proc.communicate(timeout=150) for proc in procs]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
    for proc, (_, err) in zip(procs, finished, strict=True):
        assert proc.returncode == 0, err[-3000:]
    return [json.loads(out.strip().splitlines()[-1]) | {"stderr": err} for out, err in finished]


@pytest.mark.slow
def test_the_peer_replica_at_every_snapshot_takes_no_blocking_round_in_steady_state(tmp_path):
    """The exchange starts when its snapshot's copy ends and is over long before the next due step's
    fence publishes the flags: each decision reads the async answer. (Flags sampled right after the
    launch said "peer busy" at every snapshot, and each one paid a blocking all_reduce.)"""
    for report in _run_ranks(tmp_path, 2, "replica"):
        assert report["blocking_rounds"] == 1, report  # the process group's first due step only
        assert report["staged"] == 6
        assert report["skipped"] == 0, report
        # The last one too: handed over at its snapshot, it is under way when training ends.
        assert report["replicated"] == 6, report
        # Nothing of the replica outlives close: a thread holding the replication group aborts the
        # process at interpreter exit (exit 134, after a clean report), though not in every run.
        assert report["threads_after_close"] == [], report
        # The exchange's read-only mapping must not warn in every trainer's log.
        assert "Warning" not in report["stderr"], report["stderr"]


@pytest.mark.slow
def test_an_exchange_still_running_at_wait_is_recorded_and_frees_its_slot(tmp_path):
    """`wait()` records the outcome of the exchange it waited for: dropped, the slot would stay held
    for the replica, and every later snapshot would find it busy and skip it."""
    for report in _run_ranks(tmp_path, 2, "replica-wait"):
        counts = {key: report[key] for key in ("replicated_at_wait", "replicated", "skipped")}
        assert counts == {"replicated_at_wait": 1, "replicated": 2, "skipped": 0}, report


@pytest.mark.slow
def test_a_replica_that_ends_after_the_flags_were_sampled_replicates_every_due_step(tmp_path):
    """The answer sampled a step before a due step shows the previous exchange still running: the due
    snapshot is queued behind it and sent the moment it ends. Skipped on that answer instead, and
    caught up a step later with a snapshot of its own (the exchange launched there then had a step
    less before the next answer), every due step was skipped and caught up a step later (replicas of
    0/4/7/10/...: two snapshots per interval); before the catch-up, a whole interval later."""
    first, second = _run_ranks(tmp_path, 2, "catch-up")
    assert first["replicated_steps"] == second["replicated_steps"]  # agreed, step by step
    assert first["replicated_steps"] == list(range(0, 24, 3)), first
    assert first["catch_up_steps"] == second["catch_up_steps"] == [], first
    assert first["blocking_rounds"] == 1, first


@pytest.mark.slow
def test_two_ranks_agree_and_skip_a_busy_tier_together(tmp_path):
    first, second = _run_ranks(tmp_path, 2)
    # Rank 0's own writer is fast, yet it skipped exactly the steps slow rank 1 had to skip.
    assert first["skipped"] == second["skipped"] > 0
    assert first["persisted"] == second["persisted"] > 0
    assert first["committed"] == second["committed"]
    assert first["memory_skipped"] == second["memory_skipped"] == 0
    # One blocking all_reduce, the process group's first due step: every skip was decided on the
    # answer published a step ahead (each once also paid a blocking round, to confirm it).
    assert first["blocking_rounds"] == second["blocking_rounds"] == 1
    assert first["restored"] == second["restored"] == [15, "memory"]


if __name__ == "__main__":
    main = {
        "replica": _replica_rank_main,
        "replica-wait": _replica_wait_rank_main,
        "catch-up": _catch_up_rank_main,
    }.get((sys.argv[4:] or [""])[0], _rank_main)
    main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
