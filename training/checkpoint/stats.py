"""Counters every checkpointer keeps, and the event hook the trainer plugs its event stream into."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nvrx_eks.training.events import event_line

if TYPE_CHECKING:
    from collections.abc import Callable

logger = logging.getLogger("nvrx_eks.training.checkpoint")


@dataclass
class CheckpointStats:
    """Loop-side cost and what happened in the background, per tier."""

    save_calls: int = 0
    stall_s: float = 0.0
    """Total time the loop spent inside `save` and `fence` (the checkpoint-efficiency numerator)."""
    max_stall_s: float = 0.0
    """The longest single `save` or `fence` call."""
    fence_s: float = 0.0
    """The part of `stall_s` spent in `fence` (waiting for the rest of a background copy)."""
    staged: int = 0
    """Memory snapshots taken (tier 1)."""
    persisted: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    """Due persists skipped because the tier (on some rank) was still busy: never waited for."""
    failed: Counter[str] = field(default_factory=Counter)
    behind: Counter[str] = field(default_factory=Counter)
    """Times a disk tier fell more than one cadence plus one write behind (`checkpoint_behind`)."""
    timed_out: Counter[str] = field(default_factory=Counter)
    last_error: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "save_calls": self.save_calls,
            "stall_s": round(self.stall_s, 6),
            "max_stall_s": round(self.max_stall_s, 6),
            "fence_s": round(self.fence_s, 6),
            "staged": self.staged,
            "persisted": dict(self.persisted),
            "skipped": dict(self.skipped),
            "failed": dict(self.failed),
            "behind": dict(self.behind),
            "timed_out": dict(self.timed_out),
            "last_error": dict(self.last_error),
        }


def log_event(kind: str, fields: dict[str, Any]) -> None:
    """Default hook: problems at WARNING, the rest at DEBUG."""
    level = (
        logging.WARNING
        if kind.endswith(("failed", "timeout", "rejected", "fallback", "behind"))
        else logging.DEBUG
    )
    logger.log(level, "%s", event_line(kind, fields))


def make_emitter(hook: Callable[[str, dict[str, Any]], None] | None) -> Callable[[str, dict[str, Any]], None]:
    def emit(kind: str, fields: dict[str, Any]) -> None:
        log_event(kind, fields)
        if hook is not None:
            try:
                hook(kind, fields)
            except Exception:  # a broken sink must never break training
                logger.exception("checkpoint event hook failed")

    return emit
