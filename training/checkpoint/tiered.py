"""Tiered checkpointing: the loop pays for one copy into a staging slot; disks are written behind it.

Tier 1 (memory): `num_staging_slots` pre-allocated, pre-faulted buffers per rank, each a file in a
shared-memory folder mapped into the process (pinned with cudaHostRegister on GPU). A slot is
committed by a small manifest written after the copy, so it survives a kill -9 of the rank: the
restarted rank on the same node restores from RAM. Tiers 2 (node-local disk) and 3 (durable) are
written from the slots by background workers (persist.py). A slot being persisted is never
overwritten; a tier that is still busy (on any rank) at its next due step is skipped and counted,
never waited for, and a failed or hung persist is reported and retried at the tier's next due step.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from training.checkpoint.base import Checkpointer, Restored
from training.checkpoint.persist import PersistWorker
from training.checkpoint.restore import StoreSource, load_newest
from training.checkpoint.shard import Layout, ShardError, decode, encode_header, flatten, views
from training.checkpoint.stats import CheckpointStats

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from training.checkpoint.config import CheckpointConfig
    from training.checkpoint.storage import ShardStore


@dataclass
class _Slot:
    index: int
    data_path: Path
    manifest_path: Path
    header_path: Path
    buffer: torch.Tensor | None = None
    step: int = -1
    holders: set[str] = field(default_factory=set)
    """Tiers whose worker is reading this slot: it must not be overwritten."""
    pending_event: Any = None
    """GPU: the copy's CUDA event; the slot commits once it completes."""
    pending_header: bytes = b""


class MemoryTier:
    """This rank's staging slots in a shared-memory folder, and the memory tier's commit protocol."""

    tier = "memory"

    def __init__(
        self, *, root: Path, rank: int, world_size: int, num_slots: int, device: torch.device
    ) -> None:
        self.root = root / f"rank-{rank:05d}"
        self.root.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.slots = [
            _Slot(i, self.root / f"slot-{i}.bin", self.root / f"slot-{i}.json", self.root / f"slot-{i}.hdr")
            for i in range(num_slots)
        ]
        self.signature: Any = None
        self.data_bytes = 0
        self._stream: Any = None

    # --- restore side -------------------------------------------------------------------------
    def _manifest(self, slot: _Slot) -> dict[str, Any] | None:
        try:
            manifest = json.loads(slot.manifest_path.read_text())
        except (OSError, ValueError):
            return None
        if manifest.get("world_size") != self.world_size or manifest.get("rank") != self.rank:
            return None
        return manifest

    def candidate_steps(self, *, rank: int, world_size: int, collective: bool) -> set[int]:  # noqa: ARG002
        return {m["step"] for slot in self.slots if (m := self._manifest(slot)) is not None}

    def load(self, step: int, rank: int) -> dict[str, Any]:  # noqa: ARG002
        for slot in self.slots:
            manifest = self._manifest(slot)
            if manifest is None or manifest["step"] != step:
                continue
            header = slot.header_path.read_bytes()
            nbytes = manifest["data_bytes"]
            blob = bytearray(len(header) + nbytes)
            blob[: len(header)] = header
            with slot.data_path.open("rb", buffering=0) as source:
                got = source.readinto(memoryview(blob)[len(header) :])
            if got != nbytes:
                raise ShardError(f"memory slot {slot.index}: {got} of {nbytes} bytes")
            return decode(blob)
        raise ShardError(f"memory tier no longer holds step {step}")

    # --- save side ----------------------------------------------------------------------------
    def ensure(self, layout: Layout) -> None:
        """(Re)allocate the slots for this layout: sized files in shared memory, mapped and
        pre-faulted (a fresh allocation per save is 3-10x slower than a reused buffer, notes sect. 5)."""
        if layout.signature == self.signature:
            return
        self.release()
        nbytes = max(layout.data_bytes, 1)
        for slot in self.slots:
            slot.manifest_path.unlink(missing_ok=True)  # old contents are superseded from here on
            with slot.data_path.open("wb") as out:
                out.truncate(nbytes)
            slot.buffer = torch.from_file(str(slot.data_path), shared=True, size=nbytes, dtype=torch.uint8)
            slot.buffer.zero_()  # touch every page now, not inside the first save
            if self.device.type == "cuda":
                # Pinned staging: page-locked memory is what lets the D2H copy run at full PCIe speed
                # asynchronously. Registering the mapping keeps it shareable with the writer process.
                rc = torch.cuda.cudart().cudaHostRegister(slot.buffer.data_ptr(), nbytes, 0)
                if int(rc) != 0:
                    raise RuntimeError(f"cudaHostRegister failed ({rc})")
            slot.step = -1
        self.signature = layout.signature
        self.data_bytes = layout.data_bytes

    def release(self) -> None:
        for slot in self.slots:
            if slot.buffer is not None and self.device.type == "cuda":
                torch.cuda.cudart().cudaHostUnregister(slot.buffer.data_ptr())
            slot.buffer = None

    def free_slot(self) -> _Slot | None:
        """An unheld slot, the oldest first (the newest snapshot stays valid while the next is copied)."""
        free = [slot for slot in self.slots if not slot.holders and slot.pending_event is None]
        return min(free, key=lambda slot: slot.step) if free else None

    def stage(
        self, slot: _Slot, step: int, tensors: list[torch.Tensor], layout: Layout, header: bytes
    ) -> None:
        slot.manifest_path.unlink(missing_ok=True)  # uncommit before overwriting
        slot.step = -1
        targets = views(slot.buffer, layout)
        if self.device.type == "cuda":
            if self._stream is None:
                self._stream = torch.cuda.Stream(device=self.device)
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self._stream):
                for target, tensor in zip(targets, tensors, strict=True):
                    target.copy_(tensor.detach(), non_blocking=True)
                event = torch.cuda.Event()
                event.record(self._stream)
            # Later kernels that may update the parameters wait for the copy; the host does not.
            torch.cuda.current_stream(self.device).wait_event(event)
            slot.pending_event = event
            slot.pending_header = header
            slot.step = step
            return
        with torch.no_grad():
            for target, tensor in zip(targets, tensors, strict=True):
                target.copy_(tensor.detach())
        self._commit(slot, step, header)

    def complete_pending(self) -> list[_Slot]:
        """GPU: commit slots whose copy has finished (never waits)."""
        done = []
        for slot in self.slots:
            if slot.pending_event is not None and slot.pending_event.query():
                slot.pending_event = None
                self._commit(slot, slot.step, slot.pending_header)
                done.append(slot)
        return done

    def synchronize(self) -> None:
        for slot in self.slots:
            if slot.pending_event is not None:
                slot.pending_event.synchronize()
        self.complete_pending()

    def _commit(self, slot: _Slot, step: int, header: bytes) -> None:
        tmp = slot.header_path.with_suffix(".hdr.tmp")
        tmp.write_bytes(header)
        tmp.replace(slot.header_path)
        manifest = {
            "step": step,
            "rank": self.rank,
            "world_size": self.world_size,
            "data_bytes": self.data_bytes,
        }
        tmp = slot.manifest_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(manifest))
        tmp.replace(slot.manifest_path)  # the commit point; tmpfs needs no fsync
        slot.step = step


class TieredCheckpointer(Checkpointer):
    def __init__(
        self,
        *,
        config: CheckpointConfig,
        stores: list[tuple[ShardStore, int, bool]],
        rank: int,
        world_size: int,
        node_index: int,
        device: torch.device,
        emit: Callable[[str, dict[str, Any]], None],
        persist_delay_s: float = 0.0,
    ) -> None:
        self.config = config
        self.stores = stores
        self.rank = rank
        self.world_size = world_size
        self.node_index = node_index
        self.device = device
        self.emit = emit
        self.stats = CheckpointStats()
        self.memory = MemoryTier(
            root=config.memory_dir,
            rank=rank,
            world_size=world_size,
            num_slots=config.num_staging_slots,
            device=device,
        )
        self.workers = {
            store.tier: PersistWorker(
                tier=store.tier, rank=rank, timeout_s=config.persist_timeout_s, result_dir=self.memory.root
            )
            for store, _, _ in stores
        }
        self._locations = {store.tier: store.location for store, _, _ in stores}
        self._persist_delay_s = persist_delay_s
        for worker in self.workers.values():
            worker.start()

    # --- loop side ------------------------------------------------------------------------------
    def _save(self, step: int, state: dict[str, Any]) -> None:
        started = time.perf_counter()
        self.stats.save_calls += 1
        self._poll()
        every = self.config.memory_every
        if every and step % every == 0:
            self._snapshot(step, state)
        stall = time.perf_counter() - started
        self.stats.stall_s += stall
        self.stats.max_stall_s = max(self.stats.max_stall_s, stall)

    def _snapshot(self, step: int, state: dict[str, Any]) -> None:
        due = [store.tier for store, tier_every, _ in self.stores if step % tier_every == 0]
        skeleton, tensors, layout = flatten(state)
        # A new layout reallocates the slots: never under a writer that is still reading one.
        reshaped = layout.signature != self.memory.signature
        if not (reshaped and any(slot.holders for slot in self.memory.slots)):
            self.memory.ensure(layout)
        slot = self.memory.free_slot() if layout.signature == self.memory.signature else None
        busy = [tier for tier in due if self.workers[tier].busy]
        # All ranks take the same decisions, so every tier holds the same steps on every rank (a step
        # only some ranks persisted could never be restored). One tiny collective at due steps only.
        blocked = self._agree([slot is None, *(tier in busy for tier in due)])
        if blocked[0]:
            self.stats.skipped["memory"] += 1
            self.emit(
                "checkpoint_skipped", {"tier": "memory", "step": step, "reason": "no free staging slot"}
            )
            return
        assert slot is not None  # noqa: S101 - implied by the agreement above
        header = encode_header(skeleton, layout)
        self.memory.stage(slot, step, tensors, layout, header)
        self.stats.staged += 1
        for tier, tier_blocked in zip(due, blocked[1:], strict=True):
            if tier_blocked:
                self.stats.skipped[tier] += 1
                self.emit(
                    "checkpoint_skipped", {"tier": tier, "step": step, "reason": "previous persist running"}
                )
                continue
            slot.holders.add(tier)
        if self.device.type != "cuda":
            self._submit(slot)

    def _agree(self, flags: list[bool]) -> list[bool]:
        if not (dist.is_available() and dist.is_initialized()) or self.world_size == 1:
            return flags
        device = self.device if dist.get_backend() == "nccl" else torch.device("cpu")
        tensor = torch.tensor([int(flag) for flag in flags], dtype=torch.int32, device=device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return [bool(value) for value in tensor.tolist()]

    def _submit(self, slot: _Slot) -> None:
        for tier in sorted(slot.holders):
            worker = self.workers[tier]
            if worker.busy:
                continue
            try:
                worker.submit(
                    step=slot.step,
                    slot=slot.index,
                    tier=tier,
                    location=self._locations[tier],
                    fsync=self.config.fsync,
                    slot_path=str(slot.data_path),
                    header=slot.pending_header or slot.header_path.read_bytes(),
                    data_bytes=self.memory.data_bytes,
                    rank=self.rank,
                    world_size=self.world_size,
                    keep=self.config.keep,
                    delay_s=self._persist_delay_s,
                )
            except Exception as exc:  # noqa: BLE001 - a broken worker must not stop training
                slot.holders.discard(tier)
                self._failed(tier, slot.step, f"could not start the persist: {exc}", kind="failed")
        slot.pending_header = b""

    def _poll(self) -> None:
        for slot in self.memory.complete_pending():
            self._submit(slot)
        for tier, worker in self.workers.items():
            outcome = worker.poll()
            if outcome is None:
                continue
            self.memory.slots[outcome["slot"]].holders.discard(tier)
            if outcome["ok"]:
                self.stats.persisted[tier] += 1
                self.emit(
                    "checkpoint_committed",
                    {"tier": tier, "step": outcome["step"], "rank": self.rank, "seconds": outcome["seconds"]},
                )
            else:
                self._failed(tier, outcome["step"], outcome["error"], kind=outcome.get("kind", "failed"))

    def _failed(self, tier: str, step: int, error: str, *, kind: str) -> None:
        if kind == "timeout":
            self.stats.timed_out[tier] += 1
        else:
            self.stats.failed[tier] += 1
        self.stats.last_error[tier] = error
        self.emit(
            f"checkpoint_{'timeout' if kind == 'timeout' else 'failed'}",
            {"tier": tier, "step": step, "rank": self.rank, "error": error, "retry": "next due step"},
        )

    # --- restore / lifecycle --------------------------------------------------------------------
    def _load_latest(self) -> Restored | None:
        self.memory.synchronize()
        sources = [self.memory] + [StoreSource(store, shared=shared) for store, _, shared in self.stores]
        return load_newest(
            sources, rank=self.rank, world_size=self.world_size, device=self.device, emit=self.emit
        )

    def _wait(self) -> None:
        self.memory.synchronize()
        self._poll()
        deadline = time.monotonic() + self.config.persist_timeout_s
        while any(worker.busy for worker in self.workers.values()):
            self._poll()
            for slot in self.memory.slots:
                if slot.holders and not any(self.workers[tier].busy for tier in slot.holders):
                    self._submit(slot)  # a holder whose worker was busy when the slot was staged
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)

    def _close(self) -> None:
        with contextlib.suppress(Exception):
            self._wait()
        for worker in self.workers.values():
            worker.close()
        self.memory.release()

    def describe(self) -> dict[str, Any]:
        return {"rank": self.rank, "node": self.node_index, "pid": os.getpid(), **self.stats.as_dict()}
