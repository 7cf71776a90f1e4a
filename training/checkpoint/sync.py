"""The simple reference: every due tier written inside `save`, with the same commit protocol.

Correct and easy to reason about, and the baseline the benchmark compares the tiered one with. A
failing tier (unwritable, full) is reported and counted; training goes on and the next due step
tries again.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Self

from nvrx_eks.training.checkpoint.base import Checkpointer, Placement, Restored, State, resolve
from nvrx_eks.training.checkpoint.dcp_format import Stager
from nvrx_eks.training.checkpoint.restore import restore
from nvrx_eks.training.checkpoint.stats import CheckpointStats
from nvrx_eks.training.checkpoint.storage import disk_stores, finalize_newest

if TYPE_CHECKING:
    from collections.abc import Callable

    from nvrx_eks.training.checkpoint.config import CheckpointConfig
    from nvrx_eks.training.checkpoint.storage import ShardStore


class SyncCheckpointer(Checkpointer):
    @classmethod
    def from_config(cls, config: CheckpointConfig, placement: Placement) -> Self:
        return cls(stores=disk_stores(config), keep=config.keep, placement=placement)

    def __init__(
        self, *, stores: list[tuple[ShardStore, int, bool]], keep: int, placement: Placement
    ) -> None:
        """`stores`: (store, every N steps, shared between nodes) fastest first. Every rank writes its
        own shard alike: the node index goes unused."""
        self.stores = stores
        self.keep = keep
        self.placement = placement
        self.rank = placement.rank
        self.world_size = placement.world_size
        self.emit = placement.emit
        self.stats = CheckpointStats()
        self.stager = Stager(rank=self.rank, world_size=self.world_size)

    def _save(self, step: int, state: State) -> None:
        started = time.perf_counter()
        self.stats.save_calls += 1
        due = [store for store, every, _ in self.stores if every and step % every == 0]
        if due:
            staged = self.stager.stage(resolve(state))
            for store in due:
                try:
                    store.commit(step=step, rank=self.rank, world_size=self.world_size, staged=staged)
                    store.prune(rank=self.rank, keep=self.keep)
                except (OSError, RuntimeError, ValueError) as exc:
                    self.stats.failed[store.tier] += 1
                    self.stats.last_error[store.tier] = str(exc)
                    self.emit("checkpoint_failed", {"tier": store.tier, "step": step, "error": str(exc)})
                    continue
                self.stats.persisted[store.tier] += 1
                self.emit("checkpoint_committed", {"tier": store.tier, "step": step, "rank": self.rank})
        stall = time.perf_counter() - started
        self.stats.stall_s += stall
        self.stats.max_stall_s = max(self.stats.max_stall_s, stall)

    def _load_latest(
        self, target: Callable[[], dict[str, Any]] | None, validate: Callable[[dict[str, Any]], None] | None
    ) -> Restored | None:
        return restore(
            memory_dir=None,
            stores=[store for store, _, _ in self.stores],
            stager=self.stager,
            placement=self.placement,
            target=target,
            validate=validate,
        )

    def _close(self) -> None:
        # The end of training: every rank committed its last due step, so the job's newest complete
        # step gets its global metadata (rank 0, shared tiers) and reads at any world size.
        if self.rank == 0:
            for store, _, _ in self.stores:
                if store.shared:
                    finalize_newest(store, emit=self.emit)
