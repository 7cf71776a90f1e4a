"""`build_checkpointer`: the one place a CheckpointConfig becomes a Checkpointer; `probe_checkpointer`:
whether it can on this node, proven before any rank starts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nvrx_eks.training.checkpoint.base import Placement
from nvrx_eks.training.checkpoint.probe import TierProbe, failed, free_space, probe_folder, unimportable
from nvrx_eks.training.checkpoint.stats import make_emitter
from nvrx_eks.training.checkpoint.storage import disk_stores

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from nvrx_eks.training.checkpoint.base import Checkpointer
    from nvrx_eks.training.checkpoint.config import CheckpointConfig


def checkpointer_class(config: CheckpointConfig) -> type[Checkpointer]:
    """The implementation `config.implementation` names, imported now (with torch.distributed and the
    tiers' modules): ImportError if this environment lacks any of it."""
    if config.implementation == "sync":
        from nvrx_eks.training.checkpoint.sync import SyncCheckpointer  # noqa: PLC0415

        return SyncCheckpointer
    from nvrx_eks.training.checkpoint.tiered import TieredCheckpointer  # noqa: PLC0415

    return TieredCheckpointer


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
    placement = Placement(
        rank=rank, world_size=world_size, node_index=node_index, device=device, emit=make_emitter(on_event)
    )
    return checkpointer_class(config).from_config(config, placement)


def probe_checkpointer(config: CheckpointConfig) -> list[TierProbe]:
    """Can `build_checkpointer(config)` start on this node, and each tier take its first write?

    The implementation imported as a rank imports it; the memory folder (the tiered implementation's
    staging slots and the partners' copies) created; each disk tier opened as the checkpointer opens it
    (`disk_stores`: an S3 client for an s3:// URL) and proven with a probe that is removed (probe.py).
    No rank's folder, slot or shard is made. One `TierProbe` per tier, a failure's with its fix."""
    try:
        checkpointer_class(config)
    except ImportError as exc:
        return [unimportable(config.implementation, exc)]
    probes = []
    if config.implementation == "tiered":
        memory = str(config.memory_dir)
        try:
            # Nothing is fsynced in the memory tier (slot.py): neither is its probe.
            found = free_space(probe_folder(config.memory_dir, fsync=False))
        except OSError as exc:
            probes.append(failed("memory", memory, exc))
        else:
            detail = f"{found} for {config.staging_slots} staging slots per rank"
            probes.append(TierProbe(tier="memory", location=memory, detail=detail, ok=True))
    try:
        stores = disk_stores(config)
    except Exception as exc:  # noqa: BLE001 - opening a store creates nothing but an S3 client
        return [*probes, failed("durable", str(config.durable_dir), exc)]
    for store, _, shared in stores:
        try:
            found = store.probe()
        except Exception as exc:  # noqa: BLE001 - an OSError or any of botocore's errors: the cause
            probes.append(failed(store.tier, store.location, exc, node_local=not shared))
        else:
            probes.append(
                TierProbe(
                    tier=store.tier, location=store.location, detail=found, ok=True, node_local=not shared
                )
            )
    return probes
