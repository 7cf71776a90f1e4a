"""Tiered checkpointing: the snapshot copy runs behind the loop; disks are written behind the copy.

Tier 1 (memory): `num_staging_slots` pre-allocated, pre-faulted buffers per rank, each a file in a
shared-memory folder mapped into the process (pinned with cudaHostRegister on GPU). A slot is
committed by a small manifest written after the copy, so it survives a kill -9 of the rank: the
restarted rank on the same node restores from RAM. Tiers 2 (node-local disk) and 3 (durable) are
written from the slots by background writer threads (persist.py).

Off the critical path: parameters and optimizer state change only in the optimizer update, so the
snapshot taken after step N is copied while step N+1's forward/backward run, and `fence()` (called by
the loop right before step N+1's update) waits only for what is left of it. On CPU the copy runs on
one background thread (`Tensor.copy_` releases the GIL); on GPU it is a side CUDA stream filling the
pinned slot, and fence makes the update's stream wait on the copy's event (the host does not wait).

A slot being persisted is never overwritten. A persist due while the tier's previous one is still
running (on any rank) is skipped and counted, never waited for -- coalescing: the tier is owed, and
the next snapshot that finds it free writes the newest state (the peer replica's: the first step
that finds it free, with a catch-up snapshot), so nothing is queued behind a slow writer (the
replica queues one exchange: see `ReplicaWorker`). A failed or hung persist is reported, and once the
agreement shows it failed on some rank the tier is owed alike; after a restore, a tier whose newest
complete step is behind the restored state owes one too (`_restored`).
"""

from __future__ import annotations

import contextlib
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from training.checkpoint.base import Checkpointer, Restored
from training.checkpoint.persist import PersistWorker
from training.checkpoint.replica import (
    FAILURE_DOMAIN_ENV,
    ReplicaWorker,
    ranks_per_node,
    restore_from_anywhere,
)
from training.checkpoint.restore import StoreSource, load_newest
from training.checkpoint.shard import Layout, ShardError, decode, encode_header, flatten, views
from training.checkpoint.slot import SlotFiles
from training.checkpoint.stats import CheckpointStats
from training.checkpoint.storage import disk_stores

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from training.checkpoint.config import CheckpointConfig


PEER_PIN = "peer-pinned"
"""Slot holder: the snapshot whose copy the partners hold (`TieredCheckpointer._pin_replicated`)."""


@dataclass
class _Slot:
    index: int
    files: SlotFiles
    buffer: torch.Tensor | None = None
    targets: list[torch.Tensor] = field(default_factory=list)
    """Typed views of `buffer`, one per tensor of the layout (made once per layout, not per save)."""
    step: int = -1
    holders: set[str] = field(default_factory=set)
    """Tiers whose worker is reading this slot: it must not be overwritten."""
    pending_event: Any = None
    """GPU: the copy's CUDA event; the slot commits once it completes."""
    pending_copy: Future[None] | None = None
    """CPU: the background copy (and commit) of this slot."""
    pending_header: bytes = b""
    submitted: set[str] = field(default_factory=set)
    """Holders handed this slot before its copy finished (the peer replica waits for the copy itself)."""

    @property
    def pending(self) -> bool:
        return self.pending_event is not None or self.pending_copy is not None


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
        self.slots = [_Slot(i, SlotFiles.at(self.root, i)) for i in range(num_slots)]
        self.signature: Any = None
        self.data_bytes = 0
        self._stream: Any = None
        self._unfenced: list[Any] = []
        """GPU: copy events the update's stream has not been told to wait for yet."""
        self._copier: ThreadPoolExecutor | None = None
        self.copy_errors: list[str] = []

    # --- restore side -------------------------------------------------------------------------
    def _manifest(self, slot: _Slot) -> dict[str, Any] | None:
        manifest = slot.files.read_manifest()
        if (
            manifest is None
            or manifest.get("world_size") != self.world_size
            or manifest.get("rank") != self.rank
        ):
            return None
        return manifest

    def candidate_steps(self, *, rank: int, world_size: int, collective: bool) -> set[int]:  # noqa: ARG002
        return {m["step"] for slot in self.slots if (m := self._manifest(slot)) is not None}

    def load(self, step: int, rank: int) -> dict[str, Any]:  # noqa: ARG002
        for slot in self.slots:
            manifest = self._manifest(slot)
            if manifest is None or manifest["step"] != step:
                continue
            return decode(slot.files.read(manifest))
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
            slot.files.uncommit()  # old contents are superseded from here on
            with slot.files.data.open("wb") as out:
                out.truncate(nbytes)
            slot.buffer = torch.from_file(str(slot.files.data), shared=True, size=nbytes, dtype=torch.uint8)
            slot.buffer.zero_()  # touch every page now, not inside the first save
            slot.targets = views(slot.buffer, layout)  # equal signatures, equal offsets
            if self.device.type == "cuda":
                # Pinned staging: page-locked memory is what lets the D2H copy run at full PCIe speed
                # asynchronously. Registering the mapping keeps the file shareable with the writer thread.
                rc = torch.cuda.cudart().cudaHostRegister(slot.buffer.data_ptr(), nbytes, 0)
                if int(rc) != 0:
                    raise RuntimeError(f"cudaHostRegister failed ({rc})")
            slot.step = -1
        self.signature = layout.signature
        self.data_bytes = layout.data_bytes

    def release(self) -> None:
        self.synchronize()
        self.complete_pending()
        if self._copier is not None:
            self._copier.shutdown(wait=True)
            self._copier = None
        for slot in self.slots:
            if slot.buffer is not None and self.device.type == "cuda":
                torch.cuda.cudart().cudaHostUnregister(slot.buffer.data_ptr())
            slot.buffer = None
            slot.targets = []

    def free_slot(self) -> _Slot | None:
        """An unheld slot, the oldest first (the newest snapshot stays valid while the next is copied)."""
        free = [slot for slot in self.slots if not slot.holders and not slot.pending]
        return min(free, key=lambda slot: slot.step) if free else None

    def unheld(self) -> int:
        """Slots no persist reads (a slot still being copied counts: its copy ends by the fence)."""
        return sum(1 for slot in self.slots if not slot.holders)

    def stage(self, slot: _Slot, step: int, tensors: list[torch.Tensor], header: bytes) -> None:
        """Start copying `tensors` (of the layout `ensure` allocated for) into `slot`; returns at once.
        The slot commits when the copy ends."""
        slot.files.uncommit()
        slot.step = step
        slot.pending_header = header
        slot.submitted.clear()
        targets = slot.targets
        sources = [tensor.detach() for tensor in tensors]
        if self.device.type == "cuda":
            if self._stream is None:
                self._stream = torch.cuda.Stream(device=self.device)
            # The copy starts after the kernels that produced step N's state (its update)...
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self._stream):
                for target, source in zip(targets, sources, strict=True):
                    target.copy_(source, non_blocking=True)
                    if source.is_cuda:
                        source.record_stream(self._stream)
                event = torch.cuda.Event()
                event.record(self._stream)
            # ...and overlaps step N+1's forward/backward: only the next update waits for it (fence).
            slot.pending_event = event
            self._unfenced.append(event)
            return
        if self._copier is None:
            self._copier = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-copy")
        slot.pending_copy = self._copier.submit(self._copy_and_commit, slot, step, targets, sources, header)

    def _copy_and_commit(
        self, slot: _Slot, step: int, targets: list[torch.Tensor], sources: list[torch.Tensor], header: bytes
    ) -> None:
        """Copy thread: one `copy_` per tensor (it releases the GIL), then the slot's commit."""
        with torch.no_grad():
            for target, source in zip(targets, sources, strict=True):
                target.copy_(source)
        self._commit(slot, step, header)

    def copy_waiter(self, slot: _Slot) -> Callable[[], None]:
        """A call that returns once `slot`'s copy has finished (raises if it failed), from any thread."""
        copy, event = slot.pending_copy, slot.pending_event
        if copy is not None:
            return copy.result
        if event is not None:
            return event.synchronize
        return lambda: None

    def fence(self, *, block: bool = True) -> None:
        """Wait (CPU) or order the update stream (GPU) after every copy started so far."""
        if self._unfenced:
            stream = torch.cuda.current_stream(self.device)
            for event in self._unfenced:
                stream.wait_event(event)
            self._unfenced.clear()
        if block:
            for slot in self.slots:
                if slot.pending_copy is not None:
                    with contextlib.suppress(Exception):  # reported by complete_pending
                        slot.pending_copy.result()

    def complete_pending(self) -> list[_Slot]:
        """Slots whose copy has finished since the last call (never waits). A copy that failed
        leaves its slot uncommitted and is recorded in `copy_errors`."""
        done = []
        for slot in self.slots:
            if slot.pending_event is not None and slot.pending_event.query():
                slot.pending_event = None
                self._commit(slot, slot.step, slot.pending_header)
                done.append(slot)
            elif slot.pending_copy is not None and slot.pending_copy.done():
                error = slot.pending_copy.exception()
                slot.pending_copy = None
                if error is None:
                    done.append(slot)
                else:
                    slot.step = -1
                    slot.holders.clear()
                    self.copy_errors.append(f"{type(error).__name__}: {error}")
        return done

    def synchronize(self) -> None:
        """Wait for every copy started so far (`complete_pending` then reports them)."""
        for slot in self.slots:
            if slot.pending_event is not None:
                slot.pending_event.synchronize()
        self.fence(block=True)

    def _commit(self, slot: _Slot, step: int, header: bytes) -> None:
        slot.files.commit(
            header=header, step=step, rank=self.rank, world_size=self.world_size, data_bytes=self.data_bytes
        )
        slot.step = step


@dataclass(frozen=True)
class Flags:
    """What one rank reports for the agreement, sampled after its decisions at a due step."""

    unheld: int
    """Staging slots no persist reads."""
    busy: dict[str, int]
    """Per tier: persists running or waiting for their slot's copy (the peer replica: exchanges in
    flight or queued; a disk tier: 0 or 1)."""
    committed: dict[str, int] = field(default_factory=dict)
    """Per disk tier: the newest step this rank committed (agreed: the least over ranks)."""
    failed: dict[str, int] = field(default_factory=dict)
    """Per disk tier: the newest step whose persist failed on this rank (agreed: on any rank)."""

    def complete(self, tier: str) -> int | None:
        """On agreed flags: the newest step of `tier` committed on every rank, or None if unknown.

        Each rank persists a tier's launches one at a time in the agreed order, so every rank has
        finished every launch up to the least newest-committed step; that step is complete unless
        some rank's persist of it failed (then a failure at it or later is the newest failed)."""
        least = self.committed.get(tier, -1)
        return least if least >= 0 and self.failed.get(tier, -1) < least else None


CATCH_UP_TIERS = frozenset({"peer"})
"""Owed tiers that a step between due steps takes a catch-up snapshot for: the peer replica, what a
lost node restores from. An owed disk tier waits for the next snapshot (at most one memory interval):
a catch-up for a disk tier is one more full snapshot and disk write, which costs more efficiency than
the interval it saves (docs/measurements.md)."""


class Agreement:
    """All ranks take the same checkpoint decisions, on an answer that was published a step ahead.

    Why agreement at all: a step only some ranks persisted can never be restored, and retention
    (keep k) would then prune different steps on different ranks, possibly leaving no step in common.

    Why it costs nothing in steady state: the flags the next due step decides on are *published*
    with an async all_reduce a step before it (the save of the step before a due step; with a
    snapshot every step, the fence before the due step's update), and the decision reads the result,
    which that time has let complete. That is sound because the flags can only get better in between:
    a tier idle on every rank when sampled stays idle, and a slot no persist reads stays unheld, until
    the next launch -- and launches happen only at due steps, decided from these same results.

    A tier the answer shows busy is skipped on it, without asking again, and owed: the next snapshot
    that finds it free writes the newest state. The peer replica is busy only once an exchange is
    queued behind the one in flight (`ReplicaWorker.QUEUE`): a due snapshot the previous exchange
    still runs at is queued, not skipped. For the peer replica (`CATCH_UP_TIERS`) the flags are
    published again at once, and at each step after it until it is launched, and the first step whose
    answer shows it free takes a catch-up snapshot for it. So an exchange that ended in the step since
    the flags were sampled costs the partner's copy about a step, not an interval (a disk tier, an
    interval at most). Asking again at the due step, with a blocking all_reduce of the current
    flags, would buy that step back, at a price: the tiers behind a snapshot are busy at most
    snapshots whenever they take longer than the interval (the peer replica's exchange at short
    intervals, a durable write), and each blocking round then waits for the collective through cores
    the exchange and the writers keep busy -- milliseconds of loop stall at each snapshot
    (docs/measurements.md, `bench checkpoint`'s replicated rows), and a global synchronization point
    on a large job. Only a snapshot that the answer would give up for want of a slot (on some rank) asks
    again, now: the memory snapshot is what most faults restore from.

    The peer replica is launched at every snapshot: it starts the moment its snapshot's copy ends
    (during the next forward/backward, `ReplicaWorker` waits for the copy itself) and is done by the
    time the flags are sampled whenever an exchange takes less than the interval less a step. Sampled
    right after the launch it would always be busy; published at the due step's fence, the loop would
    wait milliseconds for the answer (docs/measurements.md). The first due step of a process group
    (start, restore, in-process restart) runs a blocking all_reduce: nothing was published in it. The
    result is read only after `Work.wait()`; on NCCL jobs the flags go over a gloo side group, so
    reading them never synchronizes the GPU stream.

    A disk tier is launched only if every rank keeps a slot free after it (unheld >= 2): fresh memory
    snapshots -- what most faults restore from -- come before a disk persist. With the slots the
    tiers need (`CheckpointConfig.slots_needed`: one per disk tier, two for the peer replica, one for
    the next snapshot; fewer is refused) an idle tier always finds them, so a due tier is skipped
    only while its own previous persist runs.
    """

    def __init__(self, *, tiers: list[str], device: torch.device, disk_tiers: tuple[str, ...] = ()) -> None:
        self.tiers = tiers
        self.disk_tiers = disk_tiers
        """Tiers whose committed and failed steps travel with the flags (job-wide retention)."""
        self.device = device
        self._group: Any = None
        self._side_group: Any = None
        self._pending: tuple[Any, torch.Tensor] | None = None
        self.last: Flags | None = None
        """The flags the newest decision was taken on (the reason a due tier was not launched)."""
        self.blocking_rounds = 0
        """Blocking all_reduces run: one per process group, and one per snapshot some rank had no
        slot for a step before; the rest were published async."""

    def reset(self) -> None:
        self._pending = None

    def answer(self, local: Flags) -> Flags | None:
        """The flags the next `decide` reads, waited for and left in place: the answer published a
        step ago (None when none was, in this process group), or `local` without a group."""
        group = self._world()
        if group is None:
            return local
        if self._pending is None:
            return None
        work, tensor = self._pending
        work.wait()
        return self._decode(tensor)

    def _world(self) -> Any:  # noqa: ANN401
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return None
        world = dist.group.WORLD
        if world is not self._group:  # a new process group (in-process restart): old results are void
            self._group, self._pending, self._side_group = world, None, None
            if dist.get_backend() != "gloo":
                self._side_group = dist.new_group(backend="gloo")
        return self._side_group or world

    def _encode(self, flags: Flags) -> torch.Tensor:
        # MAX-reduced: -unheld gives the minimum over ranks, busy flags the "any rank" value; -committed
        # the least newest-committed step, failed the newest failure on any rank.
        return torch.tensor(
            [
                -flags.unheld,
                *(int(flags.busy[t]) for t in self.tiers),
                *(-flags.committed.get(t, -1) for t in self.disk_tiers),
                *(flags.failed.get(t, -1) for t in self.disk_tiers),
            ],
            dtype=torch.int64,
        )

    def _decode(self, tensor: torch.Tensor) -> Flags:
        values = tensor.tolist()
        busy, rest = values[1 : 1 + len(self.tiers)], values[1 + len(self.tiers) :]
        n = len(self.disk_tiers)
        return Flags(
            unheld=-values[0],
            busy=dict(zip(self.tiers, busy, strict=True)),
            committed={t: -v for t, v in zip(self.disk_tiers, rest[:n], strict=True)},
            failed=dict(zip(self.disk_tiers, rest[n:], strict=True)),
        )

    def decide(self, local: Flags, due: list[str], *, num_slots: int) -> tuple[bool, dict[str, bool]]:
        """(stage a memory snapshot?, launch each due tier?) -- the same answer on every rank."""
        group = self._world()
        if group is None:
            agreed = local
        elif self._pending is not None:
            work, tensor = self._pending
            self._pending = None
            work.wait()
            agreed = self._decode(tensor)
            if agreed.unheld < 1:
                # A step old, and it would give up the snapshot itself: ask again, now (a busy tier
                # is skipped on the old answer and owed: see the class's docstring).
                agreed = self._blocking(local, group)
        else:
            agreed = self._blocking(local, group)
        self.last = agreed
        return agreed.unheld >= 1, {tier: self.may_launch(agreed, tier, num_slots) for tier in due}

    @classmethod
    def may_launch(cls, agreed: Flags, tier: str, num_slots: int) -> bool:
        """On `agreed`: the tier is idle on every rank, and every rank has the snapshot's slot and
        keeps the slots free that a launch needs (`keep_free`, at least the snapshot's own)."""
        queue = ReplicaWorker.QUEUE if tier == "peer" else 1
        return agreed.busy[tier] < queue and agreed.unheld >= cls.keep_free(tier, num_slots)

    def _blocking(self, local: Flags, group: Any) -> Flags:  # noqa: ANN401
        tensor = self._encode(local)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
        self.blocking_rounds += 1
        return self._decode(tensor)

    @staticmethod
    def keep_free(tier: str, num_slots: int) -> int:
        """Free slots a launch needs on every rank (one slot: persisting it blocks snapshots, the only
        choice). The peer replica takes the slot just staged for well under a disk write, and a lost
        node's partner copy is worth more than the next fresh snapshot: it needs only that one."""
        return 1 if tier == "peer" else min(2, num_slots)

    def publish(self, flags: Flags) -> None:
        group = self._world()
        if group is None:
            return
        tensor = self._encode(flags)
        self._pending = (dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group, async_op=True), tensor)


class TieredCheckpointer(Checkpointer):
    def __init__(
        self,
        *,
        config: CheckpointConfig,
        rank: int,
        world_size: int,
        node_index: int,
        device: torch.device,
        emit: Callable[[str, dict[str, Any]], None],
        persist_delay_s: float = 0.0,
    ) -> None:
        self.config = config
        # The disk tiers follow from the config: one derivation, so they can never disagree with it.
        self.stores = stores = disk_stores(config)
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
            num_slots=config.staging_slots,
            device=device,
        )
        self.workers: dict[str, PersistWorker | ReplicaWorker] = {
            store.tier: PersistWorker(tier=store.tier, rank=rank, timeout_s=config.persist_timeout_s)
            for store, _, _ in stores
        }
        self._locations = {store.tier: store.location for store, _, _ in stores}
        # (tier, cadence) of every background tier; the peer replica follows each memory snapshot.
        self._cadences = [(store.tier, every) for store, every, _ in stores]
        per_node = ranks_per_node()
        nodes = world_size // per_node
        if config.peer_replicas and nodes > 1:
            if config.peer_replicas >= nodes:
                raise ValueError(
                    f"checkpoint.peer_replicas={config.peer_replicas} needs more nodes than replicas "
                    f"(this job has {nodes}): lower it to at most {nodes - 1}"
                )
            self.workers["peer"] = ReplicaWorker(
                rank=rank,
                world_size=world_size,
                ranks_per_node=per_node,
                replicas=config.peer_replicas,
                memory_dir=config.memory_dir,
                timeout_s=config.peer_timeout_s,
                domain=os.environ.get(FAILURE_DOMAIN_ENV, ""),
            )
            self._locations["peer"] = str(config.memory_dir)
            self._cadences.append(("peer", config.memory_every))
        self._disk = tuple(store.tier for store, _, _ in stores)
        self.agreement = Agreement(
            tiers=[tier for tier, _ in self._cadences], device=device, disk_tiers=self._disk
        )
        self._closing = False
        self._owed: set[str] = set()
        """Tiers whose due persist was skipped (busy): each writes the newest state at the next
        snapshot that finds it free (the replica: at the first step that does, a catch-up snapshot;
        see Agreement), not only at its next due step -- no tier silently falls behind. The same on
        every rank: it follows from the agreed decisions."""
        self._persist_delay_s = persist_delay_s
        self._publish_at_fence = False
        """A snapshot every step: the next update's fence publishes the flags its save decides on."""
        self._committed = dict.fromkeys(self._disk, -1)
        """Per disk tier: the newest step this rank committed, in this process or (after a restore)
        on every rank."""
        self._failed_step = dict.fromkeys(self._disk, -1)
        self._complete = dict.fromkeys(self._disk, -1)
        """Per disk tier: the newest step known committed on every rank (-1: none known); retention
        never deletes it (`ShardStore.prune`)."""
        self._launched: dict[str, int] = {}
        """Per tier: the step of its newest launch."""
        self._write_steps = dict.fromkeys(self._disk, 0)
        """Per disk tier: steps the newest finished persist took, launch to outcome."""
        self._behind: set[str] = set()
        """Disk tiers reported behind (`checkpoint_behind`) and not caught up since."""
        self._step = -1
        """The step of the newest `save`."""
        self._first_step = -1
        """The step of this process's first `save`."""
        self._after_restore = False
        """The first save after a restore snapshots at once for the owed tiers (see `_load_latest`)."""
        for store, _, _ in stores:
            # A killed predecessor's writer left them: this rank runs one process at a time.
            for path in store.remove_temporaries(rank):
                self.emit("checkpoint_cleaned", {"tier": store.tier, "rank": rank, "path": path})
        for worker in self.workers.values():
            worker.start()

    # --- loop side ------------------------------------------------------------------------------
    def _save(self, step: int, state: dict[str, Any]) -> None:
        started = time.perf_counter()
        self.stats.save_calls += 1
        self._step = step
        self._poll()
        every = self.config.memory_every
        after_restore, self._after_restore = self._after_restore, False
        if every and step % every == 0:
            self._snapshot(step, state)
        elif every and after_restore and self._owed:
            # The restored state, at once: partners lost their copies with the node that held them,
            # and a persist a restart cut is redone from here (every rank owes the same: `_restored`).
            self._snapshot(step, state, catch_up=True)
        elif every and self._owed & CATCH_UP_TIERS and self._owed_tier_free():
            self._snapshot(step, state, catch_up=True)
        self._check_lag(step)
        # The flags for the next step's decision (a collective: a function of the step and of agreed
        # decisions alone, the same on every rank): published here, a step before a due step, and
        # after each step that left the replica owed (for a catch-up snapshot); with a snapshot every
        # step, at the fence before the next update, the last moment before it.
        if every == 1:
            self._publish_at_fence = True
        elif every and ((step + 1) % every == 0 or self._owed & CATCH_UP_TIERS):
            self.agreement.publish(self._local_flags())  # after `_poll` above: the freshest flags
        self._count_stall(time.perf_counter() - started)

    def _learn(self, agreed: Flags) -> None:
        """Agreed flags tell the newest step each disk tier holds on every rank (`Flags.complete`),
        and whether its newest launch failed on some rank: then the tier is owed, and the next
        snapshot writes the newest state rather than waiting for the tier's next due step. The same on
        every rank: the answer and the launches are agreed."""
        for tier in self._disk:
            complete = agreed.complete(tier)
            if complete is not None and complete > self._complete[tier]:
                self._complete[tier] = complete
            launched = self._launched.get(tier, -1)
            if launched >= 0 and agreed.failed.get(tier, -1) >= launched and tier not in self._owed:
                self._owed.add(tier)
                self.emit(
                    "checkpoint_owed",
                    {
                        "step": self._step,
                        "rank": self.rank,
                        "tiers": [tier],
                        "complete": dict(self._complete),
                        "reason": f"its persist of step {launched} failed on some rank: written "
                        "from the newest state at the next snapshot",
                    },
                )

    def _check_lag(self, step: int) -> None:
        """A disk tier more than one cadence plus one write behind is reported, never silent.

        Its age: steps since this rank's newest committed step of the tier. With the staging slots
        the tiers need (`CheckpointConfig.slots_needed`), a tier launched at every due step is at
        most one cadence plus one write (the steps its newest persist took, one at least: outcomes
        are read at a save) behind; more means its writes outlast the cadence, a persist failed, or a
        restart cut one and it is not redone yet. Reported once when it falls behind (an event, the
        metric `checkpoint_age_steps`, the run report's warning) and once when it catches up."""
        for tier, every in self._cadences:
            if tier not in self._committed:
                continue
            committed = self._committed[tier]
            if self._first_step < 0:
                self._first_step = step
            # Nothing committed yet: counted from this process's first step (its first persist due).
            age = step - (committed if committed >= 0 else self._first_step - 1)
            allowed = every + max(1, self._write_steps[tier])
            if age > allowed and tier not in self._behind:
                self._behind.add(tier)
                self.stats.behind[tier] += 1
                self.emit(
                    "checkpoint_behind",
                    {
                        "tier": tier,
                        "step": step,
                        "rank": self.rank,
                        "newest_step": committed,
                        "age_steps": age,
                        "allowed_steps": allowed,
                        "every": every,
                        "reason": self._lag_reason(tier),
                    },
                )
            elif age <= allowed and tier in self._behind:
                self._behind.discard(tier)
                self.emit(
                    "checkpoint_caught_up",
                    {"tier": tier, "step": step, "rank": self.rank, "newest_step": committed},
                )

    def _lag_reason(self, tier: str) -> str:
        if self.stats.last_error.get(tier) and self._failed_step[tier] >= self._committed[tier]:
            return f"its newest persist failed: {self.stats.last_error[tier]}"
        if tier in self._owed:
            return "its due persist was skipped while the previous one ran: writes outlast the cadence"
        return "its persist in flight outlasts one cadence plus the previous write"

    def _owed_tier_free(self) -> bool:
        """Between due steps: does the answer published at the last save free the owed replica?
        Then this step takes a catch-up snapshot for it, the newest state (see Agreement)."""
        agreed = self.agreement.answer(self._local_flags())
        slots = len(self.memory.slots)
        if agreed is not None:
            self._learn(agreed)
        return agreed is not None and any(
            self.agreement.may_launch(agreed, tier, slots) for tier in self._owed & CATCH_UP_TIERS
        )

    def _fence(self) -> None:
        publish, self._publish_at_fence = self._publish_at_fence, False
        copying = any(slot.pending for slot in self.memory.slots)
        if not (copying or publish):
            return
        started = time.perf_counter()
        if copying:
            self.memory.fence(block=True)
            self._harvest_copies()
        if publish:
            self._poll()  # finished persists and exchanges release their slots: the freshest flags
            self.agreement.publish(self._local_flags())
        elapsed = time.perf_counter() - started
        self.stats.fence_s += elapsed
        self._count_stall(elapsed)

    def _count_stall(self, seconds: float) -> None:
        self.stats.stall_s += seconds
        self.stats.max_stall_s = max(self.stats.max_stall_s, seconds)

    def _snapshot(self, step: int, state: dict[str, Any], *, catch_up: bool = False) -> None:
        """Stage this step's state and launch the tiers due at it (`catch_up`: the owed ones only)."""
        snapshot_started = time.perf_counter()
        due = [
            tier
            for tier, every in self._cadences
            if tier in self._owed or (not catch_up and step % every == 0)
        ]
        skeleton, tensors, layout = flatten(state)
        # A new layout reallocates the slots: never under a writer that is still reading one.
        if layout.signature != self.memory.signature and not any(
            s.holders - {PEER_PIN} for s in self.memory.slots
        ):
            self._settle()
            for slot in self.memory.slots:  # a copy of another layout is no restore point now
                slot.holders.discard(PEER_PIN)
            self.memory.ensure(layout)
        deciding, blocking = time.perf_counter(), self.agreement.blocking_rounds
        slots = len(self.memory.slots)
        can_stage, launch = self.agreement.decide(self._local_flags(), due, num_slots=slots)
        launch = self._with_owed(launch, slots)
        # What the snapshot's stall is made of (the checkpoint_staged event).
        timing = {
            "decide_s": round(time.perf_counter() - deciding, 5),
            "blocking": self.agreement.blocking_rounds > blocking,
        }
        slot = None
        if can_stage and layout.signature == self.memory.signature:
            slot = self.memory.free_slot()
            if slot is None and any(s.pending for s in self.memory.slots):
                # Only when the loop skipped fence(): the previous copy still runs. Let it finish
                # (inside this save, so its time is counted once, as save's).
                self.memory.fence(block=True)
                self._harvest_copies()
                slot = self.memory.free_slot()
        if slot is None and catch_up:
            return  # nothing was due at this step: the owed tiers stay owed
        if slot is None:
            reason = "no free staging slot" if can_stage else "no free staging slot on some rank"
            if layout.signature != self.memory.signature:
                reason = "state layout changed while a persist reads the slots"
            self.stats.skipped["memory"] += 1
            self.emit("checkpoint_skipped", {"tier": "memory", "step": step, "reason": reason})
            launch = dict.fromkeys(due, False)
        else:
            self.memory.stage(slot, step, tensors, encode_header(skeleton, layout))
            self.stats.staged += 1
            # One line per snapshot: the run's stall per checkpoint is counted against these.
            timing["stage_s"] = round(time.perf_counter() - snapshot_started, 5)
            if catch_up:
                timing["catch_up"] = True
            self.emit("checkpoint_staged", {"tier": "memory", "step": step, **timing})
        self._launch(step, slot, launch, catch_up=catch_up)  # no slot: every launch is False

    def _with_owed(self, launch: dict[str, bool], slots: int) -> dict[str, bool]:
        """`launch` and the tiers owed on the very answer it was decided on (a failed persist)."""
        agreed = self.agreement.last
        if agreed is None:
            return launch
        self._learn(agreed)
        owed = self._owed - launch.keys()
        return launch | {tier: Agreement.may_launch(agreed, tier, slots) for tier in owed}

    def _launch(self, step: int, slot: _Slot | None, launch: dict[str, bool], *, catch_up: bool) -> None:
        """Hand `slot` to each due tier agreed to launch; the others are skipped and owed."""
        for tier, go in launch.items():
            if go and slot is not None:
                slot.holders.add(tier)
                self._owed.discard(tier)
                self._launched[tier] = step
                worker = self.workers[tier]
                if isinstance(worker, ReplicaWorker):
                    worker.prepare()  # every rank launches at this step alike: a collective is safe
                    # Handed over now: its thread starts the exchange the moment the copy ends, so
                    # it runs during the next forward/backward (see Agreement).
                    self._submit_to(slot, tier, ready=self.memory.copy_waiter(slot))
                # A disk tier is handed the slot once its copy has finished (`_harvest_copies`).
                continue
            if catch_up:
                continue  # still busy: owed, and already counted as skipped at its due step
            self._owed.add(tier)
            self.stats.skipped[tier] += 1
            agreed = self.agreement.last
            why = (
                "previous persist running"
                if agreed is None or agreed.busy.get(tier, False)
                else "no staging slot to spare on some rank"
            )
            self.emit(
                "checkpoint_skipped",
                {
                    "tier": tier,
                    "step": step,
                    "reason": f"{why} (owed: the next snapshot that finds the tier free writes the "
                    "newest state)",
                },
            )

    def _local_flags(self) -> Flags:
        busy = {
            tier: max(
                worker.depth if isinstance(worker, ReplicaWorker) else int(worker.busy),
                sum(1 for slot in self.memory.slots if tier in slot.holders),
            )
            for tier, worker in self.workers.items()
        }
        return Flags(
            unheld=self.memory.unheld(),
            busy=busy,
            committed=dict(self._committed),
            failed=dict(self._failed_step),
        )

    def _submit(self, slot: _Slot) -> None:
        """Hand a copied slot to each of its holders not handed it yet."""
        for tier in sorted(slot.holders - {PEER_PIN} - slot.submitted):
            self._submit_to(slot, tier)
        slot.pending_header = b""

    def _submit_to(self, slot: _Slot, tier: str, *, ready: Callable[[], None] | None = None) -> None:
        worker = self.workers[tier]
        if self._closing and isinstance(worker, ReplicaWorker):
            slot.holders.discard(tier)
            return
        if worker.depth >= worker.QUEUE if isinstance(worker, ReplicaWorker) else worker.busy:
            return
        # Only the replica is handed a slot whose copy may still run: it waits for `ready` itself.
        early = {"ready": ready} if ready is not None else {}
        try:
            worker.submit(
                step=slot.step,
                slot=slot.index,
                tier=tier,
                location=self._locations[tier],
                fsync=self.config.fsync,
                slot_path=str(slot.files.data),
                header=slot.pending_header or slot.files.header.read_bytes(),
                data_bytes=self.memory.data_bytes,
                rank=self.rank,
                world_size=self.world_size,
                keep=self.config.keep,
                complete=self._complete.get(tier),
                delay_s=self._persist_delay_s,
                **early,
            )
            slot.submitted.add(tier)
        except Exception as exc:  # noqa: BLE001 - a broken worker must not stop training
            slot.holders.discard(tier)
            self._failed(tier, slot.step, f"could not start the persist: {exc}", kind="failed")

    def _harvest_copies(self) -> None:
        for slot in self.memory.complete_pending():
            self._submit(slot)
        while self.memory.copy_errors:
            error = self.memory.copy_errors.pop()
            self.stats.failed["memory"] += 1
            self.stats.last_error["memory"] = error
            self.emit("checkpoint_failed", {"tier": "memory", "rank": self.rank, "error": error})

    def _settle(self) -> None:
        """Wait for every snapshot copy, commit it and hand it to its writers."""
        self.memory.synchronize()
        self._harvest_copies()

    def _poll(self) -> None:
        self._harvest_copies()
        for tier, worker in self.workers.items():
            while (outcome := worker.poll()) is not None:  # the replica may have two to report
                self._record(tier, outcome)

    def _record(self, tier: str, outcome: dict[str, Any] | None) -> None:
        """A finished persist or exchange: its slot released, counted, reported (each outcome once:
        a worker hands it out a single time, from `poll` or `wait`)."""
        if outcome is None:
            return
        self.memory.slots[outcome["slot"]].holders.discard(tier)
        if outcome["ok"] and tier == "peer":
            self._pin_replicated(outcome["slot"])
        if tier in self._committed:
            self._write_steps[tier] = max(0, self._step - outcome["step"])
        if outcome["ok"] and tier in self._committed:
            self._committed[tier] = max(self._committed[tier], outcome["step"])
        if outcome["ok"]:
            self.stats.persisted[tier] += 1
            extra = {k: outcome[k] for k in ("bytes_sent", "bytes_received") if k in outcome}
            self.emit(
                "checkpoint_committed",
                {
                    "tier": tier,
                    "step": outcome["step"],
                    "rank": self.rank,
                    "seconds": outcome["seconds"],
                    **extra,
                },
            )
        else:
            self._failed(tier, outcome["step"], outcome["error"], kind=outcome.get("kind", "failed"))

    def _pin_replicated(self, index: int) -> None:
        """Keep the snapshot the partners now hold a copy of until a newer one is replicated.

        A lost node's shards come back at the step of their newest copy on a partner, and the
        survivors' own shards must exist at that same step: the survivors' slot of that step is not
        reused meanwhile (one slot of `num_staging_slots`; the budget in k8s/trainer_args.py counts it)."""
        for slot in self.memory.slots:
            slot.holders.discard(PEER_PIN)
        self.memory.slots[index].holders.add(PEER_PIN)

    def _failed(self, tier: str, step: int, error: str, *, kind: str) -> None:
        if tier in self._failed_step:
            self._failed_step[tier] = max(self._failed_step[tier], step)
        if kind == "timeout":
            self.stats.timed_out[tier] += 1
        else:
            self.stats.failed[tier] += 1
        self.stats.last_error[tier] = error
        self.emit(
            f"checkpoint_{'timeout' if kind == 'timeout' else 'failed'}",
            {"tier": tier, "step": step, "rank": self.rank, "error": error, "retry": "next snapshot"},
        )

    # --- restore / lifecycle --------------------------------------------------------------------
    def _load_latest(self) -> Restored | None:
        # Restoring writes into the live parameters: no copy may still be reading them.
        self._settle()
        self.agreement.reset()  # a restore starts a new agreement history (new process group)
        self._publish_at_fence = False
        self._owed.clear()
        stores = [StoreSource(store, shared=shared) for store, _, shared in self.stores]
        collective = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        if collective:
            # Every shard from wherever it is: this node's RAM, a partner's RAM, local disk, durable.
            restored = restore_from_anywhere(
                memory_dir=self.config.memory_dir,
                stores=stores,
                rank=self.rank,
                world_size=self.world_size,
                device=self.device,
                emit=self.emit,
            )
        else:
            restored = load_newest(
                [self.memory, *stores],
                rank=self.rank,
                world_size=self.world_size,
                device=self.device,
                emit=self.emit,
            )
        self._restored(restored, collective=collective)
        return restored

    def _restored(self, restored: Restored | None, *, collective: bool) -> None:
        """What each tier owes after a restore (a collective: every rank owes the same).

        Each disk tier's newest step committed on every rank, exactly (the ranks' committed steps,
        gathered): retention keeps it, and a tier whose newest complete step is older than the
        restored state's last due step owes a persist -- one a restart or a fault cut on some rank,
        redone from the restored state at the first step, not left to the next due step. The peer
        replica owes one too: a lost node took its partners' copies with it, and a second loss
        before the next due snapshot found no copy in RAM."""
        mine = {store.tier: sorted(store.manifests(self.rank)) for store, _, _ in self.stores}
        if collective:
            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, mine)
        else:
            gathered = [mine]
        for store, every, _ in self.stores:
            tier = store.tier
            common = set.intersection(*(set(ranks[tier]) for ranks in gathered))
            complete = max(common, default=-1)
            self._complete[tier] = self._committed[tier] = complete
            self._failed_step[tier] = -1
            if restored is not None and complete < restored.step // every * every:
                self._owed.add(tier)
        if restored is not None and "peer" in self.workers:
            self._owed.add("peer")
        self._after_restore = bool(self._owed)
        if self._owed:
            self.emit(
                "checkpoint_owed",
                {
                    "step": -1 if restored is None else restored.step,
                    "rank": self.rank,
                    "tiers": sorted(self._owed),
                    "complete": dict(self._complete),
                    "reason": "after the restore: written from the restored state at the next step",
                },
            )

    def _wait(self) -> None:
        # The end of training: no new replication round (a copy of the final state on a partner is
        # worth nothing once the job is done, and the partner may already have finished), but the one
        # in flight completes, so no exchange is left pending on its group when the process exits.
        self._closing = True
        self._settle()
        self._poll()
        deadline = time.monotonic() + self.config.persist_timeout_s
        # The disk tiers only: a replica in flight at the end is worth nothing once training is done,
        # and its partner may already be gone (an exchange ends at its group's timeout, unwaited for).
        disks = {tier: worker for tier, worker in self.workers.items() if isinstance(worker, PersistWorker)}
        while any(worker.busy for worker in disks.values()):
            self._poll()
            for slot in self.memory.slots:
                waiting = slot.holders & disks.keys()
                if waiting and not any(disks[tier].busy for tier in waiting):
                    self._submit(slot)  # a holder whose worker was busy when the slot was staged
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        for tier, worker in self.workers.items():
            if isinstance(worker, ReplicaWorker):
                # Its outcomes are recorded like any: a dropped one would leave the slot held for
                # "peer", and every later snapshot would find the replica busy (after a warm-up `wait`).
                until = time.monotonic() + self.config.peer_timeout_s
                while worker.busy and (outcome := worker.wait(deadline=until)) is not None:
                    self._record(tier, outcome)
        self._poll()
        # Only while waiting: a save after `wait()` (the checkpoint benchmark warms up this way)
        # replicates again. It once stayed set, and that benchmark's replica never ran.
        self._closing = False

    def _close(self) -> None:
        with contextlib.suppress(Exception):
            self._wait()
        for worker in self.workers.values():
            worker.close()
        for store, _, _ in self.stores:
            # A writer abandoned at close (hung or timed out) may still hold a temporary file: none
            # outlives this process (a write that passes its cancel check after this fails its rename).
            store.remove_temporaries(self.rank, pid=os.getpid())
        self.memory.release()

    def describe(self) -> dict[str, Any]:
        return {"rank": self.rank, "node": self.node_index, "pid": os.getpid(), **self.stats.as_dict()}
