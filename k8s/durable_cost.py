"""The durable tier's write cost against the job's durable cadence (the `job render` warning).

A durable checkpoint due while the previous one is still being written is skipped (coalesced) by the
trainer's checkpointer, so a cadence shorter than the write time silently lengthens the real interval
(and the work a durable restore loses). The job values do not know the write time on their own;
`nvrx-eks plan --write` records what the plan knew (`plan: {step_s, durable_write_s, source}`), and
this module compares the two. It sits in k8s so the chart never imports the planner, which uses the
same functions.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from nvrx_eks.training.checkpoint.config import CheckpointConfig


class PlanHints(BaseModel):
    """What `nvrx-eks plan --write` knew when it chose the cadences (read by `job render`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step_s: float = Field(gt=0)
    """Mean optimizer step time the plan assumed or measured."""
    durable_write_s: float = Field(ge=0)
    """Time to write one durable checkpoint of the whole job."""
    source: str = ""
    """The plan (and measurements) these came from."""


def durable_write_s(*, state_bytes: float, bandwidth_bytes_per_s: float) -> float:
    """One durable checkpoint: the whole job's state through the file system's throughput."""
    return state_bytes / bandwidth_bytes_per_s


def min_durable_every(*, step_s: float, write_s: float) -> int:
    """The shortest durable cadence, in steps, whose interval is not shorter than the write."""
    return max(1, math.ceil(write_s / step_s - 1e-9))


def durable_cadence_warning(checkpoint: CheckpointConfig, *, hints: PlanHints | None) -> str | None:
    """A warning when the job's durable interval is shorter than the durable write time, else None."""
    if hints is None:
        return None
    every = checkpoint.durable_every
    if every == 0:  # the tier is off
        return None
    interval = every * hints.step_s
    if interval >= hints.durable_write_s:
        return None
    need = min_durable_every(step_s=hints.step_s, write_s=hints.durable_write_s)
    return (
        f"trainer.checkpoint.durable_every={every} steps is {interval:.0f} s at {hints.step_s:g} s/step, "
        f"shorter than the {hints.durable_write_s:.0f} s durable write the plan knows"
        f"{f' ({hints.source})' if hints.source else ''}: due persists will be skipped while one runs; "
        f"set durable_every >= {need} (or rerun `nvrx-eks plan --write`)"
    )
