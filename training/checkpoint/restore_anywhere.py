"""The restore that takes each shard from wherever it is (`restore_from_anywhere`), partners' copies
included.

Every rank reports what it can serve -- any shard held in its
node's memory folder (its own slots, slots of ranks it ran as before, replicas received from partners)
and its own shard in the node-local and durable tiers. The ranks agree, from the gathered reports, on
the newest step for which every shard exists somewhere, then each rank takes its shard from the
fastest place that has it: its node's RAM (`memory`), a partner's RAM over the network
(`peer_memory`), node-local disk, durable storage. A replacement node thus pulls its shards from its
partners' RAM. A shard that fails to verify drops that step for everyone and the next one is agreed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from nvrx_eks.training.checkpoint.base import Restored
from nvrx_eks.training.checkpoint.config import TIER_ORDER
from nvrx_eks.training.checkpoint.replica import PEER_DIR
from nvrx_eks.training.checkpoint.restore import all_ok
from nvrx_eks.training.checkpoint.shard import ShardError, decode
from nvrx_eks.training.checkpoint.slot import committed

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from nvrx_eks.training.checkpoint.restore import StoreSource


def read_slot(folder: Path, step: int, shard: int) -> bytearray:
    """The committed slot of `shard` at `step` in `folder`, as one encoded shard (header + data)."""
    for files, manifest in committed(folder):
        if manifest.get("step") == step and manifest.get("rank") == shard:
            return files.read(manifest)
    raise ShardError(f"{folder}: no committed slot of rank {shard} at step {step}")


def node_memory(memory_dir: Path, *, world_size: int) -> dict[tuple[int, int], tuple[str, Path]]:
    """Every (shard, step) this node's memory folder holds: ("memory" | "peer_memory", its folder)."""
    held: dict[tuple[int, int], tuple[str, Path]] = {}
    for kind, pattern in (("memory", "rank-*"), ("peer_memory", f"{PEER_DIR}/rank-*")):
        for folder in sorted(memory_dir.glob(pattern)):
            for _, manifest in committed(folder):
                if manifest.get("world_size") != world_size:
                    continue  # another job layout: its shards do not fit this one
                held.setdefault((int(manifest["rank"]), int(manifest["step"])), (kind, folder))
    return held


@dataclass(frozen=True)
class _Plan:
    step: int
    where: dict[int, tuple[str, int]]
    """shard -> (tier, serving rank): the serving rank is the shard's own rank except for peer_memory."""


def _fastest_own(reports: list[dict[str, Any]]) -> dict[int, dict[int, str]]:
    """shard -> step -> the fastest tier the shard's own rank holds it in."""
    own: dict[int, dict[int, str]] = {}
    for rank, report in enumerate(reports):
        mine = own.setdefault(rank, {})
        for tier, steps in report["own"].items():
            for step in steps:
                if step not in mine or TIER_ORDER.index(tier) < TIER_ORDER.index(mine[step]):
                    mine[step] = tier
    return own


def _plan(reports: list[dict[str, Any]], *, world_size: int, excluded: set[int]) -> _Plan | None:
    """The newest step every shard can be had at, and where each shard comes from (fastest first)."""
    own = _fastest_own(reports)
    served: dict[tuple[int, int], int] = {}  # (shard, step) -> the lowest rank serving it from node RAM
    for rank, report in enumerate(reports):
        for shard, step in report["serves"]:
            served.setdefault((shard, step), rank)
    candidates = {step for steps in own.values() for step in steps} | {step for _, step in served}
    for step in sorted(candidates - excluded, reverse=True):
        where = {shard: _where(shard, step, own, served) for shard in range(world_size)}
        if all(place is not None for place in where.values()):
            return _Plan(step=step, where={shard: place for shard, place in where.items() if place})
    return None


def _where(
    shard: int, step: int, own: dict[int, dict[int, str]], served: dict[tuple[int, int], int]
) -> tuple[str, int] | None:
    tier = own.get(shard, {}).get(step)
    if tier == "memory":
        return "memory", shard
    if (shard, step) in served:
        server = served[(shard, step)]
        return ("memory" if server == shard else "peer_memory"), server
    return (tier, shard) if tier is not None else None


def restore_from_anywhere(
    *,
    memory_dir: Path,
    stores: list[StoreSource],
    rank: int,
    world_size: int,
    device: torch.device,
    emit: Callable[[str, dict[str, Any]], None],
) -> Restored | None:
    """Agree on the newest step every shard exists at somewhere; each rank takes its own shard from the
    fastest place holding it. Collective: every rank of the default process group calls it."""
    memory = node_memory(memory_dir, world_size=world_size)
    own: dict[str, list[int]] = {
        "memory": [s for (shard, s), (k, _) in memory.items() if shard == rank and k == "memory"]
    }
    for store in stores:
        own[store.tier] = sorted(store.candidate_steps(rank=rank, world_size=world_size, collective=True))
    report = {"own": own, "serves": sorted(memory)}
    emit(
        "checkpoint_sources",
        {
            "rank": rank,
            "own": {tier: max(steps, default=None) for tier, steps in own.items()},
            "node_memory": sorted({f"{shard}@{step}" for shard, step in memory}),
        },
    )
    reports: list[Any] = [None] * world_size
    dist.all_gather_object(reports, report)
    excluded: set[int] = set()
    while (plan := _plan(reports, world_size=world_size, excluded=excluded)) is not None:
        state, error = _take(plan, memory=memory, stores=stores, rank=rank)
        if error:
            emit(
                "checkpoint_rejected",
                {"tier": plan.where[rank][0], "step": plan.step, "rank": rank, "reason": error},
            )
        if all_ok(state is not None, device) and state is not None:
            tier, server = plan.where[rank]
            emit(
                "checkpoint_restored",
                {"tier": tier, "step": plan.step, "rank": rank, "from_rank": server},
            )
            return Restored(step=plan.step, state=state, tier=tier)
        emit("checkpoint_fallback", {"step": plan.step, "rank": rank, "reason": "not loadable on every rank"})
        excluded.add(plan.step)
    return None


def _take(
    plan: _Plan,
    *,
    memory: dict[tuple[int, int], tuple[str, Path]],
    stores: list[StoreSource],
    rank: int,
) -> tuple[dict[str, Any] | None, str]:
    """Serve the plan's transfers, then decode this rank's shard: (state or None, why not)."""
    blob = _transfer(plan, memory=memory, rank=rank)
    tier, _ = plan.where[rank]
    try:
        if tier == "peer_memory":
            if not blob:
                return None, "the partner could not read its copy"
            return decode(blob), ""
        if tier == "memory":
            return decode(read_slot(memory[(rank, plan.step)][1], plan.step, rank)), ""
        store = next(s for s in stores if s.tier == tier)
        return store.load(plan.step, rank), ""
    except (OSError, ShardError) as exc:
        return None, str(exc)


def _transfer(plan: _Plan, *, memory: dict[tuple[int, int], tuple[str, Path]], rank: int) -> bytearray:
    """The plan's peer transfers in one global order, each rank doing its part: deadlock-free, since the
    lowest unfinished transfer always has both of its ranks at it. Returns what this rank received."""
    received = bytearray()
    for shard in sorted(plan.where):
        tier, server = plan.where[shard]
        if tier != "peer_memory" or rank not in (shard, server):
            continue
        if rank == server:
            try:
                payload = read_slot(memory[(shard, plan.step)][1], plan.step, shard)
            except (OSError, ShardError):
                payload = bytearray()  # an empty reply: the receiver rejects it and the step is dropped
            dist.send(torch.tensor([len(payload)], dtype=torch.int64), shard)
            if payload:
                dist.send(torch.frombuffer(payload, dtype=torch.uint8), shard)
        else:
            size = torch.empty(1, dtype=torch.int64)
            dist.recv(size, server)
            received = bytearray(int(size.item()))
            if received:
                dist.recv(torch.frombuffer(received, dtype=torch.uint8), server)
    return received
