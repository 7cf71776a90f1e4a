"""How far a job shrinks when a lost node's replacement cannot be scheduled, and when it grows back: the
chart-owned part of the kit's configuration that the rendezvous store's process reads too.

Its own module, torch-free and importing nothing of the kit, so the store's image (images/store.Dockerfile)
holds it without the rest of the configuration. The job values' `shrink` section sets it
(k8s/rank_config.py); training/resilience/config.py `ResilienceConfig.shrink` carries it to every launcher
and rank, `SHRINK_ENV` to the store.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

SHRINK_ENV = "NVRX_EKS_SHRINK"
"""The job's `ShrinkConfig` as JSON, for the rendezvous store's process (the chart sets it when the job
may shrink); the ranks and launchers read the same section in `NVRX_EKS_CONFIG`."""


class ShrinkConfig(BaseModel):
    """Whether and how far the job shrinks when a lost node's replacement cannot be scheduled. Set by the
    chart from the job values' `shrink` section (k8s/rank_config.py), never in `trainer:`; the
    rendezvous store's process and every launcher and rank read it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    nodes: int = Field(
        0, ge=0, description="The job's full size in nodes, which it grows back to; 0: it never shrinks."
    )
    node_counts: list[int] = Field(
        default_factory=list,
        description="The smaller node counts the job may train at (the parallel layout runs at each), "
        "largest first, down to the values' shrink.min_nodes.",
    )
    after_s: float = Field(
        600.0,
        gt=0,
        description="How long a restart round waits for a lost node's replacement before it closes with "
        "the nodes present, at the largest of node_counts they fill.",
    )

    grow_wait_s: float = Field(
        1800.0,
        gt=0,
        description="How long a shrunk job that can grow back keeps training for its next durable "
        "checkpoint, which the grown job restores; past it, the job grows back at once and retrains the "
        "steps since the newest one.",
    )

    @property
    def enabled(self) -> bool:
        return self.nodes > 0 and bool(self.node_counts)

    def size_for(self, present: int) -> int | None:
        """The node count a round with `present` nodes closes at once the wait is over: the largest of
        `node_counts` they fill, or None when they fill none (the round waits on)."""
        return next((count for count in self.node_counts if count <= present), None)
