"""A run's figures, computed offline from its event streams: the run's summary.json and report.

`summarize(run_dir) -> RunSummary` applies the formulas of docs/measurements.md (the AWS sample's):

- training goodput = productive steps x mean step time / wall time (a replayed step is not productive)
- infra goodput = (wall time - (shutdown + startup time)) / wall time, where shutdown + startup is the
  union of the faults' recovery intervals
- checkpoint efficiency = 1 - (time the loop spent in checkpoint calls) / wall time (worst rank)
- recovery time = fault -> every rank has re-entered and finished its startup (process group, model,
  checkpoint load, data): the last rank's first `startup_done` after the fault
- stall ratio = loop time per checkpoint / (state bytes / memcpy bandwidth measured in the same run)

Per fault: detection = first `detected` (in-process) or `terminated` (launcher) event after it, or,
when the only witness died with it, the first new process's start; steps lost = steps completed
before the fault that had to be trained again (newest completed step - restored step).

Per fault, where the seconds from the fault to the next productive step went (`FaultPhases`): each
phase ends when its slowest rank is through it, so the phases add up to the critical path.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nvrx_eks.training.checkpoint.config import TIER_ORDER
from nvrx_eks.training.events import read_events
from nvrx_eks.training.resilience.modes import NODE_FAULTS, layers, parse_mode

CHECKPOINT_CALL_KINDS = frozenset({"checkpoint_committed", "checkpoint_staged"})


# Where a fault's state came back from, fastest first; a fault row reports the slowest any rank used.
RESTORED_FROM = (*TIER_ORDER, "none")


@dataclass(frozen=True)
class FaultPhases:
    """Seconds from the fault to the next productive step, phase by phase (they add up); one field per
    phase of training/metrics.py `RECOVERY_PHASES`, in its order.

    - detect: fault -> the first witness (`detected`, `terminated`, or a new process when none lived);
    - teardown: -> the old attempt is gone: in process, the last rank's new attempt starts; after a
      launcher restart, the last old worker's last event (the launcher's SIGTERM) -- a worker killed
      outright is gone at once;
    - rendezvous: -> the new workers can run together: the agents' round until the first new worker
      process exists, plus the new process group (its init and the ranks' barrier);
    - start: new worker processes, creation -> ready (interpreter, imports, stores, layers); 0 in process;
    - restore: the slowest rank's state load (`load_s`);
    - first_step: -> every rank has finished its first step after the restore.
    """

    detect_s: float
    teardown_s: float
    rendezvous_s: float
    start_s: float
    restore_s: float
    first_step_s: float

    @property
    def total_s(self) -> float:
        phases: dict[str, float] = asdict(self)
        return sum(phases.values())


@dataclass(frozen=True)
class FaultSummary:
    cls: str
    step: int
    rank: int
    expected_layer: str
    layer: str
    detect_s: float | None
    recovery_s: float | None
    steps_lost: int | None
    tier: str = "none"
    """Where the state came back from (RESTORED_FROM; the slowest rank's): `memory` also for in process."""
    phases: FaultPhases | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["class"] = data.pop("cls")
        return data


@dataclass(frozen=True)
class RunSummary:
    mode: str
    steps: int
    completed: bool
    wall_s: float
    mean_step_s: float
    productive_steps: int
    replayed_steps: int
    training_goodput: float
    infra_goodput: float
    checkpoint_efficiency: float
    stall_ratio: float | None
    stall_per_checkpoint_s: float | None
    """Mean loop time per checkpoint (the numerator of stall_ratio)."""
    stall_floor_s: float | None
    """State bytes / memcpy bandwidth of the same run (the denominator); tiny states make the ratio
    large while the stall itself stays a few milliseconds, so both are reported."""
    final_params_sha256: str | None
    faults: list[FaultSummary] = field(default_factory=list)
    startup_s: float | None = None
    """The job's first start: the first process start -> the last rank's first `startup_done`."""
    checkpoint_stall_s: float = 0.0
    """Loop time spent in checkpoint calls over the run, on the rank that spent the most."""
    checkpoints: int = 0
    """Steps at which the loop took a checkpoint (every tier's calls at one step count once)."""
    checkpoint_warnings: list[str] = field(default_factory=list)
    """One line per checkpoint tier that fell more than one cadence plus one write behind
    (`checkpoint_behind` events), saying when, how far and why: a tier behind is never silent."""
    recovery_s: float = 0.0
    """Wall time inside a recovery (a fault -> every rank restored), overlapping recoveries once: the
    time infra goodput leaves out."""
    model: str | None = None
    """The model preset the reference trainer ran (its `process_start` meta); None for a script."""
    num_parameters: int | None = None
    """Parameters of the tracked modules (rank 0's `startup_done`): the model's size, whatever ran."""
    state_bytes: int | None = None
    """Bytes of one rank's checkpointed state (rank 0's `startup_done`)."""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["faults"] = [f.to_dict() for f in self.faults]
        data["wall_breakdown_s"] = self.wall_breakdown()
        return data

    def wall_breakdown(self) -> dict[str, float]:
        """Where the wall time went, in seconds; the parts sum to `wall_s`.

        - productive: each step kept, once, at the mean step time (training goodput's numerator);
        - replayed: steps run again after a restore from a checkpoint older than the fault;
        - checkpoint_stall: the loop's time in checkpoint calls;
        - recovery: faults until every rank is restored (its first step after is counted as a step);
        - startup: the job's first start;
        - other: the rest -- the loop between steps (events, metrics), the part of each faulted step
          done before its fault, and the end (the last persists, the final barrier).
        """
        parts = {
            "productive": self.productive_steps * self.mean_step_s,
            "replayed": self.replayed_steps * self.mean_step_s,
            "checkpoint_stall": self.checkpoint_stall_s,
            "recovery": self.recovery_s,
            "startup": self.startup_s or 0.0,
        }
        parts["other"] = self.wall_s - sum(parts.values())
        return {name: round(seconds, 3) for name, seconds in parts.items()}


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def _phases(
    t0: float,
    detection: dict[str, Any],
    first_startup: dict[int, dict[str, Any]],
    after: list[dict[str, Any]],
    *,
    old_pids: set[int],
    in_process: bool,
) -> FaultPhases | None:
    t_detect = detection["t"]
    t_restored = max(e["t"] for e in first_startup.values())
    first_steps: dict[int, float] = {}
    for event in after:
        if event["kind"] == "step" and event["t"] > t_restored and event["rank"] not in first_steps:
            first_steps[event["rank"]] = event["t"]
    if len(first_steps) < len(first_startup):
        return None  # the run ended (or failed) before every rank trained again
    restore_s = max(e.get("load_s", 0.0) for e in first_startup.values())
    during = [e for e in after if e["t"] <= t_restored]
    if in_process:
        starts = [e["t"] for e in during if e["kind"] == "attempt_start"]
        t_teardown = max(t_detect, max(starts, default=t_detect))
        t_ready = t_teardown
    else:
        old_last = [e["t"] for e in during if e["pid"] in old_pids]
        t_teardown = max(t_detect, max(old_last, default=t_detect))
        new = [e for e in during if e["kind"] == "process_start" and e["pid"] not in old_pids]
        created = min((e.get("created_t", e["t"]) for e in new), default=t_teardown)
        ready = [e["t"] for e in during if e["kind"] == "process_ready" and e["pid"] not in old_pids]
        t_ready = max(ready, default=t_teardown)
    start_s = 0.0 if in_process else max(0.0, t_ready - max(created, t_teardown))
    # What is left between the teardown and the restored state is the rendezvous: the agents' round
    # (launcher) and the new process group's init and barrier (both).
    rendezvous_s = max(0.0, t_restored - t_teardown - start_s - restore_s)
    return FaultPhases(
        detect_s=round(t_detect - t0, 3),
        teardown_s=round(t_teardown - t_detect, 3),
        rendezvous_s=round(rendezvous_s, 3),
        start_s=round(start_s, 3),
        restore_s=round(restore_s, 3),
        first_step_s=round(max(first_steps.values()) - t_restored, 3),
    )


def _slowest_tier(first_startup: dict[int, dict[str, Any]]) -> str:
    tiers = ["memory" if e["tier"] == "inprocess" else e["tier"] for e in first_startup.values()]
    return max(tiers, key=lambda t: RESTORED_FROM.index(t) if t in RESTORED_FROM else len(RESTORED_FROM))


def _fault_summary(fault: dict[str, Any], events: list[dict[str, Any]], *, mode: str) -> FaultSummary:
    t0 = fault["t"]
    after = [e for e in events if e["t"] > t0]
    detection = next((e for e in after if e["kind"] in {"detected", "terminated", "process_start"}), None)
    # Every rank's first startup after the fault; the last of them ends the recovery.
    first_startup: dict[int, dict[str, Any]] = {}
    for event in after:
        if event["kind"] == "startup_done" and event["rank"] not in first_startup:
            first_startup[event["rank"]] = event
    before_pids = {e["pid"] for e in events if e["t"] <= t0 and e["kind"] == "process_start"}
    recovery = max(first_startup.values(), key=lambda e: e["t"]) if first_startup else None
    if recovery is None:
        layer = "none"
    elif all(e["tier"] == "inprocess" or e["pid"] in before_pids for e in first_startup.values()):
        layer = "inprocess"
    else:
        known = parse_mode(mode)
        launcher = layers(known).launcher if known is not None else "unknown"
        layer = "job_controller" if fault["class"] in NODE_FAULTS else launcher
    done_before = [e["step"] for e in events if e["kind"] == "step" and e["t"] <= t0]
    steps_lost = None
    if recovery is not None:
        restored = min(e["restored_step"] for e in first_startup.values())
        steps_lost = max(0, (max(done_before) if done_before else -1) - restored)
    phases = None
    if recovery is not None and detection is not None:
        phases = _phases(
            t0, detection, first_startup, after, old_pids=before_pids, in_process=layer == "inprocess"
        )
    return FaultSummary(
        cls=fault["class"],
        step=fault["step"],
        rank=fault["target_rank"],
        expected_layer=fault["expected_layer"],
        layer=layer,
        detect_s=round(detection["t"] - t0, 3) if detection else None,
        recovery_s=round(recovery["t"] - t0, 3) if recovery else None,
        steps_lost=steps_lost,
        tier=_slowest_tier(first_startup) if first_startup else "none",
        phases=phases,
    )


def fault_summaries(events: list[dict[str, Any]]) -> list[FaultSummary]:
    """One row per `fault_injected` event of a run's merged event streams, in order."""
    starts = [e for e in events if e["kind"] == "process_start"]
    mode = starts[0].get("mode", "?") if starts else "?"
    return [_fault_summary(f, events, mode=mode) for f in events if f["kind"] == "fault_injected"]


def checkpoint_warnings(events: list[dict[str, Any]]) -> list[str]:
    """Per tier that fell behind on some rank: when, how far, why, and whether it caught up."""
    lines = []
    behind = [e for e in events if e["kind"] == "checkpoint_behind"]
    for tier in sorted({e["tier"] for e in behind}):
        mine = [e for e in behind if e["tier"] == tier]
        first = min(mine, key=lambda e: e["t"])
        ranks = sorted({e["rank"] for e in mine})
        caught = [
            e
            for e in events
            if e["kind"] == "checkpoint_caught_up" and e["tier"] == tier and e["t"] > first["t"]
        ]
        ending = (
            f"caught up at step {min(e['step'] for e in caught)}"
            if len(caught) >= len(mine)
            else "still behind when the run ended"
        )
        write = first["allowed_steps"] - first["every"]  # the tier's measured write, in steps
        lines.append(
            f"checkpoint tier {tier} fell behind {len(mine)} time(s) on rank(s) "
            f"{', '.join(map(str, ranks))}: first at step {first['step']}, newest step on disk "
            f"{first['newest_step']} ({first['age_steps']} steps old, more than one cadence of "
            f"{first['every']} plus one write ({write} step{'' if write == 1 else 's'}): "
            f"{first['allowed_steps']}); {first['reason']}; {ending}"
        )
    return lines


def summarize(run_dir: Path) -> RunSummary:
    """The run's goodput figures and per-fault table, from `<run_dir>/events/*.jsonl` alone."""
    events = read_events(Path(run_dir))
    starts = [e for e in events if e["kind"] == "process_start"]
    if not starts:
        raise ValueError(f"{run_dir}: no events (expected events/rank-*.jsonl)")
    # The loop's length, as the script's loop gave it to `Attempt.steps` (`loop_start`).
    steps_target = next((int(e["steps"]) for e in events if e["kind"] == "loop_start"), 0)
    t_begin = starts[0]["t"]
    ends = [e for e in events if e["kind"] == "end"]
    t_end = max(e["t"] for e in ends) if ends else events[-1]["t"]
    wall = max(t_end - t_begin, 1e-9)

    step_events = [e for e in events if e["kind"] == "step"]
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for event in step_events:
        by_rank.setdefault(event["rank"], []).append(event)
    rank0 = by_rank.get(0, [])
    trained = {e["step"] for e in rank0}
    replayed = len(rank0) - len(trained)
    # A step rank 0 took from a rank a step ahead at an in-process restart is the job's all the same.
    unique = trained | {int(e["to_step"]) for e in events if e["kind"] == "caught_up" and e["rank"] == 0}
    mean_step = statistics.fmean(e["step_s"] for e in rank0) if rank0 else 0.0

    mode = starts[0].get("mode", "?")
    faults = fault_summaries(events)
    recovery = [
        (f_ev["t"], f_ev["t"] + f.recovery_s)
        for f_ev, f in zip((e for e in events if e["kind"] == "fault_injected"), faults, strict=True)
        if f.recovery_s is not None
    ]
    recovering_s = _union_length(recovery)

    ckpt_s = max((sum(e.get("ckpt_s", 0.0) for e in evs) for evs in by_rank.values()), default=0.0)
    stall_ratio = stall_per_checkpoint = floor = None
    calls = {e["step"] for e in events if e["kind"] in CHECKPOINT_CALL_KINDS and e["rank"] == 0}
    sizes = [e for e in events if e["kind"] == "startup_done" and e["rank"] == 0]
    if calls and sizes and rank0:
        floor = sizes[-1]["state_bytes"] / (sizes[-1]["memcpy_gbps"] * 1e9)
        stall_per_checkpoint = sum(e.get("ckpt_s", 0.0) for e in rank0) / len(calls)
        stall_ratio = stall_per_checkpoint / max(floor, 1e-12)
    final = next((e.get("final_params_sha256") for e in reversed(ends) if e["rank"] == 0), None)
    first_ready: dict[int, float] = {}
    for event in events:
        if event["kind"] == "startup_done":
            first_ready.setdefault(event["rank"], event["t"])
    world = int(starts[0].get("world_size", 0)) or len(first_ready)
    startup = max(first_ready.values()) - t_begin if len(first_ready) >= world and first_ready else None
    return RunSummary(
        mode=mode,
        steps=steps_target,
        completed=bool(ends) and len(unique) >= steps_target,
        wall_s=round(wall, 3),
        mean_step_s=mean_step,
        productive_steps=len(unique),
        replayed_steps=replayed,
        training_goodput=len(unique) * mean_step / wall,
        infra_goodput=(wall - recovering_s) / wall,
        checkpoint_efficiency=1.0 - ckpt_s / wall,
        stall_ratio=stall_ratio,
        stall_per_checkpoint_s=stall_per_checkpoint,
        stall_floor_s=floor,
        final_params_sha256=final,
        faults=faults,
        startup_s=None if startup is None else round(startup, 3),
        checkpoint_stall_s=round(ckpt_s, 4),
        checkpoints=len(calls),
        checkpoint_warnings=checkpoint_warnings(events),
        recovery_s=round(recovering_s, 3),
        model=starts[0].get("model"),
        num_parameters=sizes[-1].get("num_parameters") if sizes else None,
        state_bytes=sizes[-1].get("state_bytes") if sizes else None,
    )
