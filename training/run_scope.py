"""One run's identity, and the state that belongs to that run alone: its snapshots in memory.

A run is one launch of a job: one submitted Job, one `torchrun`, one `python train.py`. Every rank and
every restart of a run has the same identity, and the next run another: the Job's UID under the chart
(`NVRX_EKS_RUN_ID`, which the kit's launcher also sets when started by hand), else one drawn once and
kept in the run's own store (torchrun's agent store, which outlives the workers it restarts, or the one
rank 0 hosts without a launcher).

The memory tier's snapshots live under `<memory folder>/run-<id>/`, so a run restores only its own: a
second `torchrun` of a script in the same folder (the same `run_dir`, so the same default memory
folder on the same host's /dev/shm) never resumes the first one's RAM snapshot. The disk tiers are a
job's to resume across runs by design (point `checkpoint.durable_dir` at a new folder to start afresh),
and a resume from any tier is said on every rank's console (`resumed_line`).

Cleaning: the memory snapshots go once the run is over on this host -- the last of the host's ranks
to end (trained to the end, or stopped by its own bad input or bug) removes the run's folder. A run
that ended otherwise (killed, out of restarts) leaves it: the next run in the same default memory
folder removes it first (`stale` folders). A memory folder given explicitly (the chart's pod-lifetime
emptyDir) is the job's own; nothing but this run's folder is touched there.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch.distributed as dist

from nvrx_eks.training.checkpoint.config import CheckpointConfig
from nvrx_eks.training.resilience.config import RUN_ID_ENV

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from nvrx_eks.training.resilience.config import ResilienceConfig

RUN_ID_KEY = "nvrx_eks/run_id"
RUN_ID_CHARS = 36
"""A UUID's length: the identity names folders."""
_RANKS = ".ranks"
"""A marker per rank of the run on this host that has not ended yet."""


def run_id(store: dist.Store, env: Mapping[str, str] | None = None) -> str:
    """This run's identity: `NVRX_EKS_RUN_ID` when the job sets it (the chart: the Job's UID; the kit's
    launcher: one per launch), else drawn by the first rank to ask and kept in the run's store, which
    every rank and restart of the run reads (torchrun's agent store outlives the workers it restarts)."""
    given = (os.environ if env is None else env).get(RUN_ID_ENV, "").strip()
    if given:
        return re.sub(r"[^A-Za-z0-9_.-]", "-", given)[:RUN_ID_CHARS]
    while isinstance(store, dist.PrefixStore):  # the agent's store, not this restart round's prefix
        store = store.underlying_store
    return store.compare_set(RUN_ID_KEY, "", uuid.uuid4().hex[:12]).decode()


@dataclass(frozen=True)
class RunScope:
    """The checkpoint configuration of one run on this host: its memory tier in the run's own folder."""

    run_id: str
    rank: int
    checkpoint: CheckpointConfig
    """`ResilienceConfig.effective_checkpoint()` with `memory_dir` this run's folder."""
    in_default_folder: bool
    """The memory folder is the kit's default one (keyed by the run folder), not one the job set."""

    @classmethod
    def start(cls, cfg: ResilienceConfig, *, store: dist.Store, rank: int) -> RunScope:
        """This rank's scope; removes the memory snapshots earlier runs left in the default folder."""
        identity = run_id(store)
        effective = cfg.effective_checkpoint()
        base = effective.memory_dir
        folder = base / f"run-{identity}"
        default = cfg.checkpoint.memory_dir == CheckpointConfig.model_fields["memory_dir"].default
        if default and base.is_dir():
            # The default folder is keyed by the run folder: whatever else is in it, an earlier run of
            # this folder left on this host (one run at a time writes a run folder).
            for stale in base.iterdir():
                if stale != folder:
                    shutil.rmtree(stale, ignore_errors=True)
        (folder / _RANKS).mkdir(parents=True, exist_ok=True)
        (folder / _RANKS / str(rank)).touch()
        return cls(
            run_id=identity,
            rank=rank,
            checkpoint=effective.model_copy(update={"memory_dir": folder}),
            in_default_folder=default,
        )

    @property
    def memory_dir(self) -> Path:
        return self.checkpoint.memory_dir

    def release(self) -> None:
        """This rank has ended for good (call after its checkpointer closed): the last of the host's
        ranks removes the run's memory snapshots."""
        ranks = self.memory_dir / _RANKS
        with contextlib.suppress(FileNotFoundError):
            (ranks / str(self.rank)).unlink()
        try:
            if any(ranks.iterdir()):
                return
        except FileNotFoundError:
            pass  # the host's other ranks ended at the same time, and one of them removed the folder
        shutil.rmtree(self.memory_dir, ignore_errors=True)
        if self.in_default_folder:  # the run folder's, and the kit's, when nothing else is left there
            for folder in (self.memory_dir.parent, self.memory_dir.parent.parent):
                with contextlib.suppress(OSError):
                    folder.rmdir()

    def location(self, tier: str) -> str:
        """Where `tier` keeps its checkpoints, as a resume names it."""
        if tier == "memory":
            return str(self.memory_dir)
        if tier == "peer_memory":
            return "a partner node's copy in its RAM"
        if tier == "local":
            return str(self.checkpoint.local_dir)
        if tier == "durable":
            return str(self.checkpoint.durable_dir)
        return ""


def resumed_line(*, rank: int, attempt: int, tier: str, step: int, where: str, written_by: str | None) -> str:
    """What every rank prints when it resumes (a fresh start prints nothing). `written_by`: the run
    that wrote the checkpoint when it was another run than this one."""
    if tier == "inprocess":
        return (
            f"rank {rank}: attempt {attempt} resumed after step {step} from its own memory "
            f"(in-process restart); next step {step + 1}"
        )
    line = f"rank {rank}: resumed after step {step} from the {tier} tier"
    line += f" ({where})" if where else ""
    if written_by is not None:
        line += (
            f", written by an earlier run (run {written_by}); to start afresh instead, point "
            "checkpoint.durable_dir (and local_dir) at new folders"
        )
    return f"{line}; next step {step + 1}"
