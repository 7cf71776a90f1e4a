"""`build_checkpointer`: the one place a CheckpointConfig becomes a Checkpointer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nvrx_eks.training.checkpoint.stats import make_emitter
from nvrx_eks.training.checkpoint.storage import disk_stores

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from nvrx_eks.training.checkpoint.base import Checkpointer
    from nvrx_eks.training.checkpoint.config import CheckpointConfig


def build_checkpointer(
    config: CheckpointConfig,
    *,
    rank: int,
    world_size: int,
    node_index: int = 0,
    device: torch.device,
    on_event: Callable[[str, dict[str, Any]], None] | None = None,
) -> Checkpointer:
    """The checkpointer `config.implementation` names, for this rank.

    `on_event(kind, fields)` receives checkpoint events (committed, skipped, failed, timeout,
    rejected, fallback, restored) for the trainer's event stream; they are logged either way.
    """
    emit = make_emitter(on_event)
    if config.implementation == "sync":
        from nvrx_eks.training.checkpoint.sync import SyncCheckpointer  # noqa: PLC0415

        return SyncCheckpointer(
            stores=disk_stores(config),
            keep=config.keep,
            rank=rank,
            world_size=world_size,
            device=device,
            emit=emit,
        )
    from nvrx_eks.training.checkpoint.tiered import TieredCheckpointer  # noqa: PLC0415

    return TieredCheckpointer(
        config=config,
        rank=rank,
        world_size=world_size,
        node_index=node_index,
        device=device,
        emit=emit,
    )
