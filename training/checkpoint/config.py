"""The checkpoint section of the kit's configuration (`ResilienceConfig.checkpoint`, any script's).

Field names are a contract: the trainer generates `--checkpoint-*` flags from them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

Implementation = Literal["tiered", "sync"]
CadenceTier = Literal["memory", "local", "durable"]
"""The tiers written on a cadence of their own (`<tier>_every`), fastest first."""
CADENCE_TIERS: tuple[CadenceTier, ...] = get_args(CadenceTier)
TIER_ORDER = ("memory", "peer_memory", "local", "durable")
"""Where a restore finds a shard, fastest first: a partner node's copy of the memory tier is second."""


class CheckpointConfig(BaseModel):
    """Where and how often each tier is written; every cadence counts optimizer steps (0 = tier off)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    implementation: Implementation = "tiered"
    """`tiered`: memory snapshot in the loop, disk tiers persisted in the background (the default).
    `sync`: every due tier written synchronously inside `save` (the simple reference; benchmarks)."""

    memory_dir: Path = Path("/dev/shm/nvrx-eks-checkpoint")  # noqa: S108 - shared memory by design
    """Tier 1: shared-memory folder holding the staging buffers. It outlives a killed process on the
    same node, so a restarted rank restores from RAM. On Kubernetes mount a memory-backed emptyDir
    here (the default 64 MiB /dev/shm of a pod is far too small)."""

    memory_every: int = Field(default=10, ge=0)
    """Tier 1 cadence: copy the state into a staging buffer every N steps (the only loop stall)."""

    local_dir: Path | None = None
    """Tier 2: node-local disk (the NVMe RAID0 of the node). None disables the tier."""

    local_every: int = Field(default=50, ge=0)
    """Tier 2 cadence: persist the newest snapshot to `local_dir` every N steps, in the background."""

    durable_dir: str | None = None
    """Tier 3: a shared path (FSx for Lustre mount) or `s3://bucket/prefix`. None disables the tier."""

    durable_every: int = Field(default=500, ge=0)
    """Tier 3 cadence: persist to `durable_dir` every N steps, in the background."""

    keep: int = Field(default=2, ge=1)
    """Retention: the newest k committed checkpoints kept per tier (and per rank)."""

    num_staging_slots: int | None = Field(default=None, ge=1, le=8)
    """Tier 1 buffers per rank; unset: `slots_needed()`, derived from the tiers switched on. A slot
    being read by a disk persist or the peer replica is never overwritten, so each tier that reads
    slots needs its own, or its due persists are skipped while another tier holds the slots (with 2
    slots and the peer replica, the disk tiers once wrote step 0 only). Set it only to raise it: a value
    below `slots_needed()` is refused. Costs this many copies of the state in RAM."""

    persist_timeout_s: float = Field(default=900.0, gt=0)
    """A background persist running longer than this is declared hung: its worker is killed, the
    failure reported, and the tier retried at the next snapshot. Size it above state bytes / the
    tier's write bandwidth."""

    peer_replicas: int = Field(default=0, ge=0)
    """Copies of each memory snapshot kept in the RAM of other nodes (the same local rank on the next
    R nodes), sent in the background after each snapshot (training/checkpoint/replica.py). A lost
    node's shards then come back from its partners' RAM. 0: off. Needs R < the number of nodes, and
    R x (state bytes per rank) more of each node's memory tier."""

    peer_timeout_s: float = Field(default=60.0, gt=0)
    """One replication exchange (send this rank's snapshot, receive its sources') longer than this
    fails: a partner is gone. Size it above snapshot bytes per rank x peer_replicas / network bandwidth.
    Also bounds how long a process exit waits for an exchange a lost partner left half done."""

    fsync: bool = True
    """fsync files and folders before a checkpoint counts as committed (turn off only in benchmarks
    that want the page-cache figure)."""

    @property
    def snapshots_in_memory(self) -> bool:
        """The tiered checkpointer with memory snapshots on: what the peer replica copies."""
        return self.implementation == "tiered" and self.memory_every > 0

    def peer_nodes_problem(self, nodes: int) -> str | None:
        """Peer replicas live on other nodes: R copies need at least R + 1 nodes."""
        replicas = self.peer_replicas
        if not replicas or replicas < nodes:
            return None
        return (
            f"peer_replicas={replicas} keeps copies on other nodes, and this job has {nodes} node(s); "
            f"set it to {'0' if nodes == 1 else f'at most {nodes - 1}'}, or run on {replicas + 1} or more "
            "nodes"
        )

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.peer_replicas and not self.snapshots_in_memory:
            raise ValueError(
                "peer_replicas copies memory snapshots: it needs implementation=tiered and memory_every >= 1"
            )
        if self.implementation == "tiered" and self.memory_every == 0 and self._disk_tiers_on():
            raise ValueError(
                "memory_every=0 with the tiered implementation: disk tiers persist from the memory "
                "snapshot; set memory_every >= 1 (or use implementation=sync)"
            )
        for tier in ("local", "durable"):
            every = getattr(self, f"{tier}_every")
            if every and self.memory_every and self.implementation == "tiered" and every % self.memory_every:
                raise ValueError(
                    f"{tier}_every={every} must be a multiple of memory_every={self.memory_every} "
                    "(each disk persist writes a memory snapshot)"
                )
        needed = self.slots_needed()
        if self.num_staging_slots is not None and self.num_staging_slots < needed:
            raise ValueError(
                f"num_staging_slots={self.num_staging_slots} is below the {needed} staging slots these "
                f"tiers need ({self.describe_slots()}): with fewer, a tier that finds the slots held "
                f"by the others skips its due persists and falls behind; leave num_staging_slots unset "
                f"(derived) or set it to at least {needed}"
            )
        if self.durable_dir is not None and self.durable_dir.startswith("s3://"):
            bucket = self.durable_dir.removeprefix("s3://").split("/", 1)[0]
            if not bucket:
                raise ValueError("durable_dir s3:// URL needs a bucket: s3://BUCKET/PREFIX")
        return self

    def _disk_tiers_on(self) -> bool:
        return bool(
            (self.local_dir is not None and self.local_every) or (self.durable_dir and self.durable_every)
        )

    def slot_users(self) -> dict[str, int]:
        """Staging slots each reader may hold at once, with the snapshot in the making (`next`).

        Each disk tier holds the slot it persists (one persist per tier at a time); the peer replica
        holds the slot of the exchange in flight, one queued behind it (a due snapshot the previous
        exchange still runs at) and the one whose copy the partners hold (kept until a newer copy
        lands: a lost node's partner copy and the survivors' own shards must be of one step); one
        slot stays free for the next snapshot. With fewer, a due tier finds no slot to
        spare while the others hold theirs, and is skipped (training/checkpoint/agreement.py
        `Agreement.may_launch`)."""
        if self.implementation != "tiered" or not self.memory_every:
            return {}
        users = {"next": 1}
        users.update({tier: 1 for tier, _ in self.tiers() if tier != "memory"})
        if self.peer_replicas:
            users["peer"] = 3
        return users

    def slots_needed(self) -> int:
        """The fewest staging slots with which no tier waits for another's slot (`slot_users`)."""
        return max(1, sum(self.slot_users().values()))

    def describe_slots(self) -> str:
        """`slot_users` in words: "1 for the next snapshot + 1 for local + ..."."""
        labels = {
            "next": "the next snapshot",
            "peer": "the peer replica (exchange in flight, one queued, the partners' copy)",
        }
        return " + ".join(f"{n} for {labels.get(user, user)}" for user, n in self.slot_users().items())

    @property
    def staging_slots(self) -> int:
        """Staging slots per rank: `num_staging_slots`, or `slots_needed()` when unset."""
        return self.num_staging_slots or self.slots_needed()

    def tiers(self) -> list[tuple[str, int]]:
        """(tier name, cadence) of the tiers switched on, fastest first."""
        out: list[tuple[str, int]] = []
        if self.implementation == "tiered" and self.memory_every:
            out.append(("memory", self.memory_every))
        if self.local_dir is not None and self.local_every:
            out.append(("local", self.local_every))
        if self.durable_dir and self.durable_every:
            out.append(("durable", self.durable_every))
        return out
