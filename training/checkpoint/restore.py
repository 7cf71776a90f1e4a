"""Choosing what to resume from: the newest step every rank can load, from the fastest tier holding it.

Each rank lists the steps it holds (any tier); the ranks agree on the newest step in every list (a
collective over the default process group when one is initialized), each loads its shard from its
fastest tier that verifies, and a second collective confirms every rank succeeded. If one rank's
shard was torn or corrupt in every tier, that step is dropped everywhere and the next one is agreed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist

from nvrx_eks.training.checkpoint.base import Restored
from nvrx_eks.training.checkpoint.shard import ShardError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from nvrx_eks.training.checkpoint.storage import ShardStore

logger = logging.getLogger(__name__)


class Source(Protocol):
    """A tier as the loader sees it."""

    tier: str

    def candidate_steps(self, *, rank: int, world_size: int, collective: bool) -> set[int]: ...

    def load(self, step: int, rank: int) -> dict[str, Any]: ...


@dataclass
class RestoreReport:
    """What the loader skipped and why (also sent as events)."""

    rejected: list[dict[str, Any]] = field(default_factory=list)


def _collective() -> bool:
    return dist.is_available() and dist.is_initialized()


def agree_newest(steps: set[int]) -> int | None:
    """Newest step present on every rank (this rank's set when there is no process group)."""
    if not _collective():
        return max(steps, default=None)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, sorted(steps))
    common = set(gathered[0])
    for other in gathered[1:]:
        common &= set(other)
    return max(common, default=None)


def all_ok(ok: bool, device: torch.device) -> bool:
    if not _collective():
        return ok
    flag = torch.tensor([0 if ok else 1], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item()) == 0


def load_newest(
    sources: Sequence[Source],
    *,
    rank: int,
    world_size: int,
    device: torch.device,
    emit: Callable[[str, dict[str, Any]], None],
) -> Restored | None:
    collective = _collective()
    held: dict[str, set[int]] = {
        source.tier: source.candidate_steps(rank=rank, world_size=world_size, collective=collective)
        for source in sources
    }
    excluded: set[int] = set()
    while True:
        mine = set().union(*held.values()) - excluded if held else set()
        step = agree_newest(mine)
        if step is None:
            return None
        state: dict[str, Any] | None = None
        tier = ""
        for source in sources:
            if step not in held[source.tier]:
                continue
            try:
                state = source.load(step, rank)
            except ShardError as exc:
                emit(
                    "checkpoint_rejected",
                    {"tier": source.tier, "step": step, "rank": rank, "reason": str(exc)},
                )
                logger.warning("rank %d: %s checkpoint of step %d rejected: %s", rank, source.tier, step, exc)
                continue
            tier = source.tier
            break
        if all_ok(state is not None, device) and state is not None:
            emit("checkpoint_restored", {"tier": tier, "step": step, "rank": rank})
            return Restored(step=step, state=state, tier=tier)
        emit("checkpoint_fallback", {"step": step, "rank": rank, "reason": "not loadable on every rank"})
        logger.warning("step %d is not loadable on every rank; falling back to an older one", step)
        excluded.add(step)


class StoreSource:
    """A ShardStore as a restore source."""

    def __init__(self, store: ShardStore, *, shared: bool) -> None:
        self.store = store
        self.tier = store.tier
        self.shared = shared

    def candidate_steps(self, *, rank: int, world_size: int, collective: bool) -> set[int]:
        if collective or not self.shared:
            return set(self.store.manifests(rank))
        # No process group to ask: on shared storage a step counts once every rank committed it.
        return {step for step, ranks in self.store.manifests().items() if len(ranks) >= world_size}

    def load(self, step: int, rank: int) -> dict[str, Any]:
        return self.store.read(step, rank)
