"""`--from RUN_DIR`: the costs this kit measured, fed into the plan and labelled measured.

It reads, anywhere below RUN_DIR:
- `peer.json` (`nvrx-eks bench peer`, bench/peer.py): per mode the goodput, wall time and every
  fault with the layer that recovered it and its recovery time; the scenario (steps, faults, cadences).
- `summary.json` (`nvrx-eks demo` / a chaos run, localrun/report.py): step time, loop stall per
  checkpoint, faults with layer and recovery time.
- `checkpoint-bench.json` (`nvrx-eks bench checkpoint --json-out`, bench/checkpoint/bench.py): the
  loop stall per snapshot, the durable write time and the restore time per tier.
- `scale.json` (`nvrx-eks bench scale`, bench/scale.py): each fault class's recovery at several
  node counts. Each layer's recovery becomes a + b*log2(nodes), fitted to the rows that recovered, and
  is evaluated at the plan's fleet size once the plan is known (`ScaleFit`); it replaces the layer's
  constant from peer.json or summary.json, which were measured at one size. The fit itself goes on to
  the fleet-size plot, which evaluates it at every size it draws (`Calibration.fitted`).

What each number becomes in the plan:
- step time: each mode's mean step (peer.json rows carry it, with the job's first start, the loop's
  time in checkpoint calls and their count); the median over the modes for a plan file.
- recovery per layer: the mean recovery of the faults that layer recovered (recovery in the kit's
  events ends when every rank has finished its startup, checkpoint load included, so restore_s is 0);
  a store loss's goes to recovery.store_loss_s, not to the Job controller's node swap. Over every mode
  for a plan file; each mode's own in peer.json's scenario.
- startup: each mode's first start (first process start -> every rank's first `startup_done`); the
  median over the modes for a plan file.
- checkpoint stall: the loop's time in checkpoint calls per checkpoint, the kit's per RAM snapshot and
  the single-tier modes' per durable checkpoint.
An older peer.json without those figures: the step from the goodput formula read backwards, and the
first start (checkpoint stall included) as what is left of the wall time -- derived, and labelled so.
Without a plan file, peer.json's own scenario becomes the plan (this machine's two CPU "nodes"), so
the projection can be set beside the goodput that run measured.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from nvrx_eks.kitcore.configio import UserError, read_json, validate_file
from nvrx_eks.planner.config import OWN_WORKLOAD, PLAN_NAME_MAX, TIERS

if TYPE_CHECKING:
    from pathlib import Path

# The layer names of localrun/summary.py FaultSummary.layer -> the plan's recovery fields.
LAYER_FIELDS = {
    "inprocess": "inprocess_s",
    "ft_launcher": "launcher_s",
    "torchrun": "job_restart_s",
    "job_controller": "node_swap_s",
}
# Classes whose recovery is a plan field of its own whatever layer the events name: the Job controller
# brings back a store loss too, but by restarting every pod, not by replacing one node.
CLASS_FIELDS = {"store_loss": "store_loss_s"}


def recovery_field(cls: str | None, layer: str | None) -> str | None:
    """The plan's recovery field (recovery.*) a fault's measured recovery sets; None: no plan layer."""
    if cls in CLASS_FIELDS:
        return CLASS_FIELDS[cls]
    return LAYER_FIELDS.get(layer or "")


# The local executor's topology (k8s/values/local-cpu.yaml): two "nodes" of two CPU ranks.
LOCAL_NODES = 2
LOCAL_REPAIR_S = 1.0
"""A lost local node is back as soon as its replacement pod starts (inside the node-loss recovery)."""


# bench scale's fault classes, each a plan layer: exception -> in-process, SIGKILL -> ft_launcher, node
# loss -> the node swap, store loss -> every pod restarted from disk (recovery.store_loss_s).
SCALE_CLASSES = ("exception", "sigkill", "node_loss", "store_loss")


@dataclass(frozen=True)
class ScaleFit:
    """One layer's recovery against fleet size: a + b*log2(nodes), least squares over bench scale's rows.

    log2: every restart round NVRx runs (the store barrier, the rendezvous) is a tree or a fan-in whose
    depth grows with log2 of the participants; a linear fit to 2-8 nodes would put hours on 1,024. The
    slope is clamped at 0 (recovery does not shrink as the job grows; a negative fitted slope is noise
    that would extrapolate below zero). A least-squares slope is a weighted mean of the pairwise slopes,
    so it never exceeds the steepest rise between two measured rows.
    """

    a: float
    b: float
    nodes: tuple[int, ...]
    """The measured sizes, ascending."""
    classes: tuple[str, ...]
    path: str

    def at(self, nodes: int) -> float:
        return max(0.0, self.a + self.b * math.log2(nodes))

    def label(self, nodes: int) -> str:
        low, high = self.nodes[0], self.nodes[-1]
        measured = f"measured: {self.path} (bench scale {'/'.join(self.classes)}"
        if low == high:
            return f"{measured} at {low} nodes only, held constant at every size)"
        where = "evaluated at" if low <= nodes <= high else "extrapolated to"
        fitted = f"fitted {self.a:.3g} + {self.b:.3g}*log2(n)"
        return f"{measured} {low}-{high} nodes, {fitted}, {where} {nodes} nodes)"


def fit_log2(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(a, b) of recovery = a + b*log2(nodes) by least squares, b clamped at 0."""
    xs = [math.log2(n) for n, _ in points]
    ys = [y for _, y in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    covariance = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    slope = 0.0 if spread == 0 else max(0.0, covariance / spread)
    return mean_y - slope * mean_x, slope


@dataclass
class Calibration:
    overrides: dict[str, Any] = field(default_factory=dict)
    """Nested plan fields the measurements set."""
    labels: dict[str, str] = field(default_factory=dict)
    """Dotted plan field -> where its value came from."""
    measured_goodput: dict[str, float] = field(default_factory=dict)
    """Training goodput per mode as the run measured it (for the side-by-side)."""
    scenario: dict[str, Any] | None = None
    """A whole plan built from peer.json's scenario (used when no plan file is given)."""
    scenario_labels: dict[str, str] = field(default_factory=dict)
    """Where the scenario's own fields came from (joined to `labels` when the scenario is used)."""
    files: list[str] = field(default_factory=list)
    scale: dict[str, ScaleFit] = field(default_factory=dict)
    """Recovery field (recovery.*) -> its fit against fleet size, evaluated by `at_fleet`."""
    fitted: dict[str, ScaleFit] = field(default_factory=dict)
    """The fits the plan took (`at_fleet`: those --set did not override), for the fleet-size sweep."""

    def at_fleet(self, nodes: int, *, skip: set[str]) -> None:
        """Set each fitted recovery at `nodes` (the plan's fleet), except the fields in `skip` (--set)."""
        self.fitted = {dotted: fit for dotted, fit in self.scale.items() if dotted not in skip}
        for dotted, fit in self.fitted.items():
            self.set(dotted, round(fit.at(nodes), 3), fit.label(nodes))

    def scenario_given(self, asked: dict[str, Any]) -> dict[str, Any]:
        """The scenario with each mode's own step, first start or recovery left out where the plan is
        given one for every mode: by --set (`asked`) or by a fit against fleet size (bench scale)."""
        assert self.scenario is not None  # noqa: S101
        workload = set(asked.get("workload", {})) & set(OWN_WORKLOAD)
        recovery = set(asked.get("recovery", {})) | {dotted.partition(".")[2] for dotted in self.fitted}
        modes = {}
        for name, setup in self.scenario["modes"].items():
            own = {key: value for key, value in setup.items() if key not in workload}
            if "recovery" in own:
                own["recovery"] = {key: s for key, s in own["recovery"].items() if key not in recovery}
            modes[name] = own
        return self.scenario | {"modes": modes}

    def set(self, dotted: str, value: Any, label: str) -> None:  # noqa: ANN401 - any plan value
        node = self.overrides
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
        self.labels[dotted] = label


# The fields this module reads from each file, checked before any is used: a file from another tool,
# an older kit or a run stopped mid-write is one message naming the file and the field, never a
# KeyError. Other fields are kept as they are (extra="allow").
class _Read(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class _Recovery(_Read):
    """A fault row as far as its recovery goes (summary.json's rows)."""

    fault_class: str | None = Field(None, alias="class")
    layer: str | None = None
    recovery_s: float | None = None
    tier: str | None = None


class _Fault(_Recovery):
    """A peer.json fault row: its class and step also rebuild the run's fault schedule."""

    fault_class: str = Field(alias="class")
    step: int = Field(ge=0)


class _PeerMode(_Read):
    completed: bool = False
    training_goodput: float | None = None
    wall_s: float | None = None
    steps_lost: int = 0
    faults: list[_Fault] = []
    overrides: list[str] = []
    mean_step_s: float | None = None
    startup_s: float | None = None
    checkpoint_stall_s: float | None = None
    checkpoints: int | None = None

    @model_validator(mode="after")
    def _finished(self) -> _PeerMode:
        if self.completed and (self.training_goodput is None or self.wall_s is None):
            raise ValueError("a completed mode needs training_goodput and wall_s")
        return self


class _PeerScenario(_Read):
    steps: int = Field(ge=1)
    num_faults: int = Field(ge=0)
    durable_every: int = Field(ge=1)
    fault_seed: int | None = None


class _PeerFile(_Read):
    scenario: _PeerScenario
    modes: dict[str, _PeerMode]


class _SummaryFile(_Read):
    training_goodput: float
    faults: list[_Recovery]
    mode: str = "run"
    mean_step_s: float | None = None
    stall_per_checkpoint_s: float | None = None


class _BenchRow(_Read):
    kind: str
    stall_s: float


class _ScaleRow(_Read):
    nodes: int = Field(ge=1)
    fault_class: str = Field(alias="class")
    recovery_s: float | None = Field(ge=0)
    recovered: bool
    layer: str | None


class _ScaleFile(_Read):
    rows: list[_ScaleRow]


class _CheckpointBenchFile(_Read):
    rows: list[_BenchRow] = []
    state_bytes: int = 0
    durable_write_s: float | None = None
    restore_s: dict[str, float] = {}


_SHAPES: dict[str, tuple[type[_Read], str]] = {
    "peer.json": (_PeerFile, "`nvrx-eks bench peer` peer.json (rerun it to write a complete one)"),
    "summary.json": (_SummaryFile, "run's summary.json (`nvrx-eks demo`, `nvrx-eks report`)"),
    "checkpoint-bench.json": (_CheckpointBenchFile, "`nvrx-eks bench checkpoint --json-out` file"),
    "scale.json": (_ScaleFile, "`nvrx-eks bench scale` scale.json (rerun it to write a complete one)"),
}


def _read(path: Path) -> dict[str, Any]:
    shape, what = _SHAPES[path.name]
    data = read_json(path, what=what)
    validate_file(shape, data, path, what=what)
    return data


def _recoveries(faults: list[dict[str, Any]], out: dict[str, list[float]]) -> None:
    """Each measured recovery under the plan field it sets (`recovery_field`)."""
    for fault in faults:
        name, seconds = recovery_field(fault.get("class"), fault.get("layer")), fault.get("recovery_s")
        if name is not None and isinstance(seconds, int | float):
            out.setdefault(name, []).append(float(seconds))


def _what(name: str) -> str:
    """What a recovery field's measurements were, for its label."""
    classes = [cls for cls, field in CLASS_FIELDS.items() if field == name]
    layers = [layer for layer, field in LAYER_FIELDS.items() if field == name]
    return "/".join(classes or layers)


def _cadence(overrides: list[str], tier: str) -> int | None:
    for item in overrides:
        key, _, value = item.partition("=")
        if key == f"trainer.checkpoint.{tier}_every":
            return int(value)
    return None


def _completed(modes: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: r for n, r in modes.items() if r.get("completed") and "training_goodput" in r}


def _itemized(rows: dict[str, dict[str, Any]]) -> bool:
    """Rows that carry their own step, first-start and checkpoint figures (peer.json since 2026-12)."""
    keys = ("mean_step_s", "startup_s", "checkpoint_stall_s", "checkpoints")
    return bool(rows) and all(row.get(k) is not None for row in rows.values() for k in keys)


def _by_mode(arms: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """peer.json's arms keyed by the mode each ran, the plan's name for it (the `kit` arm runs `both`
    with the kit's tiering and a spare)."""
    return {str(row.get("mode") or name): row for name, row in arms.items()}


def _from_peer(path: Path, cal: Calibration) -> None:
    doc = _read(path)
    scenario, modes = doc["scenario"], _by_mode(doc["modes"])
    label = f"measured: {path}"
    steps = int(scenario["steps"])
    rows = _completed(modes)
    if not rows:
        raise UserError(f"{path}: no mode completed; rerun `nvrx-eks bench peer`")
    recoveries: dict[str, list[float]] = {}
    for name, row in rows.items():
        cal.measured_goodput[name] = float(row["training_goodput"])
        _recoveries(row.get("faults", []), recoveries)
    for name, seconds in recoveries.items():
        cal.set(f"recovery.{name}", round(statistics.fmean(seconds), 3), f"{label} ({_what(name)})")
    if _itemized(rows):
        costs = _measured_costs(rows)
        step_s = statistics.median(costs.step_s.values())
        cal.set("workload.step_s", round(step_s, 4), f"{label} (mean step, median over the modes)")
        cal.set(
            "workload.startup_s",
            round(statistics.median(costs.startup_s.values()), 3),
            f"{label} (first process start -> every rank's first startup done, median over the modes)",
        )
    else:
        # An older peer.json: the step from the goodput formula read backwards, the first start as the
        # remainder of the wall time (checkpoint stall included), one figure for every mode.
        costs = None
        step_s = statistics.median(r["training_goodput"] * r["wall_s"] / steps for r in rows.values())
        cal.set("workload.step_s", round(step_s, 4), f"{label} (training goodput x wall / steps, median)")
        residuals = [
            row["wall_s"]
            - steps * step_s
            - sum(f.get("recovery_s") or 0.0 for f in row.get("faults", []))
            - row.get("steps_lost", 0) * step_s
            for row in rows.values()
        ]
        cal.set(
            "workload.startup_s",
            round(max(0.0, statistics.median(residuals)), 3),
            f"derived: {path} (wall - training - recovery - replayed steps, median: first start + stall)",
        )
    _peer_scenario(path, scenario, modes, step_s=step_s, costs=costs, cal=cal)


@dataclass(frozen=True)
class _PeerCosts:
    """What each mode of an itemized peer.json paid besides its recoveries, measured in its own run."""

    step_s: dict[str, float]
    """Each mode's mean step: on two shared CPU cores the kit's background persists and RAM replica
    slow its steps a little, and the measured goodput counts those steps as they ran."""
    startup_s: dict[str, float]
    recovery: dict[str, dict[str, float]]
    """Each mode's mean recovery per plan field (`recovery_field`), from its own faults: on two shared
    cores the kit's background persists slow its in-process restarts too."""
    durable_stall_s: float
    """Loop time per checkpoint of the modes that snapshot only at their durable cadence."""
    memory_stall_s: float | None
    """Loop time per RAM snapshot of the kit's mode (None without it)."""


def _stall_per_checkpoint(row: dict[str, Any]) -> float:
    return float(row["checkpoint_stall_s"]) / max(1, int(row["checkpoints"]))


def _mean_recoveries(faults: list[dict[str, Any]]) -> dict[str, float]:
    measured: dict[str, list[float]] = {}
    _recoveries(faults, measured)
    return {name: round(statistics.fmean(seconds), 3) for name, seconds in measured.items()}


def _measured_costs(rows: dict[str, dict[str, Any]]) -> _PeerCosts:
    single_tier = [_stall_per_checkpoint(r) for n, r in rows.items() if n != "both"]
    return _PeerCosts(
        step_s={n: float(r["mean_step_s"]) for n, r in rows.items()},
        startup_s={n: float(r["startup_s"]) for n, r in rows.items()},
        recovery={n: _mean_recoveries(r.get("faults", [])) for n, r in rows.items()},
        durable_stall_s=statistics.median(single_tier) if single_tier else 0.0,
        memory_stall_s=_stall_per_checkpoint(rows["both"]) if "both" in rows else None,
    )


def _peer_scenario(
    path: Path,
    scenario: dict[str, Any],
    modes: dict[str, Any],
    *,
    step_s: float,
    costs: _PeerCosts | None,
    cal: Calibration,
) -> None:
    """peer.json's own scenario as a whole plan: this machine, the run's faults, each mode's cadences."""
    label = f"measured: {path}"
    steps = int(scenario["steps"])
    drawn: list[dict[str, Any]] = next((row["faults"] for row in modes.values() if row.get("faults")), [])
    schedule = [f"{f['class']}@{f['step']}" for f in drawn]
    if len(schedule) != int(scenario["num_faults"]):
        raise UserError(
            f"{path}: scenario.num_faults is {scenario['num_faults']} but {len(schedule)} faults are listed"
        )
    tiers = {f.get("tier") for row in modes.values() for f in row.get("faults") or []}
    replicated = "peer_memory" in tiers or not any(f["class"] == "node_loss" for f in drawn)
    kit_overrides = modes.get("both", {}).get("overrides", [])
    kit_memory, kit_local = _cadence(kit_overrides, "memory"), _cadence(kit_overrides, "local")
    every = int(scenario["durable_every"])
    cal.scenario = {
        "name": f"bench-peer-{path.parent.name}"[:PLAN_NAME_MAX],
        # The local executor replaces a lost node's pod at once (localrun/executor.py; no new node to
        # wait for): its start is inside the measured node-loss recovery, so no capacity wait on top.
        "fleet": {
            "instance_profile": "local-cpu",
            "nodes": LOCAL_NODES,
            "spares": 0,
            "repair_hours": LOCAL_REPAIR_S / 3600.0,
        },
        "workload": {"step_s": step_s, "steps": steps, "model": "tiny"},
        # The run's own faults, fault for fault: the same draw for every mode (bench/peer.py).
        "faults": {
            "schedule": schedule,
            "source": f"{path} (seed {scenario.get('fault_seed')}, the faults that run drew)",
        },
        # The kit persists in the background: what the loop pays is its stall per checkpoint.
        # Restores are inside the measured recoveries.
        "checkpoint": {
            # The local values replicate each memory snapshot to the other node (storage.peer_replicas
            # defaults to 1 with two nodes): a node loss may restore from the partner's RAM.
            "peer_replica": replicated,
            "memory": {"stall_s": 0.0 if costs is None else costs.memory_stall_s or 0.0},
            "local": {"write_s": 0.0},
            "durable": {"write_s": 0.0} | ({} if costs is None else {"stall_s": costs.durable_stall_s}),
        },
        "modes": {
            "baseline": {"tiers": {"durable": every}},
            "inprocess": {"tiers": {"durable": every}},
            "ft_launcher": {"tiers": {"durable": every}},
            "both": {"tiers": {"memory": kit_memory or 2, "local": kit_local or 10, "durable": every}},
        },
    }
    if costs is not None:
        # Each mode's own first start, step and recoveries: on two shared cores the pods' starts differ
        # by a second from run to run, and a mode's background persists slow its steps and restarts,
        # which in a run this short is several points of goodput.
        for name, setup in cal.scenario["modes"].items():
            if name in costs.startup_s:
                setup["startup_s"] = costs.startup_s[name]
                setup["step_s"] = costs.step_s[name]
                setup["recovery"] = costs.recovery[name]
        cal.scenario_labels["modes.*.startup_s"] = f"{label} (each mode's first start)"
        cal.scenario_labels["modes.*.step_s"] = f"{label} (each mode's mean step)"
        cal.scenario_labels["modes.*.recovery"] = f"{label} (each mode's mean recovery per layer)"
    _label_peer_scenario(cal, label, costs=costs, kit_tiering=kit_memory is not None, tiers=tiers)


def _label_peer_scenario(
    cal: Calibration, label: str, *, costs: _PeerCosts | None, kit_tiering: bool, tiers: set[Any]
) -> None:
    """Where each figure of the scenario `_peer_scenario` built comes from: measured (the run), or an
    assumption named."""
    scenario_labels = cal.scenario_labels
    if not kit_tiering:
        scenario_labels["modes.both.tiers"] = (
            "assumed: bench/peer.py kit tiering (RAM every 2, disk every 10)"
        )
    scenario_labels["checkpoint.peer_replica"] = (
        f"{label} (a node loss restored from a partner's RAM)"
        if "peer_memory" in tiers
        else "assumed: the local values' default (one peer replica with two nodes)"
    )
    scenario_labels["faults.schedule"] = label
    scenario_labels["fleet.repair_hours"] = (
        f"{label} (the local executor replaces a lost node's pod at once; its start is in the recovery)"
    )
    scenario_labels["workload.steps"] = f"{label} (scenario)"
    tiny = "assumed: the tiny model's persists take milliseconds in the background" + (
        " (their stall is in the derived startup)" if costs is None else ""
    )
    for dotted in ("checkpoint.memory.stall_s", "checkpoint.local.write_s", "checkpoint.durable.write_s"):
        scenario_labels[dotted] = tiny
    if costs is not None:
        stall = "(loop time in checkpoint calls per checkpoint)"
        scenario_labels["checkpoint.memory.stall_s"] = f"{label}: kit {stall}"
        scenario_labels["checkpoint.durable.stall_s"] = f"{label}: single-tier modes {stall}"
    scenario_labels["checkpoint.durable.restore_s"] = (
        "measured: inside each recovery (events end at startup_done)"
    )
    scenario_labels["modes.*.tiers.durable"] = label


def _from_summary(path: Path, cal: Calibration) -> None:
    doc = _read(path)
    label = f"measured: {path}"
    if "workload.step_s" not in cal.labels and doc.get("mean_step_s"):
        cal.set("workload.step_s", round(float(doc["mean_step_s"]), 4), f"{label} (mean step)")
    if doc.get("stall_per_checkpoint_s") is not None:
        cal.set("checkpoint.memory.stall_s", float(doc["stall_per_checkpoint_s"]), f"{label} (loop stall)")
    recoveries: dict[str, list[float]] = {}
    _recoveries(doc["faults"], recoveries)
    for name, seconds in recoveries.items():
        dotted = f"recovery.{name}"
        if dotted not in cal.labels:
            cal.set(dotted, round(statistics.fmean(seconds), 3), f"{label} ({_what(name)})")
    cal.measured_goodput.setdefault(str(doc.get("mode", "run")), float(doc["training_goodput"]))


def _from_checkpoint_bench(path: Path, cal: Calibration) -> None:
    doc = _read(path)
    label = f"measured: {path} ({doc.get('state_bytes', 0) / 1e9:.2f} GB state per rank)"
    device_rows = [r for r in doc.get("rows", []) if r.get("kind") == "device"]
    if device_rows and "checkpoint.memory.stall_s" not in cal.labels:
        stall = statistics.median(float(r["stall_s"]) for r in device_rows)
        cal.set("checkpoint.memory.stall_s", stall, f"{label} (device step model, median)")
    if doc.get("durable_write_s") is not None:
        cal.set("checkpoint.durable.write_s", float(doc["durable_write_s"]), label)
    for tier, seconds in (doc.get("restore_s") or {}).items():
        if tier in TIERS:
            cal.set(f"checkpoint.{tier}.restore_s", float(seconds), label)


def _from_scale(path: Path, cal: Calibration) -> None:
    doc = _read(path)
    points: dict[str, list[tuple[int, float]]] = {}
    classes: dict[str, set[str]] = {}
    for row in doc["rows"]:
        name = recovery_field(row["class"], row["layer"])
        # A row that did not recover, or recovered by another layer than its class's, measures nothing
        # the plan's layer pays.
        if row["class"] not in SCALE_CLASSES or not row["recovered"] or name is None:
            continue
        if row["recovery_s"] is None:
            continue
        dotted = f"recovery.{name}"
        points.setdefault(dotted, []).append((int(row["nodes"]), float(row["recovery_s"])))
        classes.setdefault(dotted, set()).add(row["class"])
    if not points:
        raise UserError(f"{path}: rows: no fault recovered; rerun `nvrx-eks bench scale`")
    for dotted, measured in points.items():
        a, b = fit_log2(measured)
        cal.scale[dotted] = ScaleFit(
            a=a,
            b=b,
            nodes=tuple(sorted({n for n, _ in measured})),
            classes=tuple(sorted(classes[dotted])),
            path=str(path),
        )


def calibrate(run_dir: Path) -> Calibration:
    """Everything measured below `run_dir`; a folder with none of the three files is a UserError."""
    if not run_dir.is_dir():
        raise UserError(f"--from {run_dir}: no such folder; pass a run folder (runs/...)")
    cal = Calibration()
    readers = (
        ("peer.json", _from_peer),
        ("summary.json", _from_summary),
        ("checkpoint-bench.json", _from_checkpoint_bench),
        ("scale.json", _from_scale),
    )
    for name, reader in readers:
        for path in sorted(run_dir.rglob(name)):
            reader(path, cal)
            cal.files.append(str(path))
    if not cal.files:
        raise UserError(
            f"--from {run_dir}: found no peer.json, summary.json, checkpoint-bench.json or scale.json below "
            "it; point it at a `nvrx-eks bench peer`, `nvrx-eks demo`, `bench checkpoint --json-out` or "
            "`bench scale` output"
        )
    return cal
