"""Tiered checkpointing: the snapshot copy runs behind the loop; disks are written behind the copy.

The memory tier (memory.py) stages every due snapshot into a slot; tiers 2 (node-local disk) and 3
(durable) are written from the slots by background writer threads (persist.py), and the peer replica
sends them to partner nodes (replica.py). What ranks launch and skip is agreed (agreement.py).

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
import json
import os
import time
from collections import deque
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Self

import torch.distributed as dist

from nvrx_eks.training.checkpoint.agreement import CATCH_UP_TIERS, Agreement, Flags
from nvrx_eks.training.checkpoint.base import Checkpointer, Placement, Restored, State, resolve
from nvrx_eks.training.checkpoint.dcp_format import RANK_SECTION, Stager
from nvrx_eks.training.checkpoint.domains import node_domain
from nvrx_eks.training.checkpoint.memory import MemoryTier, Slot
from nvrx_eks.training.checkpoint.persist import PersistWorker
from nvrx_eks.training.checkpoint.replica import ReplicaWorker, ranks_per_node
from nvrx_eks.training.checkpoint.restore import restore
from nvrx_eks.training.checkpoint.shard import encode_header, flatten
from nvrx_eks.training.checkpoint.stats import CheckpointStats
from nvrx_eks.training.checkpoint.storage import disk_stores, finalize_newest

if TYPE_CHECKING:
    from collections.abc import Callable

    from nvrx_eks.training.checkpoint.config import CheckpointConfig


PEER_PIN = "peer-pinned"
"""Slot holder: the snapshot whose copy the partners hold (`TieredCheckpointer._pin_replicated`)."""

CARRIED = "_tiered_checkpointer"
"""The key, in the rank's own section (`RANK_SECTION`), under which each snapshot carries what the
checkpointer measured: each disk tier's recent write steps (JSON). A restarted process judges its
first writes against its predecessor's, wherever its state came back from (RAM, a partner, a disk); a
restore returns the caller's state without it."""

RECENT_WRITES = 4
"""Finished writes per disk tier whose slowest is one write of the lag allowance (its steps, launch
to outcome). A write's steps vary by one or two with the load, since its outcome is read at the
first save after it ends: judged by the newest write alone, a write a step or two slower than a fast
predecessor reads as a tier behind (docs/measurements.md)."""


class TieredCheckpointer(Checkpointer):
    @classmethod
    def from_config(cls, config: CheckpointConfig, placement: Placement) -> Self:
        return cls(config=config, placement=placement)

    def __init__(  # noqa: PLR0915 - one statement per part it starts, read top to bottom
        self, *, config: CheckpointConfig, placement: Placement, persist_delay_s: float = 0.0
    ) -> None:
        self.config = config
        # The disk tiers follow from the config: one derivation, so they can never disagree with it.
        self.stores = stores = disk_stores(config)
        self.placement = placement
        self.rank = rank = placement.rank
        self.world_size = world_size = placement.world_size
        self.node_index = placement.node_index
        self.device = device = placement.device
        self.emit = placement.emit
        self.stats = CheckpointStats()
        self.stager = Stager(rank=rank, world_size=world_size)
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
            problem = config.peer_nodes_problem(nodes)
            if problem:
                raise ValueError(f"checkpoint.{problem}")
            where = node_domain()
            self.workers["peer"] = ReplicaWorker(
                rank=rank,
                world_size=world_size,
                ranks_per_node=per_node,
                replicas=config.peer_replicas,
                memory_dir=config.memory_dir,
                timeout_s=config.peer_timeout_s,
                domain=where.domain,
            )
            # Which domain the partners are chosen by, and from what: a fallback is never silent.
            self.emit("checkpoint_peer_domain", {"rank": rank, **asdict(where)})
            self._locations["peer"] = str(config.memory_dir)
            self._cadences.append(("peer", config.memory_every))
        self._disk = tuple(store.tier for store, _, _ in stores)
        self._shared = {store.tier for store, _, _ in stores if store.shared}
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
        self._write_steps: dict[str, deque[int]] = {tier: deque(maxlen=RECENT_WRITES) for tier in self._disk}
        """Per disk tier: steps each of its newest finished persists took, launch to outcome; after a
        restore, until this process measures one, the restored snapshot's."""
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
    def _save(self, step: int, state: State) -> None:
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
        most one cadence plus one write behind. One write: the steps the slowest of the tier's
        `RECENT_WRITES` newest finished persists took, launch to outcome (the copy, the write, the
        outcome read at a save: one at least), measured in this process or, until it has, carried
        by the restored snapshot (`CARRIED`): a restarted process's first write takes about as many
        steps as its predecessor's, seldom the one step a process with nothing measured allows.
        More means its writes outlast the cadence or got slower than each recent one, a persist
        failed, or a restart cut one and it is not redone yet. Reported once when it falls behind
        (an event, the metric `checkpoint_age_steps`, the run report's warning) and once when it
        catches up."""
        for tier, every in self._cadences:
            if tier not in self._committed:
                continue
            committed = self._committed[tier]
            if self._first_step < 0:
                self._first_step = step
            # Nothing committed yet: counted from this process's first step (its first persist due).
            age = step - (committed if committed >= 0 else self._first_step - 1)
            allowed = every + max([1, *self._write_steps[tier]])
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
        return "its persist in flight outlasts one cadence plus the slowest of its recent writes"

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

    def _snapshot(self, step: int, state: State, *, catch_up: bool = False) -> None:
        """Stage this step's state and launch the tiers due at it (`catch_up`: the owed ones only)."""
        snapshot_started = time.perf_counter()
        due = [
            tier
            for tier, every in self._cadences
            if tier in self._owed or (not catch_up and step % every == 0)
        ]
        carried = {"write_steps": {tier: list(steps) for tier, steps in self._write_steps.items()}}
        staged = self.stager.stage(with_carried(resolve(state), json.dumps(carried)))
        skeleton, tensors, layout = flatten(staged.tree)
        # A new layout reallocates the slots: never under a writer that is still reading one.
        if layout.signature != self.memory.signature and not any(
            s.holders - {PEER_PIN} for s in self.memory.slots
        ):
            self._settle()
            for stale in self.memory.slots:  # a copy of another layout is no restore point now
                stale.holders.discard(PEER_PIN)
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
            slot.plan = staged.plan
            self.memory.stage(slot, step, tensors, encode_header(skeleton, layout, staged.key))
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

    def _launch(self, step: int, slot: Slot | None, launch: dict[str, bool], *, catch_up: bool) -> None:
        """Hand `slot` to each due tier agreed to launch; the others are skipped and owed."""
        for tier, go in launch.items():
            if go and slot is not None:
                slot.holders.add(tier)
                self._owed.discard(tier)
                self._launched[tier] = step
                worker = self.workers[tier]
                if isinstance(worker, ReplicaWorker):
                    # Every rank launches at this step alike: a collective is safe.
                    if worker.prepare():
                        self.emit(
                            "checkpoint_peer_partners",
                            {
                                "rank": self.rank,
                                "domains": worker.domains,
                                "targets": worker.targets,
                                "sources": worker.sources,
                            },
                        )
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

    def _submit(self, slot: Slot) -> None:
        """Hand a copied slot to each of its holders not handed it yet."""
        for tier in sorted(slot.holders - {PEER_PIN} - slot.submitted):
            self._submit_to(slot, tier)
        slot.pending_header = b""

    def _submit_to(self, slot: Slot, tier: str, *, ready: Callable[[], None] | None = None) -> None:
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
                plan=slot.plan,
                # Rank 0 of a shared tier: the job's newest complete step gets its global metadata.
                finalize=self.rank == 0 and tier in self._shared,
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
            self._write_steps[tier].append(max(0, self._step - outcome["step"]))
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
        reused meanwhile (one slot of `num_staging_slots`; the chart's memory budget,
        k8s/rank_config.py `memory_budget`, counts it)."""
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
    def _load_latest(
        self, target: Callable[[], dict[str, Any]] | None, validate: Callable[[dict[str, Any]], None] | None
    ) -> Restored | None:
        # Restoring writes into the live parameters: no copy may still be reading them.
        self._settle()
        self.agreement.reset()  # a restore starts a new agreement history (new process group)
        self._publish_at_fence = False
        self._owed.clear()
        # Every shard from wherever it is: this node's RAM, a partner's RAM, local disk, durable.
        restored = restore(
            memory_dir=self.config.memory_dir,
            stores=[store for store, _, _ in self.stores],
            stager=self.stager,
            placement=self.placement,
            target=None if target is None else lambda: with_carried(target(), ""),
            validate=validate,
        )
        carried = None
        if restored is not None:
            section = restored.state.get(RANK_SECTION)
            blob = section.pop(CARRIED, None) if isinstance(section, dict) else None
            with contextlib.suppress(TypeError, ValueError):
                carried = json.loads(blob) if blob else None
            if isinstance(section, dict) and not section:
                restored.state.pop(RANK_SECTION)
        collective = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        self._restored(restored, collective=collective, carried=carried)
        return restored

    def _restored(
        self, restored: Restored | None, *, collective: bool, carried: dict[str, Any] | None
    ) -> None:
        """What each tier owes after a restore (a collective: every rank owes the same).

        Each disk tier's newest step committed on every rank, exactly (the ranks' committed steps,
        gathered): retention keeps it, and a tier whose newest complete step is older than the
        restored state's last due step owes a persist -- one a restart or a fault cut on some rank,
        redone from the restored state at the first step, not left to the next due step. The peer
        replica owes one too: a lost node took its partners' copies with it, and a second loss
        before the next due snapshot found no copy in RAM. Each disk tier's write steps come from
        the restored snapshot (`carried`) where this process has measured none yet."""
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
            measured = (carried or {}).get("write_steps", {}).get(tier, [])
            if not self._write_steps[tier]:
                self._write_steps[tier].extend(steps for steps in measured if isinstance(steps, int))
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
        if self.rank == 0:
            # The end of training: the job's newest complete step gets its global metadata, so it
            # reads at any world size (the ranks' last persists are committed by now: the job's
            # finish waits for every rank's checkpointer before any closes).
            for store, _, _ in self.stores:
                if store.shared:
                    finalize_newest(store, emit=self.emit)
        for worker in self.workers.values():
            worker.close()
        for store, _, _ in self.stores:
            # A writer abandoned at close (hung or timed out) may still hold a temporary file: none
            # outlives this process (a write that passes its cancel check after this fails its rename).
            store.remove_temporaries(self.rank, pid=os.getpid())
        self.memory.release()

    def describe(self) -> dict[str, Any]:
        return {"rank": self.rank, "node": self.node_index, "pid": os.getpid(), **self.stats.as_dict()}


def with_carried(state: dict[str, Any], carried: str) -> dict[str, Any]:
    """`state` with the checkpointer's measurements (`CARRIED`) in the rank's own section."""
    section = state.get(RANK_SECTION)
    own = dict(section) if isinstance(section, dict) else {}
    own[CARRIED] = carried
    return {**state, RANK_SECTION: own}
