"""Prometheus metrics per rank, and the run's figures computed from the event streams.

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

import errno
import json
import logging
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nvrx_eks.training.checkpoint.config import TIER_ORDER
from nvrx_eks.training.events import read_events
from nvrx_eks.training.faults import launcher_layer
from nvrx_eks.training.forks import close_in_forks

if TYPE_CHECKING:
    import socket
    from collections.abc import Mapping

    from prometheus_client import CollectorRegistry

    from nvrx_eks.training.checkpoint.config import CheckpointConfig

CHECKPOINT_CALL_KINDS = frozenset({"checkpoint_committed", "checkpoint_staged"})


# Where a fault's state came back from, fastest first; a fault row reports the slowest any rank used.
RESTORED_FROM = (*TIER_ORDER, "none")


RECOVERY_PHASES = ("detect", "teardown", "rendezvous", "start", "restore", "first_step")
"""The phases of a recovery in order: `FaultPhases` has a `<phase>_s` field for each, the report, the
benchmarks and `python -m nvrx_eks.localrun.phases` name them so."""


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
        layer = "job_controller" if fault["class"] in {"node_loss", "store_loss"} else launcher_layer(mode)
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
    unique = {e["step"] for e in rank0}
    replayed = len(rank0) - len(unique)
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
    )


PORT_WAIT_S = 5.0
"""How long a rank waits for its metrics port while it is still bound: a predecessor on the same local
rank (the launcher restarted the workers) may still be exiting."""


def serve_metrics(registry: CollectorRegistry, *, host: str, port: int, wait_s: float = PORT_WAIT_S) -> bool:
    """Serve `registry` on host:port from a daemon thread; False (logged) if the port stayed taken.

    The listening socket is closed in every process forked from this one (NVRx's in-process monitor
    is forked from the rank and can outlive it): a copy there would keep the port bound after the rank
    ended, and every restarted worker on this local rank would fail to bind it -- a worker that cannot
    start, restarted by its launcher until the job fails. Metrics never stop training: a port still
    taken after `wait_s` (another process holds it) leaves this rank unscraped, with an error in its log.
    """
    from prometheus_client import start_http_server  # noqa: PLC0415

    deadline = time.monotonic() + wait_s
    while True:
        try:
            server, _ = start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
        else:

            def listener(bound: socket.socket = server.socket) -> socket.socket:
                return bound

            close_in_forks(listener)
            return True
        if time.monotonic() >= deadline:
            logging.getLogger("training").error(
                "metrics: port %d on %s is still in use after %.0f s; this rank serves no metrics "
                "(textfile only). Free the port or set trainer.metrics.prometheus_port to a free "
                "range (one port per local rank).",
                port,
                host,
                wait_s,
            )
            return False
        time.sleep(0.1)


# Prometheus names (https://prometheus.io/docs/practices/naming/): base units (seconds, bytes) in the
# name, `_total` on counters, `_timestamp_seconds` on times; one `rank` label, plus the layer, phase or
# tier where a figure is per layer/phase/tier. k8s/dashboards/training.json queries these; its test
# reads the names from a registry this class fills, never from a list.
METRIC_PREFIX = "trainer_"
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
PHASE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
RANK_PHASES = tuple(phase for phase in RECOVERY_PHASES if phase != "detect")
"""What one rank sees of a recovery (`recovery_phase_seconds`' phase label), named as the run's phases:
teardown (in-process: the restart's detection on this rank -> its next attempt), start (a new process:
start -> torch loaded and layers built),
rendezvous (attempt start -> process group formed and ranks lined up), restore (state loaded or kept),
first_step (ready -> the first step done). Detection itself is per fault, in the run's summary."""


def high_water_step(run_dir: Path, rank: int, *, tail_bytes: int = 1 << 18) -> int:
    """The newest step this rank's earlier processes completed (-1: none): a step at or below it is a
    replay. Reads only the tail of the rank's event stream."""
    path = Path(run_dir) / "events" / f"rank-{rank}.jsonl"
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - tail_bytes))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return -1
    newest = -1
    for line in lines:
        if '"kind": "step"' not in line:
            continue
        try:
            newest = max(newest, int(json.loads(line)["step"]))
        except (ValueError, KeyError, TypeError):
            continue  # a torn line
    return newest


def checkpoint_intervals(config: CheckpointConfig) -> dict[str, int]:
    """Each checkpoint tier this configuration turns on -> its interval in steps (the peer replica
    follows every memory snapshot). The metrics publish them, so an alert can tell a tier that fell
    behind from one with a long interval."""
    tiered = config.implementation == "tiered"
    found = {
        "memory": config.memory_every if tiered else 0,
        "peer": config.memory_every if tiered and config.peer_replicas else 0,
        "local": config.local_every if config.local_dir is not None else 0,
        "durable": config.durable_every if config.durable_dir else 0,
    }
    return {tier: every for tier, every in found.items() if every}


METRICS_HOST_ENV = "POD_IP"
"""The address a rank serves /metrics on: the job chart sets it to the pod's IP (downward API
`status.podIP`), the local executor to the "node's" loopback address; unset: every interface."""


class Metrics:
    """Prometheus exposition for one rank: `<run_dir>/metrics/rank-<R>.prom`, optionally served.

    The trainer calls `step()` once per step; everything else comes from the rank's event stream
    (`EventLog.subscribe(metrics.observe)`), so the metrics and `summarize` read the same facts.
    """

    def __init__(  # noqa: PLR0915 - the catalogue of series: one declaration each, in one place
        self,
        *,
        run_dir: Path,
        rank: int,
        every: int,
        port: int | None,
        local_rank: int,
        tokens_per_step: int = 0,
        restart_count: int = 0,
        checkpoint_intervals: Mapping[str, int] | None = None,
    ) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram  # noqa: PLC0415

        self.registry = r = CollectorRegistry()
        self.path = run_dir / "metrics" / f"rank-{rank}.prom"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.every = every
        self.tokens_per_step = tokens_per_step
        self.restart_count = restart_count
        self.high_water = high_water_step(run_dir, rank)
        self._rank = str(rank)

        self._labels: dict[str, tuple[str, ...]] = {}
        """Each series name this registry can expose -> its label names."""

        def declare(name: str, labels: tuple[str, ...], *suffixes: tuple[str, tuple[str, ...]]) -> list[str]:
            # The family's name (a counter's without `_total`) with its type's suffixes, as exposed.
            family = METRIC_PREFIX + name.removesuffix("_total")
            for suffix, extra in suffixes:
                self._labels[family + suffix] = ("rank", *labels, *extra)
            return ["rank", *labels]

        def counter(name: str, doc: str, *labels: str) -> Any:  # noqa: ANN401 - a prometheus metric
            names = declare(name, labels, ("_total", ()), ("_created", ()))
            return Counter(METRIC_PREFIX + name, doc, names, registry=r)

        def gauge(name: str, doc: str, *labels: str) -> Any:  # noqa: ANN401
            return Gauge(METRIC_PREFIX + name, doc, declare(name, labels, ("", ())), registry=r)

        def histogram(name: str, doc: str, buckets: tuple[float, ...], *labels: str) -> Any:  # noqa: ANN401
            series = (("_bucket", ("le",)), ("_sum", ()), ("_count", ()), ("_created", ()))
            return Histogram(
                METRIC_PREFIX + name, doc, declare(name, labels, *series), registry=r, buckets=buckets
            )

        self.steps = counter("steps_total", "Optimizer steps completed (replays included)")
        self.productive_steps = counter("productive_steps_total", "Steps completed for the first time")
        self.replayed_steps = counter("replayed_steps_total", "Steps trained again after a rollback")
        self.productive_seconds = counter(
            "productive_step_seconds_total",
            "Time in steps completed for the first time: its rate is the rank's training goodput",
        )
        self.tokens = counter("tokens_total", "Tokens this rank trained on (replays included)")
        self.step_seconds = histogram("step_seconds", "Step time (forward, backward, update)", STEP_BUCKETS)
        self.stall_seconds = counter(
            "checkpoint_stall_seconds_total", "Time the loop spent in checkpoint calls"
        )
        self.loss = gauge("loss", "Loss of the last step")
        self.last_step = gauge("last_completed_step", "Index of the last completed step")
        self.start_time = gauge("process_start_time_seconds", "When this trainer process started (unix time)")
        self.launcher_restarts = gauge(
            "launcher_restarts", "ft_launcher/torchrun restarts of this node's workers so far"
        )
        self.recoveries = counter(
            "recoveries_total",
            "Recoveries this rank took part in, by layer and the tier restored",
            "layer",
            "tier",
        )
        self.phase_seconds = histogram(
            "recovery_phase_seconds",
            "Duration of each recovery phase on this rank",
            PHASE_BUCKETS,
            "layer",
            "phase",
        )
        self.faults = counter(
            "faults_injected_total", "Faults the chaos schedule injected on this rank", "class"
        )
        self.ckpt_time = gauge(
            "checkpoint_last_success_timestamp_seconds",
            "When the newest checkpoint of the tier completed",
            "tier",
        )
        self.ckpt_step = gauge("checkpoint_last_step", "Step of the newest checkpoint of the tier", "tier")
        self.ckpt_persist = histogram(
            "checkpoint_persist_seconds", "Background persist time of one checkpoint", PHASE_BUCKETS, "tier"
        )
        self.ckpt_skipped = counter(
            "checkpoint_skipped_total",
            "Due checkpoints skipped or coalesced (previous persist running)",
            "tier",
        )
        self.ckpt_failures = counter("checkpoint_failures_total", "Checkpoints failed or timed out", "tier")
        self.ckpt_age = gauge(
            "checkpoint_age_steps",
            "Steps since the newest checkpoint of the tier this rank committed (alert above the "
            "tier's cadence plus one write: the checkpoint_behind event's allowed_steps)",
            "tier",
        )
        self.ckpt_behind = counter(
            "checkpoint_behind_total",
            "Times the tier fell more than one cadence plus one write behind",
            "tier",
        )
        self._ckpt_steps: dict[str, int] = {}
        """Per tier: the step of its newest checkpoint on this rank."""
        self.ckpt_interval = gauge(
            "checkpoint_interval_steps", "Steps between two checkpoints of the tier (its *_every)", "tier"
        )
        self._tiers(checkpoint_intervals or {})
        self.start_time.labels(self._rank).set_to_current_time()
        self.launcher_restarts.labels(self._rank).set(restart_count)
        self._process_start_s: float | None = None
        self._detected_t: float | None = None
        self._layer: str | None = None
        self._ready_t: float | None = None
        if port is not None:
            host = os.environ.get(METRICS_HOST_ENV) or "0.0.0.0"  # noqa: S104 - a pod's own address
            serve_metrics(self.registry, host=host, port=port + local_rank)

    def _tiers(self, intervals: Mapping[str, int]) -> None:
        for tier, interval in intervals.items():
            self.ckpt_interval.labels(self._rank, tier).set(interval)
            # Counted from 0, not from the first skip or failure: a rate or an increase over them
            # then reads 0 from the start instead of no data.
            self.ckpt_skipped.labels(self._rank, tier)
            self.ckpt_failures.labels(self._rank, tier)

    def step(self, *, step: int, step_s: float, ckpt_s: float, loss: float) -> None:
        rank = self._rank
        self.steps.labels(rank).inc()
        self.tokens.labels(rank).inc(self.tokens_per_step)
        if step > self.high_water:
            self.high_water = step
            self.productive_steps.labels(rank).inc()
            self.productive_seconds.labels(rank).inc(step_s)
        else:
            self.replayed_steps.labels(rank).inc()
        self.step_seconds.labels(rank).observe(step_s)
        self.stall_seconds.labels(rank).inc(ckpt_s)
        self.loss.labels(rank).set(loss)
        self.last_step.labels(rank).set(step)
        for tier, newest in self._ckpt_steps.items():
            self.ckpt_age.labels(rank, tier).set(step - newest)
        if self._layer is not None and self._ready_t is not None:
            self._phase("first_step", time.time() - self._ready_t)
            self._layer = self._ready_t = None
        if step % self.every == 0:
            self.write()

    def _phase(self, phase: str, seconds: float) -> None:
        assert self._layer is not None  # noqa: S101
        assert phase in RANK_PHASES, phase  # noqa: S101
        self.phase_seconds.labels(self._rank, self._layer, phase).observe(max(0.0, seconds))

    def observe(self, event: dict[str, Any]) -> None:
        """One event of this rank's stream (training/events.py lists the kinds)."""
        kind, rank = event["kind"], self._rank
        if kind == "process_ready":
            self._process_start_s = float(event.get("setup_s", 0.0))
        elif kind == "detected":
            self._detected_t = event["t"]
        elif kind == "attempt_start" and event.get("attempt", 0) > 0:
            self._layer = "inprocess"
            if self._detected_t is not None:
                self._phase("teardown", event["t"] - self._detected_t)
            self._detected_t = None
        elif kind == "startup_done":
            self._startup_done(event)
        elif kind == "fault_injected":
            self.faults.labels(rank, event.get("class", "?")).inc()
        elif kind.startswith("checkpoint_"):
            self._checkpoint(kind, event)

    def _checkpoint(self, kind: str, event: dict[str, Any]) -> None:
        rank, tier = self._rank, str(event.get("tier", "memory"))
        if kind in {"checkpoint_committed", "checkpoint_staged"}:
            self.ckpt_time.labels(rank, tier).set(event["t"])
            self.ckpt_step.labels(rank, tier).set(event.get("step", -1))
            self._ckpt_steps[tier] = max(self._ckpt_steps.get(tier, -1), int(event.get("step", -1)))
            if "seconds" in event:
                self.ckpt_persist.labels(rank, tier).observe(event["seconds"])
        elif kind == "checkpoint_skipped":
            self.ckpt_skipped.labels(rank, tier).inc()
        elif kind in {"checkpoint_failed", "checkpoint_timeout"}:
            self.ckpt_failures.labels(rank, tier).inc()
        elif kind == "checkpoint_behind":
            self.ckpt_behind.labels(rank, tier).inc()

    def _startup_done(self, event: dict[str, Any]) -> None:
        attempt = int(event.get("attempt", 0))
        if attempt == 0:
            if self.restart_count > 0:
                self._layer = "ft_launcher"
            elif int(event.get("restored_step", -1)) >= 0:
                self._layer = "job_controller"  # a new pod that found a checkpoint: a replacement
            else:
                return  # the run's first start: no recovery
            if self._process_start_s is not None:
                self._phase("start", self._process_start_s)
        if self._layer is None:
            return
        load_s = float(event.get("load_s", 0.0))
        self._phase("rendezvous", float(event.get("startup_s", 0.0)) - load_s)
        self._phase("restore", load_s)
        self.recoveries.labels(self._rank, self._layer, str(event.get("tier", "none"))).inc()
        self._ready_t = event["t"]

    def metric_names(self) -> set[str]:
        """Every series name this registry can expose, observed yet or not (a labelled metric shows
        no sample before its first label set): the family's name with its type's suffixes."""
        suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created")}
        return {
            family.name + suffix
            for family in self.registry.collect()
            for suffix in suffixes.get(family.type, ("",))
        }

    def series_labels(self) -> dict[str, tuple[str, ...]]:
        """Every series name this registry can expose -> the label names its samples carry (the
        alert rules' unit tests are checked against it)."""
        return dict(self._labels)

    def write(self) -> None:
        from prometheus_client import write_to_textfile  # noqa: PLC0415

        write_to_textfile(str(self.path), self.registry)
