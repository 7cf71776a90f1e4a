"""The tiered checkpointer with its real writer threads: persist, fail, hang, kill -9."""

from __future__ import annotations

import threading
import time

import psutil
import pytest
import torch

from nvrx_eks.bench.checkpoint.benchstate import every_tier
from nvrx_eks.bench.checkpoint.torture import run_trials
from nvrx_eks.training.checkpoint.base import Placement
from nvrx_eks.training.checkpoint.dcp_format import Stager
from nvrx_eks.training.checkpoint.memory import MemoryTier
from nvrx_eks.training.checkpoint.persist import persist_slot
from nvrx_eks.training.checkpoint.restore import restore
from nvrx_eks.training.checkpoint.shard import encode_header, flatten
from nvrx_eks.training.checkpoint.stats import make_emitter
from nvrx_eks.training.checkpoint.storage import FileStore, disk_stores
from nvrx_eks.training.checkpoint.tiered import TieredCheckpointer

CPU = torch.device("cpu")


def state_at(step: int) -> dict:
    return {"model": {"w": torch.full((256, 256), float(step))}, "data": {"step": step}}


def save_until(ckpt, steps, predicate, timeout_s=90.0):
    """Drive the loop (a save per step, 20 ms steps) until `predicate()` holds."""
    deadline = time.monotonic() + timeout_s
    step = steps[0]
    while not predicate():
        assert time.monotonic() < deadline, ckpt.stats.as_dict()
        step += 1
        ckpt.save(step, state_at(step))
        time.sleep(0.02)
    steps[0] = step


@pytest.mark.slow
def test_tiers_persist_in_background_survive_failure_and_hang(tmp_path):
    blocker = tmp_path / "durable"  # the durable tier's folder
    blocker.write_text("not a folder: every durable write fails")
    config = every_tier(
        tmp_path / "shm",
        tmp_path,
        memory_every=1,
        local_every=2,
        durable_every=4,
        keep=2,
        fsync=False,
        persist_timeout_s=60,
    )
    events = []
    ckpt = TieredCheckpointer(
        config=config,
        placement=Placement(
            rank=0,
            world_size=1,
            node_index=0,
            device=CPU,
            emit=make_emitter(lambda kind, fields: events.append((kind, fields))),
        ),
    )
    try:
        steps = [0]
        # Unwritable durable location: reported, training goes on, local keeps committing.
        save_until(
            ckpt, steps, lambda: ckpt.stats.failed["durable"] >= 1 and ckpt.stats.persisted["local"] >= 1
        )
        assert any(kind == "checkpoint_failed" and f["tier"] == "durable" for kind, f in events)
        # The location comes back: a later due step persists (retry without intervention).
        blocker.unlink()
        save_until(ckpt, steps, lambda: ckpt.stats.persisted["durable"] >= 1)
        # A hung writer: detected by its timeout, killed, reported; the tier works again afterwards. The
        # delay is every tier's: six times the local timeout, and short enough that the durable tier's
        # delayed writes (timeout 60 s) finish before the final wait rather than hold it.
        ckpt.workers["local"].timeout_s = 0.5
        ckpt._persist_delay_s = 3.0
        save_until(ckpt, steps, lambda: ckpt.stats.timed_out["local"] >= 1)
        ckpt.workers["local"].timeout_s = 60
        ckpt._persist_delay_s = 0.0
        done = ckpt.stats.persisted["local"]
        save_until(ckpt, steps, lambda: ckpt.stats.persisted["local"] > done)
        assert max(ckpt.stats.max_stall_s, 0) < 5  # never waited on a persist
        ckpt.wait()
        newest = steps[0]
        restored = ckpt.load_latest()
        assert restored.tier == "memory"
        assert restored.step == newest
        assert torch.equal(restored.state["model"]["w"], state_at(newest)["model"]["w"])
        # Without the memory tier (node lost): the disk tiers hold a complete, verified older step.
        stores = disk_stores(config)
        disk = restore(
            memory_dir=None,
            stores=[store for store, _, _ in stores],
            stager=Stager(rank=0, world_size=1),
            placement=Placement(rank=0, world_size=1, node_index=0, device=CPU, emit=make_emitter(None)),
            target=None,
        )
        held = {store.tier: set(store.manifests(0)) for store, _, _ in stores}
        assert disk.step == max(held["local"] | held["durable"])
        assert disk.tier == ("local" if disk.step in held["local"] else "durable")  # fastest holding it
        assert disk.state["data"]["step"] == disk.step
        assert len(stores[0][0].manifests(0)) <= config.keep
    finally:
        ckpt.close()
    assert not any(worker.alive for worker in ckpt.workers.values())


def test_memory_tier_uncommits_a_slot_before_overwriting_it(tmp_path):
    tier = MemoryTier(root=tmp_path, rank=0, world_size=1, num_slots=2, device=CPU)
    skeleton, tensors, layout = flatten(state_at(1))
    tier.ensure(layout)
    slot = tier.free_slot()
    tier.stage(slot, 1, tensors, encode_header(skeleton, layout))
    tier.synchronize()
    tier.complete_pending()
    assert tier.committed_steps() == {1}
    # A kill between uncommit and the new manifest leaves no claim on the half-written slot.
    slot.files.manifest.unlink()
    assert tier.committed_steps() == set()
    tier.release()


@pytest.mark.slow
def test_kill_9_during_persist_always_resumes_from_newest_committed(tmp_path):
    result = run_trials(root=tmp_path, trials=2, seed=3, max_kill_s=1.5)
    assert result["trials"] == 2
    assert result["ok"] == 2, result


def test_persists_run_in_threads_no_writer_process(tmp_path):
    """A restarted rank must not spawn (and re-import torch in) a process per disk tier: that would add
    seconds of imports to every recovery."""
    config = every_tier(
        tmp_path / "shm", tmp_path, memory_every=1, local_every=1, durable_every=1, keep=2, fsync=False
    )
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    ckpt = TieredCheckpointer(
        config=config,
        placement=Placement(rank=0, world_size=1, node_index=0, device=CPU, emit=make_emitter(None)),
    )
    try:
        steps = [0]
        save_until(ckpt, steps, lambda: min(ckpt.stats.persisted.values(), default=0) >= 1, timeout_s=30)
        spawned = {p.pid for p in psutil.Process().children(recursive=True)} - before
        assert spawned == set()
        assert all(worker.alive for worker in ckpt.workers.values())
    finally:
        ckpt.close()
    assert not any(worker.alive for worker in ckpt.workers.values())


def test_an_abandoned_persist_never_commits(tmp_path):
    """The timeout guard cannot kill a thread: a persist cancelled before its commit leaves no file,
    no manifest and no temporary folder, even though it read the whole slot."""
    staged = Stager(rank=0, world_size=1).stage(state_at(3))
    skeleton, tensors, layout = flatten(staged.tree)
    slot = tmp_path / "slot.bin"
    slot.write_bytes(b"".join(bytes(t.contiguous().view(torch.uint8).numpy()) for t in tensors))
    cancelled = threading.Event()
    cancelled.set()
    outcome = persist_slot(
        tier="local",
        location=str(tmp_path / "local"),
        fsync=False,
        slot_path=str(slot),
        header=encode_header(skeleton, layout, staged.key),
        data_bytes=layout.data_bytes,
        step=3,
        rank=0,
        world_size=1,
        keep=2,
        cancelled=cancelled,
        plan=staged.plan,
    )
    assert outcome["ok"] is False
    assert "Cancelled" in outcome["error"]
    assert FileStore(tier="local", root=tmp_path / "local").manifests() == {}
    assert [p.name for p in (tmp_path / "local").rglob("*") if p.is_file()] == []
