"""Choosing what to resume from, and loading it: the newest step every rank can load, from the nearest
place that has it, resharded when the job's layout changed.

Every rank reports what it can serve -- any snapshot held in its node's memory folder (its own slots,
slots of ranks it ran as before, replicas received from partners) and its own part of each disk tier,
each with the layout it was written at -- and rank 0 adds the steps a shared disk tier holds whole,
at whatever world size they were written. Only when something exists anywhere does each rank build
its live state (`target`: building it initializes an optimizer's state, which a fresh start must not
see) and say its layout (dcp_format.py `Staged.key`). Then, newest step first:

- Same layout: every rank's shard exists somewhere at this rank's layout. Each rank takes its own from
  the fastest place that has it: its node's RAM (`memory`), a partner's RAM over the network
  (`peer_memory`), node-local disk, durable storage. From RAM each tensor is copied straight from the
  mapped snapshot into the live one; from disk, DCP reads the rank's own files.
- Reshard: the world size or the parallel layout changed (or no same-layout copy is as new), and a
  shared tier holds the step whole. Every old rank's files are verified (spread over the new ranks),
  rank 0 writes the global metadata if the writers had not yet, and DCP loads the live state from it:
  each DTensor takes its own new shard. A rank's own section (RNG streams) comes from old rank
  `rank % old world size`.

A part that fails to verify drops that step for everyone and the next one is tried; every choice is an
event (`checkpoint_restored` with its tier and why, `checkpoint_rejected`, `checkpoint_fallback`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from nvrx_eks.training.checkpoint.base import Placement, Restored
from nvrx_eks.training.checkpoint.config import TIER_ORDER
from nvrx_eks.training.checkpoint.dcp_format import (
    KIT_SECTION,
    LayoutMismatchError,
    load_copy,
    load_into,
    load_planner,
    rank_keyed,
    unkeyed,
)
from nvrx_eks.training.checkpoint.replica import PEER_DIR
from nvrx_eks.training.checkpoint.shard import ShardError, decode
from nvrx_eks.training.checkpoint.slot import SlotFiles, committed
from nvrx_eks.training.checkpoint.storage import complete_steps

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from torch.distributed.checkpoint import StorageReader

    from nvrx_eks.training.checkpoint.dcp_format import Stager
    from nvrx_eks.training.checkpoint.storage import ShardStore


def _collective() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _gather(value: object, world_size: int) -> list[Any]:
    if not _collective():
        return [value]
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, value)
    return gathered


def all_ok(ok: bool, device: torch.device) -> bool:
    """True on every rank iff `ok` on every rank (a collective when a process group exists)."""
    if not _collective():
        return ok
    flag = torch.tensor([0 if ok else 1], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item()) == 0


# ----- what this node's memory holds ----------------------------------------------------------------


@dataclass(frozen=True)
class Held:
    """A snapshot in this node's memory folder."""

    kind: str
    """"memory" (a slot of a rank that ran on this node) or "peer_memory" (a partner's copy)."""
    files: SlotFiles
    manifest: dict[str, Any]

    @property
    def layout(self) -> tuple[int, str]:
        return int(self.manifest.get("world_size", 0)), str(self.manifest.get("layout", ""))


def node_memory(memory_dir: Path) -> dict[tuple[int, int], Held]:
    """Every (shard, step) this node's memory folder holds, own slots before partners' copies."""
    held: dict[tuple[int, int], Held] = {}
    for kind, pattern in (("memory", "rank-*"), ("peer_memory", f"{PEER_DIR}/rank-*")):
        for folder in sorted(memory_dir.glob(pattern)):
            for files, manifest in committed(folder):
                key = (int(manifest["rank"]), int(manifest["step"]))
                held.setdefault(key, Held(kind, files, manifest))
    return held


def read_slot(held: Held) -> bytearray:
    """A held snapshot as one encoded shard (header + data), for a transfer to its rank."""
    return held.files.read(held.manifest)


# ----- the plan --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    step: int
    where: dict[int, tuple[str, int]]
    """Same layout: shard -> (tier, serving rank); the serving rank is the shard's own but for
    peer_memory."""
    reshard_tier: str = ""
    """Reshard: the shared tier holding the step whole."""
    old_world_size: int = 0


def _fits(written: tuple[int, str] | None, key: tuple[int, str]) -> bool:
    """A copy written at `written` (world size, layout key) loads into a rank whose live state has
    `key`; with no live state (key "") any copy of the same world size does."""
    return written is not None and written[0] == key[0] and (not key[1] or written[1] == key[1])


def _same_layout(
    reports: list[dict[str, Any]], keys: list[tuple[int, str]], step: int
) -> dict[int, tuple[str, int]] | None:
    where: dict[int, tuple[str, int]] = {}
    for shard, key in enumerate(keys):
        own = reports[shard]
        tier = next(
            (t for t in TIER_ORDER if t != "peer_memory" and _fits(own["own"].get(t, {}).get(step), key)),
            None,
        )
        if tier == "memory":
            where[shard] = ("memory", shard)
            continue
        server = next(
            (r for r, report in enumerate(reports) if _fits(report["serves"].get((shard, step)), key)), None
        )
        if server is not None:
            where[shard] = ("memory" if server == shard else "peer_memory", server)
        elif tier is not None:
            where[shard] = (tier, shard)
        else:
            return None
    return where


def _plans(reports: list[dict[str, Any]], keys: list[tuple[int, str]], excluded: set[int]) -> list[_Plan]:
    """Every loadable step, newest first: each as a same-layout plan where one exists, else resharded
    from a shared tier that holds it whole."""
    steps: set[int] = set()
    for report in reports:
        steps |= {step for _, step in report["serves"]}
        for by_step in report["own"].values():
            steps |= set(by_step)
    whole: dict[int, tuple[str, int]] = {}
    for tier in reversed(TIER_ORDER):  # the fastest tier wins a step two tiers hold whole
        for step, size in reports[0].get("whole", {}).get(tier, {}).items():
            whole[step] = (tier, size)
    steps |= set(whole)
    plans = []
    for step in sorted(steps - excluded, reverse=True):
        where = _same_layout(reports, keys, step)
        if where is not None:
            plans.append(_Plan(step=step, where=where))
        elif step in whole:
            tier, size = whole[step]
            plans.append(_Plan(step=step, where={}, reshard_tier=tier, old_world_size=size))
    return plans


# ----- the restore -----------------------------------------------------------------------------------


def restore(
    *,
    memory_dir: Path | None,
    stores: Sequence[ShardStore],
    stager: Stager,
    placement: Placement,
    target: Callable[[], dict[str, Any]] | None,
    validate: Callable[[dict[str, Any]], None] | None = None,
) -> Restored | None:
    """The newest state every rank can load, loaded (collective: every rank of the default process
    group calls it). `target` builds the live state to load into (tensors are loaded in place, objects
    set in it); None: the state comes back as saved, with CPU tensors (tests, tools). `validate` is
    shown the chosen step's kit section (`KIT_SECTION`) before any tensor is loaded: it raises what
    makes the step unusable for this run (a changed model), which ends the restore."""
    rank, world_size, device, emit = placement.rank, placement.world_size, placement.device, placement.emit
    memory = node_memory(memory_dir) if memory_dir is not None and memory_dir.is_dir() else {}
    own: dict[str, dict[int, tuple[int, str]]] = {
        "memory": {
            step: held.layout
            for (shard, step), held in memory.items()
            if shard == rank and held.kind == "memory"
        }
    }
    for store in stores:
        own[store.tier] = {
            step: (parts[rank].world_size, parts[rank].layout)
            for step, parts in store.manifests(rank).items()
        }
    report: dict[str, Any] = {"own": own, "serves": {key: held.layout for key, held in memory.items()}}
    if rank == 0:
        report["whole"] = {store.tier: complete_steps(store.manifests()) for store in stores if store.shared}
    emit(
        "checkpoint_sources",
        {
            "rank": rank,
            "own": {tier: max(steps, default=None) for tier, steps in own.items()},
            "node_memory": sorted(f"{shard}@{step}" for shard, step in memory),
        },
    )
    reports = _gather(report, world_size)
    if not any(r["serves"] or any(r["own"].values()) or any(r.get("whole", {}).values()) for r in reports):
        return None
    live = target() if target is not None else None
    key = (world_size, stager.stage(live).key if live is not None else "")
    keys: list[tuple[int, str]] = [tuple(k) for k in _gather(key, world_size)]
    excluded: set[int] = set()
    while plans := _plans(reports, keys, excluded):
        plan = plans[0]
        if plan.reshard_tier:
            restored = _reshard(
                plan,
                stores=stores,
                rank=rank,
                world_size=world_size,
                device=device,
                emit=emit,
                live=live,
                validate=validate,
            )
        else:
            restored = _same(
                plan,
                memory=memory,
                stores=stores,
                rank=rank,
                device=device,
                emit=emit,
                live=live,
                validate=validate,
            )
        if restored is not None:
            return restored
        emit("checkpoint_fallback", {"step": plan.step, "rank": rank, "reason": "not loadable on every rank"})
        excluded.add(plan.step)
    if live is not None:
        emit("checkpoint_fallback", {"step": -1, "rank": rank, "reason": "no step fits this job's layout"})
    return None


def _same(
    plan: _Plan,
    *,
    memory: dict[tuple[int, int], Held],
    stores: Sequence[ShardStore],
    rank: int,
    device: torch.device,
    emit: Callable[[str, dict[str, Any]], None],
    live: dict[str, Any] | None,
    validate: Callable[[dict[str, Any]], None] | None,
) -> Restored | None:
    blob = _transfer(plan, memory=memory, rank=rank)
    check = validate if validate is not None and live is not None else None
    tier, server = plan.where[rank]
    state: dict[str, Any] | None = None
    try:
        if tier == "peer_memory":
            # An empty reply: the partner could not read its copy (decode rejects it).
            views = decode(blob)
            if check is not None:
                check(views.get(KIT_SECTION) or {})
            state = _from_views(views, rank=rank, live=live)
        elif tier == "memory":
            held = memory[(rank, plan.step)]
            if live is None:
                state = _from_views(decode(read_slot(held)), rank=rank, live=None)
            else:
                with held.files.reader(held.manifest) as (saved, fill):
                    if check is not None:
                        check(saved.get(KIT_SECTION) or {})
                    state = load_into(live, saved, rank=rank, fill=fill)
        else:
            store = next(s for s in stores if s.tier == tier)
            store.verify(plan.step, rank)
            if check is not None and live is not None:
                check(_kit_section(store.reader(plan.step, rank=rank), live))
            state = _from_disk(store.reader(plan.step, rank=rank), rank=rank, live=live)
    except (OSError, ShardError, KeyError, ValueError, RuntimeError) as exc:
        emit("checkpoint_rejected", {"tier": tier, "step": plan.step, "rank": rank, "reason": str(exc)[:500]})
        state = None
    if not (all_ok(state is not None, device) and state is not None):
        return None
    emit("checkpoint_restored", {"tier": tier, "step": plan.step, "rank": rank, "from_rank": server})
    return Restored(step=plan.step, state=state, tier=tier)


def _from_views(views: dict[str, Any], *, rank: int, live: dict[str, Any] | None) -> dict[str, Any]:
    """A snapshot's tree (tensors as views of its memory) into the live state (same layout), or cloned
    out of the snapshot as saved."""
    if live is None:
        return unkeyed(_cloned(views), rank)
    return load_copy(live, views, rank=rank)


def _cloned(node: object) -> Any:  # noqa: ANN401 - a state tree
    if isinstance(node, torch.Tensor):
        return node.clone()
    if isinstance(node, dict):
        return {key: _cloned(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_cloned(value) for value in node]
    return node


def _from_disk(
    reader: StorageReader,
    *,
    rank: int,
    live: dict[str, Any] | None,
    source: int | None = None,
    collective: bool = False,
) -> dict[str, Any]:
    """DCP reads the state: into the live one (in place), or whole, as saved (no live state)."""
    if live is None:
        loaded: dict[str, Any] = {}
        _load_state_dict(
            loaded, storage_reader=reader, planner=_EmptyStateDictLoadPlanner(), no_dist=not collective
        )
        return unkeyed(loaded, rank if source is None else source)
    keyed = rank_keyed(live, rank if source is None else source)
    if collective:
        dcp.load(keyed, storage_reader=reader, planner=load_planner())
    else:  # DCP's own loader without the process group (public `load` warns that it has none)
        _load_state_dict(keyed, storage_reader=reader, planner=load_planner(), no_dist=True)
    return unkeyed(keyed, rank if source is None else source)


def _kit_section(reader: StorageReader, live: dict[str, Any]) -> dict[str, Any]:
    """The kit's section of a disk step alone, read by DCP (no tensor is loaded; no collective)."""
    template = live.get(KIT_SECTION)
    if not isinstance(template, dict) or not template:
        return {}
    section = {KIT_SECTION: dict.fromkeys(template, _UNREAD)}
    _load_state_dict(section, storage_reader=reader, planner=load_planner(partial=True), no_dist=True)
    return {key: value for key, value in section[KIT_SECTION].items() if value is not _UNREAD}


_UNREAD = "\0unread"
"""A kit-section entry the step does not hold (a string: DCP keeps a target's strings as they are)."""


def _first_problem(exc: BaseException) -> str:
    """The first line worth reading of DCP's error (its CheckpointException wraps each rank's)."""
    for line in str(exc).splitlines():
        if "mismatch" in line or "Missing key" in line or "missing" in line.lower():
            return line.strip().strip("'\"")[:400]
    return str(exc).splitlines()[0][:400] if str(exc) else type(exc).__name__


def load_part(store: ShardStore, step: int, rank: int) -> dict[str, Any]:
    """One rank's part of a disk step, verified, as saved (CPU tensors); no process group needed."""
    store.verify(step, rank)
    return _from_disk(store.reader(step, rank=rank), rank=rank, live=None)


def _whole(
    store: ShardStore,
    plan: _Plan,
    *,
    rank: int,
    world_size: int,
    device: torch.device,
    emit: Callable[[str, dict[str, Any]], None],
) -> bool:
    """Every old rank's files verified (spread over this job's ranks) and the global metadata written
    (rank 0, where the writers had not): on every rank, whether the step can be resharded."""
    old = plan.old_world_size
    problem = ""
    try:
        for part in range(rank, old, world_size):
            store.verify(plan.step, part)
    except ShardError as exc:
        problem = str(exc)
        emit(
            "checkpoint_rejected",
            {"tier": store.tier, "step": plan.step, "rank": rank, "reason": problem[:500]},
        )
    if not all_ok(not problem, device):
        return False
    if rank == 0:
        try:
            if not store.finalize(plan.step, old):
                problem = "a rank's part is missing"
        except (OSError, ShardError, ValueError) as exc:
            problem = f"its global metadata could not be written: {exc}"
    if not all_ok(not problem, device):
        emit(
            "checkpoint_rejected",
            {
                "tier": store.tier,
                "step": plan.step,
                "rank": rank,
                "reason": problem or "rank 0 could not finalize it",
            },
        )
        return False
    return True


def _reshard(
    plan: _Plan,
    *,
    stores: Sequence[ShardStore],
    rank: int,
    world_size: int,
    device: torch.device,
    emit: Callable[[str, dict[str, Any]], None],
    live: dict[str, Any] | None,
    validate: Callable[[dict[str, Any]], None] | None,
) -> Restored | None:
    store = next(s for s in stores if s.tier == plan.reshard_tier)
    old = plan.old_world_size
    if not _whole(store, plan, rank=rank, world_size=world_size, device=device, emit=emit):
        return None
    if validate is not None and live is not None:
        validate(_kit_section(store.reader(plan.step), live))
    state: dict[str, Any] | None = None
    try:
        state = _from_disk(
            store.reader(plan.step), rank=rank, live=live, source=rank % old, collective=_collective()
        )
    except (KeyError, ValueError, CheckpointException) as exc:
        # DCP's planning found a key or a size this run's state does not have: the same on every rank
        # (DCP raises one rank's planning error on all), and no older step would fit better.
        raise LayoutMismatchError(_first_problem(exc)) from None
    except (OSError, RuntimeError) as exc:
        emit(
            "checkpoint_rejected",
            {"tier": store.tier, "step": plan.step, "rank": rank, "reason": str(exc)[:500]},
        )
    if not (all_ok(state is not None, device) and state is not None):
        return None
    why = (
        f"written by {old} ranks, this job has {world_size}"
        if old != world_size
        else "written at another parallel layout (or no copy at this layout is as new)"
    )
    emit(
        "checkpoint_restored",
        {
            "tier": store.tier,
            "step": plan.step,
            "rank": rank,
            "resharded": True,
            "from_world_size": old,
            "reason": why,
        },
    )
    return Restored(step=plan.step, state=state, tier=store.tier, resharded=True, from_world_size=old)


def _transfer(plan: _Plan, *, memory: dict[tuple[int, int], Held], rank: int) -> bytearray:
    """The plan's peer transfers in one global order, each rank doing its part: deadlock-free, since the
    lowest unfinished transfer always has both of its ranks at it. Returns what this rank received."""
    received = bytearray()
    for shard in sorted(plan.where):
        tier, server = plan.where[shard]
        if tier != "peer_memory" or rank not in (shard, server):
            continue
        if rank == server:
            try:
                payload = read_slot(memory[(shard, plan.step)])
            except (OSError, ShardError, KeyError):
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
