"""The trainer's checkpoint interface.

The loop calls only `save`, `fence`, `load_latest`, `wait` and `close`; implementations fill the
private hooks.

Snapshot protocol: `save(step, state)` may return before the snapshot of `state` is taken (a copy
runs in the background while the next step's forward/backward run). The loop must call `fence()`
right before it next mutates `state` -- the optimizer update, the only place parameters and optimizer
state change -- and fence returns once the snapshot no longer reads `state`. Time in `save` and in
`fence` together is the loop's checkpoint stall.

`state` is a nested mapping of tensors (DTensors included) and small picklable values: the tracked
objects' state dicts by fully-qualified name, the kit's own section and this rank's
(`dcp_format.RANK_SECTION`). Each rank stages its own shard; the disk tiers hold it as
torch.distributed.checkpoint files, which a job of another size reshards on load.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    import torch

    from nvrx_eks.training.checkpoint.config import CheckpointConfig


@dataclass(frozen=True)
class Placement:
    """Where a checkpointer runs: one value, because every implementation takes all of it alike."""

    rank: int
    world_size: int
    node_index: int
    """This rank's node, 0-based (the peer replica picks partners on other nodes)."""
    device: torch.device
    emit: Callable[[str, dict[str, Any]], None]
    """Where checkpoint events go (`stats.make_emitter`)."""


State = dict[str, Any] | Callable[[], dict[str, Any]]
"""A state, or a call that reads it when a snapshot is due (`resolve`)."""


def resolve(state: State) -> dict[str, Any]:
    return state() if callable(state) else state


@dataclass(frozen=True)
class Restored:
    step: int
    """The step the state was saved after; training resumes at step + 1."""
    state: dict[str, Any]
    tier: str
    """Which tier it came from (e.g. "memory", "local", "durable")."""
    resharded: bool = False
    """Loaded through the global metadata into another layout (world size or parallelism)."""
    from_world_size: int = 0
    """The world size it was written at (0: this job's)."""


class Checkpointer(ABC):
    """Public calls are fixed; implementations override the `_`-prefixed hooks."""

    @classmethod
    @abstractmethod
    def from_config(cls, config: CheckpointConfig, placement: Placement) -> Self:
        """This rank's checkpointer for `config` (factory.py `build_checkpointer` calls it)."""

    def save(self, step: int, state: State) -> None:
        """Called by the loop after `step`, every step (it decides what is due). `state` must not be
        mutated until `fence()` has returned. It may be a call that returns the state: made only when
        a snapshot is due, so a step with nothing due pays nothing for reading the state."""
        self._save(step, state)

    def fence(self) -> None:
        """Called by the loop right before the optimizer update: waits for what is left of the
        snapshot copy, if any. A no-op for implementations that copy inside `save`."""
        self._fence()

    def load_latest(
        self,
        target: Callable[[], dict[str, Any]] | None = None,
        validate: Callable[[dict[str, Any]], None] | None = None,
    ) -> Restored | None:
        """Newest step that every rank can load (collective when a process group exists), loaded into
        the live state `target()` builds (called only when a checkpoint exists; tensors loaded in
        place, objects set in it; `Restored.state` is that state). Without `target`, the state as
        saved, with CPU tensors, at this world size. `validate` sees the chosen step's kit section
        (`dcp_format.KIT_SECTION`) before a tensor is loaded and raises to refuse it; a step whose
        tensors do not fit the live state raises `dcp_format.LayoutMismatchError`."""
        return self._load_latest(target, validate)

    def wait(self) -> None:
        """Block until background work finishes (end of training, tests)."""
        self._wait()

    def close(self) -> None:
        self._close()

    @abstractmethod
    def _save(self, step: int, state: State) -> None: ...

    @abstractmethod
    def _load_latest(
        self, target: Callable[[], dict[str, Any]] | None, validate: Callable[[dict[str, Any]], None] | None
    ) -> Restored | None: ...

    def _fence(self) -> None:
        return None

    def _wait(self) -> None:
        return None

    def _close(self) -> None:
        self._wait()
