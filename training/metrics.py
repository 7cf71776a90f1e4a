"""Prometheus metrics per rank, and the run's figures computed from the event streams.

`summarize(run_dir) -> RunSummary` applies the shared README section 5 formulas (the peer's):

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

from training.events import read_events
from training.faults import launcher_layer

CHECKPOINT_CALL_KINDS = frozenset({"checkpoint_committed", "checkpoint_staged"})


# Where a fault's state came back from, fastest first; a fault row reports the slowest any rank used.
TIER_ORDER = ("memory", "peer_memory", "local", "durable", "none")


@dataclass(frozen=True)
class FaultPhases:
    """Seconds from the fault to the next productive step, phase by phase (they add up).

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
        return sum(asdict(self).values())


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
    """Where the state came back from (TIER_ORDER; the slowest rank's): `memory` also for in process."""
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

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["faults"] = [f.to_dict() for f in self.faults]
        return data


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
    return max(tiers, key=lambda t: TIER_ORDER.index(t) if t in TIER_ORDER else len(TIER_ORDER))


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
        layer = "job_controller" if fault["class"] == "node_loss" else launcher_layer(mode)
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


def summarize(run_dir: Path) -> RunSummary:
    """The run's goodput figures and per-fault table, from `<run_dir>/events/*.jsonl` alone."""
    events = read_events(Path(run_dir))
    starts = [e for e in events if e["kind"] == "process_start"]
    if not starts:
        raise ValueError(f"{run_dir}: no events (expected events/rank-*.jsonl)")
    steps_target = int(starts[0].get("steps", 0))
    t_begin = starts[0]["t"]
    ends = [e for e in events if e["kind"] == "end"]
    t_end = max(e["t"] for e in ends) if ends else events[-1]["t"]
    wall = max(t_end - t_begin, 1e-9)

    step_events = [e for e in events if e["kind"] == "step"]
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for event in step_events:
        by_rank.setdefault(event["rank"], []).append(event)
    rank0 = by_rank.get(0, [])
    unique = {e["step"] for e in rank0}
    replayed = len(rank0) - len(unique)
    mean_step = statistics.fmean(e["step_s"] for e in rank0) if rank0 else 0.0

    mode = starts[0].get("mode", "?")
    faults = [_fault_summary(f, events, mode=mode) for f in events if f["kind"] == "fault_injected"]
    recovery = [
        (f_ev["t"], f_ev["t"] + f.recovery_s)
        for f_ev, f in zip((e for e in events if e["kind"] == "fault_injected"), faults, strict=True)
        if f.recovery_s is not None
    ]

    ckpt_s = max((sum(e.get("ckpt_s", 0.0) for e in evs) for evs in by_rank.values()), default=0.0)
    stall_ratio = stall_per_checkpoint = floor = None
    calls = {e["step"] for e in events if e["kind"] in CHECKPOINT_CALL_KINDS and e["rank"] == 0}
    sizes = [e for e in events if e["kind"] == "startup_done" and e["rank"] == 0]
    if calls and sizes and rank0:
        floor = sizes[-1]["state_bytes"] / (sizes[-1]["memcpy_gbps"] * 1e9)
        stall_per_checkpoint = sum(e.get("ckpt_s", 0.0) for e in rank0) / len(calls)
        stall_ratio = stall_per_checkpoint / max(floor, 1e-12)
    final = next((e.get("final_params_sha256") for e in reversed(ends) if e["rank"] == 0), None)
    return RunSummary(
        mode=mode,
        steps=steps_target,
        completed=bool(ends) and len(unique) >= steps_target,
        wall_s=round(wall, 3),
        mean_step_s=mean_step,
        productive_steps=len(unique),
        replayed_steps=replayed,
        training_goodput=len(unique) * mean_step / wall,
        infra_goodput=(wall - _union_length(recovery)) / wall,
        checkpoint_efficiency=1.0 - ckpt_s / wall,
        stall_ratio=stall_ratio,
        stall_per_checkpoint_s=stall_per_checkpoint,
        stall_floor_s=floor,
        final_params_sha256=final,
        faults=faults,
    )


class Metrics:
    """Prometheus text exposition for one rank: `<run_dir>/metrics/rank-<R>.prom`, optionally served."""

    def __init__(self, *, run_dir: Path, rank: int, every: int, port: int | None, local_rank: int) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram  # noqa: PLC0415

        self.registry = CollectorRegistry()
        labels = {"rank": str(rank)}
        self.path = run_dir / "metrics" / f"rank-{rank}.prom"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.every = every
        self.steps = Counter(
            "trainer_steps",
            "Optimizer steps completed (replays included)",
            labelnames=["rank"],
            registry=self.registry,
        ).labels(**labels)
        self.step_seconds = Histogram(
            "trainer_step_seconds",
            "Step time",
            labelnames=["rank"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        ).labels(**labels)
        self.ckpt_seconds = Counter(
            "trainer_checkpoint_stall_seconds",
            "Time the loop spent in checkpoint calls",
            labelnames=["rank"],
            registry=self.registry,
        ).labels(**labels)
        self.loss = Gauge("trainer_loss", "Last loss", labelnames=["rank"], registry=self.registry).labels(
            **labels
        )
        self.last_step = Gauge(
            "trainer_last_step", "Last completed step", labelnames=["rank"], registry=self.registry
        ).labels(**labels)
        if port is not None:
            from prometheus_client import start_http_server  # noqa: PLC0415

            start_http_server(port + local_rank, registry=self.registry)

    def step(self, *, step: int, step_s: float, ckpt_s: float, loss: float) -> None:
        self.steps.inc()
        self.step_seconds.observe(step_s)
        self.ckpt_seconds.inc(ckpt_s)
        self.loss.set(loss)
        self.last_step.set(step)
        if step % self.every == 0:
            self.write()

    def write(self) -> None:
        from prometheus_client import write_to_textfile  # noqa: PLC0415

        write_to_textfile(str(self.path), self.registry)
