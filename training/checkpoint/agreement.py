"""The agreement: every rank takes the same checkpoint decisions (which tier to launch at a due step,
which to skip and owe), on flags all-reduced a step ahead so the loop never waits for them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from nvrx_eks.training.checkpoint.replica import ReplicaWorker


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
