"""The memory tier's peer replica: each snapshot copied into the RAM of partner nodes.

Save side (`ReplicaWorker`): handed each memory snapshot as it is staged, its thread waits for the
snapshot's copy into the staging slot, then each rank sends that slot to the same local rank on the
next R nodes of the replica ring and receives, from the R nodes before it, their slots into its pod's
memory folder (`<memory_dir>/peer/rank-<src>/`, a memory-backed emptyDir: host RAM).

The ring (`node_ring`) puts nodes of different failure domains next to each other: a copy is worth
little on a node that one fault takes down with the original. A node's domain is hierarchical,
coarsest first: its zone, then the EC2 network nodes above it (layer 1 down to the one it attaches
to), from the node's labels (domains.py `node_domain`; the zone alone where they could not be read).
The ranks gather the domains when the replication group is made, and the ring alternates at the
coarsest level where the job's nodes differ: zones where they span zones, and within one zone (a p5
job's, for EFA) the network nodes, so that one switch's failure does not take a node and its partner
together. With one domain (or none set) the ring is the nodes in rank order, so every node's partners
are simply the next R nodes. Every node still sends R copies and holds R, so the memory each node
needs is the same whatever the domains.
It runs on a thread of its own over a gloo group of its own, so it never blocks the loop: the snapshot
copy stays the only stall, and a replication still running when the next snapshot is due is skipped
and counted like any busy tier (the agreement, agreement.py, decides it alike on every rank).

Why gloo from host memory on GPU nodes too, rather than NCCL: the slot already sits in pinned host
RAM; NCCL would need it back on the device (HBM and copy-engine time taken from training) and shares
the rails and streams of the gradient collectives, while gloo's TCP sends from host memory and leaves
the GPU alone. The bytes per snapshot and their seconds are in each `checkpoint_committed` event of
tier `peer` (what `bench checkpoint` reports); docs/measurements.md has no figures from EFA nodes yet.

The restore that takes each shard from wherever it is, partners' copies included: restore.py.
"""

from __future__ import annotations

import collections
import mmap
import os
import queue
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from nvrx_eks.training.checkpoint.domains import levels
from nvrx_eks.training.checkpoint.slot import SlotFiles

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence


PEER_DIR = "peer"
"""The folder, under the memory folder, of the copies received from partners (one folder per source
rank); restore.py reads them."""


def node_ring(domains: Sequence[str]) -> list[int]:
    """The nodes (by node rank, `domains[node]` its domain, domains.py `domain`) in replica order, the
    same on every rank: it depends on the gathered domains only.

    At the coarsest level where the nodes differ (a zone, then network-node layer 1, 2, ...), each place
    goes to the group with the most nodes left that is not the previous place's (ties by name); each
    group's nodes come in their own ring order, found the same way one level down, so that inside a zone
    they alternate network nodes too. A node's successor is in another group wherever the groups' sizes
    allow it (a group holding more than half the nodes must neighbour itself somewhere); nodes alike at
    every level come in rank order, so one domain gives the nodes in rank order. A level a node's domain
    lacks (its labels could not be read) counts as a group of its own, "" by name."""
    paths = [levels(domain) for domain in domains]
    return _ring(list(range(len(domains))), paths, level=0)


def _ring(nodes: list[int], paths: list[list[str]], *, level: int) -> list[int]:
    def at(node: int, depth: int) -> str:
        return paths[node][depth] if depth < len(paths[node]) else ""

    depth = max((len(paths[node]) for node in nodes), default=0)
    while level < depth and len({at(node, level) for node in nodes}) == 1:
        level += 1  # alike here: the groups are one level down
    if level >= depth:
        return sorted(nodes)
    groups: dict[str, list[int]] = {}
    for node in nodes:
        groups.setdefault(at(node, level), []).append(node)
    left = {name: _ring(members, paths, level=level + 1) for name, members in groups.items()}
    ring: list[int] = []
    previous: str | None = None
    while left:
        ranked = sorted(left, key=lambda d: (d == previous, -len(left[d]), d))
        previous = ranked[0]
        ring.append(left[previous].pop(0))
        if not left[previous]:
            del left[previous]
    return ring


def _neighbours(
    rank: int,
    *,
    world_size: int,
    ranks_per_node: int,
    replicas: int,
    domains: Sequence[str] | None,
    sign: int,
) -> list[int]:
    nodes = world_size // ranks_per_node
    ring = node_ring(domains if domains is not None else [""] * nodes)
    node, local = divmod(rank, ranks_per_node)
    at = ring.index(node)
    return [ring[(at + sign * k) % nodes] * ranks_per_node + local for k in range(1, replicas + 1)]


def _request(work: dist.Work | None) -> dist.Work:
    """A point-to-point send's request. torch answers None only to a rank outside `group`, and every
    rank is in the replication group, so None is a broken invariant, not a send to skip."""
    if work is None:
        raise RuntimeError("a send from a rank outside the replication group")
    return work


def partner_ranks(
    rank: int, *, world_size: int, ranks_per_node: int, replicas: int, domains: Sequence[str] | None = None
) -> list[int]:
    """The ranks that hold copies of `rank`'s shard: the same local rank on the next `replicas` nodes of
    the ring (`node_ring`; `domains`: each node's failure domain, by node rank)."""
    return _neighbours(
        rank, world_size=world_size, ranks_per_node=ranks_per_node, replicas=replicas, domains=domains, sign=1
    )


def source_ranks(
    rank: int, *, world_size: int, ranks_per_node: int, replicas: int, domains: Sequence[str] | None = None
) -> list[int]:
    """The ranks whose shards `rank` holds: the same local rank on the previous `replicas` nodes of the
    ring."""
    return _neighbours(
        rank,
        world_size=world_size,
        ranks_per_node=ranks_per_node,
        replicas=replicas,
        domains=domains,
        sign=-1,
    )


@dataclass
class _Exchange:
    round_id: int
    step: int
    slot: int
    done: threading.Event


class ReplicaWorker:
    """Sends this rank's staged slot to its partners and stores what its sources send, on a thread.

    The same interface as a disk tier's PersistWorker (submit / poll / busy), so the checkpointer's
    agreement, coalescing and slot holding treat replication as one more background tier. Unlike a
    disk writer it takes one exchange queued behind the one in flight (`QUEUE`): every rank launches
    at the same steps, so the exchanges run in the same order everywhere, and a due snapshot the
    previous exchange still runs at is sent the moment it ends. Skipped instead, and caught up a step
    later with a snapshot of its own, an exchange a little longer than the interval less a step put
    the replica in a pattern where every due step was skipped and caught up a step later.
    """

    QUEUE = 2
    """Exchanges in flight or queued at most; a launch needs fewer on every rank."""

    tier = "peer"

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        ranks_per_node: int,
        replicas: int,
        memory_dir: Path,
        timeout_s: float,
        domain: str = "",
    ) -> None:
        """`domain`: this node's failure domain (domains.py `node_domain`); the partners are chosen
        once every rank's is known (`prepare`)."""
        self.rank = rank
        self.domain = domain
        self.ranks_per_node = ranks_per_node
        self.replicas = replicas
        self.domains: list[str] | None = None
        """Each node's failure domain, by node rank, as gathered by `prepare`."""
        self.targets = partner_ranks(
            rank, world_size=world_size, ranks_per_node=ranks_per_node, replicas=replicas
        )
        self.sources = source_ranks(
            rank, world_size=world_size, ranks_per_node=ranks_per_node, replicas=replicas
        )
        self.world_size = world_size
        self.root = memory_dir / PEER_DIR
        self.keep = 2
        self.timeout_s = timeout_s
        self.group: Any = None
        self._world: Any = None
        self._runner: _Runner | None = None
        self._pending: collections.deque[_Exchange] = collections.deque()
        """Exchanges handed to the runner and not reported yet, oldest first (it runs them in order)."""
        self._outcomes: dict[int, dict[str, Any]] = {}
        self._rounds = 0
        self._abandoned: collections.deque[dict[str, Any]] = collections.deque()

    # The PersistWorker interface -------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self.depth > 0

    @property
    def depth(self) -> int:
        """Exchanges in flight or queued, not reported yet."""
        unfinished = [x for x in self._pending if not x.done.is_set()]
        if unfinished and self._world is not dist.group.WORLD:
            # A new process group (in-process restart): the exchanges still running belong to the
            # old attempt, whose peers may never answer; they end at their group's timeout, unwaited
            # for, on their runner's thread (the next exchange gets a new runner), and their slots
            # are released (`poll` reports them failed). One that had finished is reported as it
            # ended: abandoned too, it was counted failed and its copy on the partners never pinned.
            for exchange in unfinished:
                self._pending.remove(exchange)
                self._abandoned.append(
                    {
                        "ok": False,
                        "step": exchange.step,
                        "slot": exchange.slot,
                        "error": "abandoned: the process group it ran on was replaced (restart)",
                    }
                )
            self._stop_runner()
        return len(self._pending)

    def warm(self) -> bool:
        return True  # a thread of the trainer: nothing to start, nothing to import

    def start(self) -> None:
        return None

    def prepare(self) -> bool:
        """On the loop's thread, at a step every rank launches alike: (re)create the replication group.
        True when it did, and so chose the partners anew (`targets`, `sources`, from `domains`).

        A new default group (in-process restart, restore) voids the old one: its operations belong to
        the old attempt and time out on their own."""
        world = dist.group.WORLD
        made = world is not self._world
        if made:
            self._world = world
            self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=self.timeout_s))
            # Node ranks come from the rendezvous, so which node is where is known only now.
            gathered: list[Any] = [None] * self.world_size
            dist.all_gather_object(gathered, self.domain, group=self.group)
            self.domains = [
                str(gathered[node * self.ranks_per_node])
                for node in range(len(gathered) // self.ranks_per_node)
            ]
            self.targets = partner_ranks(
                self.rank,
                world_size=self.world_size,
                ranks_per_node=self.ranks_per_node,
                replicas=self.replicas,
                domains=self.domains,
            )
            self.sources = source_ranks(
                self.rank,
                world_size=self.world_size,
                ranks_per_node=self.ranks_per_node,
                replicas=self.replicas,
                domains=self.domains,
            )
        return made

    def submit(
        self,
        *,
        step: int,
        slot: int,
        slot_path: str,
        header: bytes,
        data_bytes: int,
        ready: Callable[[], None] | None = None,
        **_: object,
    ) -> None:
        """Start the exchange of `slot` on a thread; `ready()` (if given) returns once the slot's
        snapshot copy has finished: the thread calls it first, so the slot may still be copying."""
        if self._world is not dist.group.WORLD:
            # Staged before a restart, copied after it: the partners' attempt is another one.
            raise RuntimeError("the replication group belongs to an earlier process group")
        if self.depth >= self.QUEUE:
            raise RuntimeError("peer replica: an exchange is already queued")
        group = self.group
        self._rounds += 1
        target_slot = self._rounds % self.keep
        if self._runner is None:
            self._runner = _Runner(name=f"peer-replica-{self.rank}")
        done = self._runner.submit(
            self._exchange,
            round_id=self._rounds,
            group=group,
            step=step,
            slot=slot,
            slot_path=slot_path,
            header=header,
            data_bytes=data_bytes,
            target_slot=target_slot,
            ready=ready,
        )
        self._pending.append(_Exchange(self._rounds, step, slot, done))

    def poll(self, *, now: float | None = None) -> dict[str, Any] | None:  # noqa: ARG002
        """The oldest outcome not reported yet (abandoned ones first), or None."""
        self.depth  # noqa: B018 - first: it notices exchanges of an earlier process group
        if self._abandoned:
            return self._abandoned.popleft()
        if not self._pending or not self._pending[0].done.is_set():
            return None
        exchange = self._pending.popleft()
        outcome = self._outcomes.pop(exchange.round_id, None)
        if outcome is None:  # the runner ended without running it (stopped)
            outcome = {"ok": False, "step": exchange.step, "slot": exchange.slot, "error": "not run"}
        if not self._pending:
            self._outcomes.clear()  # late outcomes of abandoned rounds
        return outcome

    def wait(self, *, deadline: float) -> dict[str, Any] | None:
        """The oldest outcome, waiting for it until `deadline` (None if it is still running)."""
        if self._pending:
            self._pending[0].done.wait(timeout=max(0.0, deadline - time.monotonic()))
        return self.poll()

    def kill(self) -> None:
        self._pending.clear()
        self._stop_runner()

    def _stop_runner(self) -> None:
        # Its daemon thread may be blocked in an old group's exchange: left to that group's timeout,
        # after which the thread ends (the next exchange gets a runner of its own).
        if self._runner is not None:
            self._runner.stop()
        self._runner = None

    def close(self, *, timeout_s: float = 1.0) -> None:
        # Short: a consistent exchange takes milliseconds to seconds; one a gone partner left half done
        # ends at the group's timeout on its daemon thread, and the process need not wait for it.
        deadline = time.monotonic() + timeout_s
        while self._pending and self.wait(deadline=deadline) is not None:
            pass
        if self._runner is not None:
            self._runner.stop(timeout_s=timeout_s)
        self._runner = None

    # The exchange --------------------------------------------------------------------------------
    def _exchange(
        self,
        *,
        round_id: int,
        group: Any,  # noqa: ANN401
        step: int,
        slot: int,
        slot_path: str,
        header: bytes,
        data_bytes: int,
        target_slot: int,
        ready: Callable[[], None] | None,
    ) -> None:
        outcome: dict[str, Any] = {"ok": True, "step": step, "slot": slot}
        started = time.monotonic()
        try:
            if ready is not None:
                ready()  # the snapshot's copy into the slot (raises if it failed)
                started = time.monotonic()  # the exchange's own seconds, as the bench reports them
            with (
                Path(slot_path).open("rb") as source,
                # Copy-on-write, never written: torch.frombuffer of a read-only mapping warned in
                # every trainer's log ("PyTorch does not support non-writable tensors").
                mmap.mmap(source.fileno(), 0, access=mmap.ACCESS_COPY) as mm,
            ):
                data = torch.frombuffer(mm, dtype=torch.uint8, count=data_bytes) if data_bytes else None
                meta = torch.tensor([step, len(header), data_bytes], dtype=torch.int64)
                head = torch.frombuffer(bytearray(header), dtype=torch.uint8)
                sends = []
                for target in self.targets:
                    sends.append(_request(dist.isend(meta, target, group=group)))
                    sends.append(_request(dist.isend(head, target, group=group)))
                    if data is not None:
                        sends.append(_request(dist.isend(data, target, group=group)))
                received = sum(self._receive(src, group, target_slot) for src in self.sources)
                for work in sends:
                    work.wait()
                del data  # the view must go before the mapping closes
            outcome["bytes_sent"] = data_bytes * len(self.targets)
            outcome["bytes_received"] = received
        except Exception as exc:  # noqa: BLE001 - reported as a failed persist, retried next due step
            outcome = {"ok": False, "step": step, "slot": slot, "error": f"{type(exc).__name__}: {exc}"}
        outcome["seconds"] = round(time.monotonic() - started, 4)
        self._outcomes[round_id] = outcome

    def _receive(self, src: int, group: Any, target_slot: int) -> int:  # noqa: ANN401
        meta = torch.empty(3, dtype=torch.int64)
        dist.recv(meta, src, group=group)
        step, header_len, data_bytes = (int(v) for v in meta.tolist())
        head = torch.empty(header_len, dtype=torch.uint8)
        dist.recv(head, src, group=group)
        folder = self.root / f"rank-{src:05d}"
        folder.mkdir(parents=True, exist_ok=True)
        files = SlotFiles.at(folder, target_slot)
        files.uncommit()
        with files.data.open("wb+") as sink:
            sink.truncate(max(data_bytes, 1))
            if data_bytes:
                with mmap.mmap(sink.fileno(), data_bytes) as mm:
                    target = torch.frombuffer(mm, dtype=torch.uint8, count=data_bytes)
                    dist.recv(target, src, group=group)
                    del target
        files.commit(
            header=bytes(head.numpy()), step=step, rank=src, world_size=self.world_size, data_bytes=data_bytes
        )
        return data_bytes


class _Runner:
    """One daemon thread running the exchanges handed to it, in order. A thread per exchange would cost
    the loop milliseconds at every snapshot to start (its creator waits until it runs; on a loaded
    host that wait is long); this one is started once per process group, and stopped by `close` (or
    `kill`, after its exchange).

    Between exchanges the thread holds nothing of the last one: kept while it waits for the next, the
    last call's arguments would keep the replication group alive, and a gloo group still alive when
    the interpreter exits aborts the process ("terminate called without an active exception", exit
    134) after training ended well (tests/checkpoint/test_checkpoint_overlap.py checks no thread
    outlives close).
    """

    def __init__(self, *, name: str) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[..., None], dict[str, Any], threading.Event] | None] = (
            queue.SimpleQueue()
        )
        # Daemon: an exchange a gone partner left half done must never hold the process at exit.
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, call: Callable[..., None], **kwargs: Any) -> threading.Event:  # noqa: ANN401
        done = threading.Event()
        self._calls.put((call, kwargs, done))
        return done

    def stop(self, *, timeout_s: float = 0.0) -> None:
        """End the thread once the exchanges handed to it have run (waiting up to `timeout_s`)."""
        self._calls.put(None)
        self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        while (item := self._calls.get()) is not None:
            call, kwargs, done = item
            try:
                call(**kwargs)
            finally:
                done.set()
                del item, call, kwargs, done  # the group among them: see the class's docstring


def ranks_per_node() -> int:
    """Ranks on this node (torchelastic's LOCAL_WORLD_SIZE; 1 without a launcher)."""
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
