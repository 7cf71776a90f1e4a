"""The trainer's checkpoint interface.

The loop calls only `save`, `load_latest`, `wait` and `close`; implementations fill the private
hooks. `state` is a nested mapping of tensors and small picklable values (model and optimizer state
dicts, RNG states, the data position); each rank saves and loads its own shard.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Restored:
    step: int
    """The step the state was saved after; training resumes at step + 1."""
    state: dict[str, Any]
    tier: str
    """Which tier it came from (e.g. "memory", "local", "durable")."""


class Checkpointer(ABC):
    """Public calls are fixed; implementations override the `_`-prefixed hooks."""

    def save(self, step: int, state: dict[str, Any]) -> None:
        """Called by the loop after `step`; returns as soon as the loop may mutate `state` again."""
        self._save(step, state)

    def load_latest(self) -> Restored | None:
        """Newest step that every rank can load (collective when a process group exists)."""
        return self._load_latest()

    def wait(self) -> None:
        """Block until background work finishes (end of training, tests)."""
        self._wait()

    def close(self) -> None:
        self._close()

    @abstractmethod
    def _save(self, step: int, state: dict[str, Any]) -> None: ...

    @abstractmethod
    def _load_latest(self) -> Restored | None: ...

    def _wait(self) -> None:
        return None

    def _close(self) -> None:
        self._wait()
