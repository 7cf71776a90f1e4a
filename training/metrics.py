"""Prometheus metrics per rank, and the names of a recovery's phases.

A rank's figures are counters, gauges and histograms its trainer fills as it runs (`Metrics`); the run's
figures (goodput, recovery phases per fault) are computed afterwards from the event streams
(localrun/summary.py) and name the phases as `RECOVERY_PHASES` does here.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nvrx_eks.training.forks import close_in_forks

if TYPE_CHECKING:
    import socket
    from collections.abc import Mapping

    from prometheus_client import CollectorRegistry

    from nvrx_eks.training.checkpoint.config import CheckpointConfig

RECOVERY_PHASES = ("detect", "teardown", "rendezvous", "start", "restore", "first_step")
"""The phases of a recovery in order: a rank's `recovery_phase_seconds` label them (`RANK_PHASES`), the
run's summary has a `<phase>_s` field for each (localrun/summary.py `FaultPhases`), and the report, the
benchmarks and `python -m nvrx_eks.localrun.phases` name them so."""


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


class _Catalogue:
    """A registry and the series it can expose: each family declared once, with its labels."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry  # noqa: PLC0415

        self.registry = CollectorRegistry()
        self.labels: dict[str, tuple[str, ...]] = {}
        """Each series name this registry can expose -> its label names."""

    def _declare(
        self, name: str, labels: tuple[str, ...], *suffixes: tuple[str, tuple[str, ...]]
    ) -> list[str]:
        # The family's name (a counter's without `_total`) with its type's suffixes, as exposed.
        family = METRIC_PREFIX + name.removesuffix("_total")
        for suffix, extra in suffixes:
            self.labels[family + suffix] = ("rank", *labels, *extra)
        return ["rank", *labels]

    def counter(self, name: str, doc: str, *labels: str) -> Any:  # noqa: ANN401 - a prometheus metric
        from prometheus_client import Counter  # noqa: PLC0415

        names = self._declare(name, labels, ("_total", ()), ("_created", ()))
        return Counter(METRIC_PREFIX + name, doc, names, registry=self.registry)

    def gauge(self, name: str, doc: str, *labels: str) -> Any:  # noqa: ANN401
        from prometheus_client import Gauge  # noqa: PLC0415

        return Gauge(METRIC_PREFIX + name, doc, self._declare(name, labels, ("", ())), registry=self.registry)

    def histogram(self, name: str, doc: str, buckets: tuple[float, ...], *labels: str) -> Any:  # noqa: ANN401
        from prometheus_client import Histogram  # noqa: PLC0415

        series = (("_bucket", ("le",)), ("_sum", ()), ("_count", ()), ("_created", ()))
        names = self._declare(name, labels, *series)
        return Histogram(METRIC_PREFIX + name, doc, names, registry=self.registry, buckets=buckets)


class Metrics:
    """Prometheus exposition for one rank: `<run_dir>/metrics/rank-<R>.prom`, optionally served.

    The trainer calls `step()` once per step; everything else comes from the rank's event stream
    (`EventLog.subscribe(metrics.observe)`), so the metrics and the run's summary (localrun/summary.py)
    read the same facts.
    """

    def __init__(
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
        series = _Catalogue()
        self.registry = series.registry
        self.path = run_dir / "metrics" / f"rank-{rank}.prom"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.every = every
        self.tokens_per_step = tokens_per_step
        self.restart_count = restart_count
        self.high_water = high_water_step(run_dir, rank)
        self._rank = str(rank)

        self._labels = series.labels
        """Each series name this registry can expose -> its label names."""
        self._declare_training_series(series)
        self._declare_checkpoint_series(series)
        self._ckpt_steps: dict[str, int] = {}
        """Per tier: the step of its newest checkpoint on this rank."""
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

    def _declare_training_series(self, series: _Catalogue) -> None:
        """The steps, the loss, the process and the recoveries."""
        counter, gauge, histogram = series.counter, series.gauge, series.histogram
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
        self.world_size = gauge("world_size", "Ranks the job trains on now (fewer after it shrank)")
        self.full_world_size = gauge("full_world_size", "Ranks the job trains on at its full size")

    def _declare_checkpoint_series(self, series: _Catalogue) -> None:
        """Per checkpoint tier: the newest checkpoint, its persists, skips, failures and lag."""
        counter, gauge, histogram = series.counter, series.gauge, series.histogram
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
        self.ckpt_interval = gauge(
            "checkpoint_interval_steps", "Steps between two checkpoints of the tier (its *_every)", "tier"
        )

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
        if not math.isnan(loss):  # a loss not read yet, or a step cut by a restart: keep the last one
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
        elif kind == "attempt_start":
            self._attempt_start(event)
        elif kind == "startup_done":
            self._startup_done(event)
        elif kind == "fault_injected":
            self.faults.labels(rank, event.get("class", "?")).inc()
        elif kind.startswith("checkpoint_"):
            self._checkpoint(kind, event)

    def _attempt_start(self, event: dict[str, Any]) -> None:
        rank = self._rank
        if "world_size" in event:  # below the full size: the job shrank (the job values' `shrink`)
            self.world_size.labels(rank).set(event["world_size"])
            self.full_world_size.labels(rank).set(event.get("full_world_size", event["world_size"]))
        if event.get("attempt", 0) > 0:
            self._layer = "inprocess"
            if self._detected_t is not None:
                self._phase("teardown", event["t"] - self._detected_t)
            self._detected_t = None

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
