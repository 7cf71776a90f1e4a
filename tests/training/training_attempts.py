"""Attempts of the public API run in a test's own process, with no layers and a stand-in for the
checkpointer: what `Job.run` does around the training function, minus the launcher."""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from nvrx_eks.training import api, process
from nvrx_eks.training.attempt import Context, Record
from nvrx_eks.training.events import EventLog
from nvrx_eks.training.resilience.layers import Resilience

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from nvrx_eks.training.parallel import World
    from nvrx_eks.training.resilience.config import ResilienceConfig


def stub_context(cfg: ResilienceConfig, world: World, run_dir: Path) -> Context:
    """The process's parts, with no layers and no checkpoints: a restart is the next `attempt` call."""
    return Context(
        cfg=cfg,
        world=world,
        store=dist.FileStore(str(run_dir / "store"), world.world_size),
        events=EventLog(run_dir=run_dir, rank=world.rank),
        resilience=Resilience([]),
        checkpointer=SimpleNamespace(
            fence=lambda: None,
            save=lambda step, state: None,
            wait=lambda: None,
            load_latest=lambda target=None, validate=None: None,
        ),  # type: ignore[arg-type]
        metrics=SimpleNamespace(step=lambda **_: None),  # type: ignore[arg-type]
        meta={},
    )


def attempt(ctx: Context, record: Record, train: Callable[[api.Attempt], Any]) -> str | None:
    """One attempt of `train`, as `Job.run` makes it (a new process group, the failure judged)."""
    return process._attempt(ctx, record, lambda run: train(api.Attempt(run)))


__all__ = ["Record", "attempt", "stub_context"]
