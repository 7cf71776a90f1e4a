"""Checkpointing for the reference trainer: tiered (memory -> node-local disk -> durable), async, atomic.

Use it like this (the loop calls `save` after every step; it does nothing unless a tier is due)::

    from nvrx_eks.training.checkpoint import CheckpointConfig, build_checkpointer

    ckpt = build_checkpointer(cfg.checkpoint, rank=rank, world_size=world, node_index=node,
                              device=device, on_event=events.emit)   # on_event is optional
    restored = ckpt.load_latest()          # collective when a process group exists: call on every rank
    start = restored.step + 1 if restored else 0
    if restored:
        model.load_state_dict(restored.state["model"]); ...      # tensors come back on CPU
    for step in range(start, steps):
        train_step()                   # calls ckpt.fence() right before optimizer.step()
        ckpt.save(step, {"model": model.state_dict(), "optim": opt.state_dict(), "data": {...}})
    ckpt.wait(); ckpt.close()

`CheckpointConfig` (training/checkpoint/config.py) is the typed section the trainer embeds: the
implementation (`tiered` or `sync`), per-tier folders and every-N-steps cadences, retention, timeouts.
`save` publishes a tiny async all_reduce at due steps (all ranks agree to skip a tier that is busy
anywhere; agreement.py), so call it on every rank at every step, and `fence()` before the update.
`ckpt.stats` holds the counters (stall, skipped, failed...).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nvrx_eks.training.checkpoint.base import Checkpointer, Restored
    from nvrx_eks.training.checkpoint.config import CheckpointConfig
    from nvrx_eks.training.checkpoint.factory import build_checkpointer

__all__ = ["CheckpointConfig", "Checkpointer", "Restored", "build_checkpointer"]

# Lazy: the charts and the CLI import training.checkpoint.config (through training.config), which must
# not import torch.
_HOMES = {
    "Checkpointer": "nvrx_eks.training.checkpoint.base",
    "Restored": "nvrx_eks.training.checkpoint.base",
    "CheckpointConfig": "nvrx_eks.training.checkpoint.config",
    "build_checkpointer": "nvrx_eks.training.checkpoint.factory",
}


def __getattr__(name: str) -> Any:  # noqa: ANN401
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
