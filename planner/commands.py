"""`nvrx-eks plan` (wired in by nvrx_eks/cli.py): intervals, spares and goodput for a fleet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from nvrx_eks.kitcore import paths
from nvrx_eks.kitcore.options import path_option

if TYPE_CHECKING:
    from nvrx_eks.planner.calibrate import Calibration
    from nvrx_eks.planner.config import Plan
    from nvrx_eks.planner.model import Projection
    from nvrx_eks.planner.simulate import SimResult
    from nvrx_eks.training.resilience.modes import Mode


def load_plan(
    path: Path | None, overrides: list[str], run_dir: Path | None
) -> tuple[Plan, dict[str, Any], Calibration | None]:
    """The validated plan, the fields the user gave (file + --set), and the calibration if any."""
    from pydantic import ValidationError  # noqa: PLC0415

    from nvrx_eks.kitcore.configio import (  # noqa: PLC0415
        UserError,
        describe_validation_error,
        merge,
        parse_overrides,
        read_yaml,
        stale_input_said,
    )
    from nvrx_eks.planner.calibrate import calibrate  # noqa: PLC0415
    from nvrx_eks.planner.config import Plan  # noqa: PLC0415

    asked = parse_overrides(overrides)
    given = merge(read_yaml(path) if path is not None else {}, asked)
    cal = calibrate(run_dir) if run_dir is not None else None
    data: dict[str, Any] = read_yaml(path) if path is not None else {}
    if path is None:
        if cal is None or cal.scenario is None:
            raise UserError(
                "give a plan file (e.g. planner/examples/llama3-16k-h100.yaml), or --from a folder "
                "holding a `nvrx-eks bench peer` peer.json"
            )
        cal.labels = cal.scenario_labels | cal.labels
    source = str(path) if path is not None else f"plan from {run_dir}"

    def build() -> Plan:
        merged = data
        if cal is not None:
            # peer.json's own scenario as the plan: each mode's own figures, except where --set or a
            # fit against fleet size gives the plan one for every mode.
            merged = merge(data if path is not None else cal.scenario_given(asked), cal.overrides)
        try:
            with stale_input_said():
                return Plan.model_validate(merge(merged, asked))
        except ValidationError as exc:
            raise UserError(describe_validation_error(exc, source=source)) from None

    plan = build()
    if cal is not None and cal.scale:
        # bench scale's recoveries depend on the fleet size, known only once the plan is: evaluate them
        # there and build again. A recovery given with --set stays the user's.
        cal.at_fleet(plan.fleet.nodes, skip={f"recovery.{key}" for key in asked.get("recovery", {})})
        plan = build()
    return plan, given, cal


def _roundtrip_yaml() -> Any:  # noqa: ANN401 - ruamel.yaml.YAML
    # The same round-trip settings as infra/ops/stack_values.py (the planner may not import infra.ops).
    from ruamel.yaml import YAML  # noqa: PLC0415

    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.indent(mapping=2, sequence=4, offset=2)
    return yaml


def _plain(node: Any) -> Any:  # noqa: ANN401 - a ruamel tree
    if isinstance(node, dict):
        return {str(k): _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return node


def _load_values_doc(values_path: Path, yaml: Any) -> Any:  # noqa: ANN401 - ruamel tree
    from ruamel.yaml.error import YAMLError  # noqa: PLC0415

    from nvrx_eks.kitcore.configio import UserError  # noqa: PLC0415

    try:
        doc = yaml.load(values_path.read_text())
    except FileNotFoundError:
        raise UserError(f"--write {values_path}: no such file; pass an existing job values file") from None
    except YAMLError as exc:
        raise UserError(f"--write {values_path}: not valid YAML ({exc})") from None
    if not isinstance(doc, dict):
        raise UserError(f"--write {values_path}: expected a mapping of fields at the top level")
    return doc


def write_values(values_path: Path, plan: Plan, projection: Projection) -> list[str]:
    """Set the trainer's cadences (and the plan's hints) in a job values file, comments kept."""
    from io import StringIO  # noqa: PLC0415

    from pydantic import ValidationError  # noqa: PLC0415
    from ruamel.yaml.comments import CommentedMap  # noqa: PLC0415

    from nvrx_eks.k8s.durable_cost import durable_cadence_warning  # noqa: PLC0415
    from nvrx_eks.k8s.values import JobValues  # noqa: PLC0415
    from nvrx_eks.kitcore.configio import UserError, describe_validation_error  # noqa: PLC0415

    yaml = _roundtrip_yaml()
    doc = _load_values_doc(values_path, yaml)
    values_mode = str(doc.get("mode", JobValues.model_fields["mode"].default))
    mode = next((name for name in projection.modes if name == values_mode), None)
    if mode is None:
        raise UserError(f"--write {values_path}: its mode {values_mode} is not among the plan's modes")
    intervals = projection.modes[mode].intervals
    durable = intervals["durable"].every_steps
    # The trainer's tiered checkpointer persists disk tiers from the memory snapshot: a mode without
    # a memory tier of its own snapshots at the durable cadence (the peer's tiering, bench/peer.py).
    memory = intervals["memory"].every_steps if "memory" in intervals else durable
    local = intervals["local"].every_steps if "local" in intervals else 0
    cadences = {"memory_every": memory, "local_every": local, "durable_every": durable}
    if not isinstance(doc.get("trainer"), dict):
        doc["trainer"] = CommentedMap()
    if not isinstance(doc["trainer"].get("checkpoint"), dict):
        doc["trainer"]["checkpoint"] = CommentedMap()
    changed = []
    for key, value in cadences.items():
        if doc["trainer"]["checkpoint"].get(key) != value:
            doc["trainer"]["checkpoint"][key] = value
            changed.append(f"trainer.checkpoint.{key}={value}")
    hints = CommentedMap()
    hints["step_s"] = plan.workload.step_s
    hints["durable_write_s"] = round(plan.write_s("durable"), 3)
    hints["source"] = f"nvrx-eks plan {plan.name} (mode {mode})"
    doc["plan"] = hints
    changed.append("plan")
    try:
        written = JobValues.model_validate(_plain(doc))
    except ValidationError as exc:
        raise UserError(describe_validation_error(exc, source=f"--write {values_path}")) from None
    # The same check `job render` makes (k8s/durable_cost.py): a fixed durable cadence the plan kept
    # may still undercut the write.
    warning = durable_cadence_warning(written.trainer.checkpoint, hints=written.plan)
    if warning:
        changed.append(f"warning: {warning}")
    buffer = StringIO()
    yaml.dump(doc, buffer)
    values_path.write_text(buffer.getvalue())
    return changed


_PLAN = paths.read_file("plan YAML file", "planner/examples/llama3-16k-h100.yaml")
_FROM = paths.read_folder("run folder", "runs/peer-YYYYMMDD-HHMMSS")
_FROM_HELP = "Calibrate from a run folder (peer.json, summary.json, checkpoint-bench.json, scale.json)."
_OUT = paths.write_folder("PNG plots", "runs/plan-mine")
_WRITE = paths.update_file("job values YAML file", "my-job.yaml")
_WRITE_HELP = "Write the chosen intervals into this job values file (comments kept)."
PlanFile = Annotated[
    Path | None,
    typer.Argument(
        metavar="PLAN_FILE", parser=_PLAN, help="Plan YAML (planner/examples/*.yaml); optional with --from."
    ),
]
FromRun = Annotated[Path | None, path_option("--from", path=_FROM, help=_FROM_HELP)]
PlotFolder = Annotated[
    Path | None, path_option("--out", path=_OUT, help="Folder for the PNG plots (default runs/plan-<name>).")
]
WriteValues = Annotated[Path | None, path_option("--write", path=_WRITE, help=_WRITE_HELP)]


def plan_cmd(  # noqa: PLR0917 - typer maps each option to a parameter
    plan_file: PlanFile = None,
    overrides: Annotated[
        list[str] | None, typer.Option("--set", help="Override a plan field: key.sub=value (repeatable).")
    ] = None,
    run_dir: FromRun = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the plan as JSON instead of tables.")
    ] = False,
    out: PlotFolder = None,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="Write the PNG plots.")] = True,
    simulate: Annotated[
        bool, typer.Option("--simulate/--no-simulate", help="Check the closed form by simulation.")
    ] = True,
    runs: Annotated[int | None, typer.Option(min=1, help="Simulated runs per mode (default 200/20).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the simulation.")] = 0,
    write: WriteValues = None,
) -> None:
    """Checkpoint interval per tier, expected goodput per mode, spares, GPU-hours lost per day."""
    from nvrx_eks.kitcore.console import make_console  # noqa: PLC0415
    from nvrx_eks.planner import report  # noqa: PLC0415
    from nvrx_eks.planner.model import project_all  # noqa: PLC0415
    from nvrx_eks.planner.shrink import compare_all  # noqa: PLC0415

    plan, given, cal = load_plan(plan_file, overrides or [], run_dir)
    projection = project_all(plan)
    shrink = compare_all(plan)
    sims = _simulations(plan, projection, runs=runs, seed=seed) if simulate else {}
    labels = cal.labels if cal else {}
    measured = cal.measured_goodput if cal else {}
    inputs = report.provenance(plan, given=given, labels=labels)
    folder = out or Path("runs") / f"plan-{plan.name}"
    written = _plots(plan, projection, folder, cal) if plots else []
    changed = write_values(write, plan, projection) if write is not None else []
    if as_json:
        doc = report.document(
            projection, sims=sims, measured=measured, inputs=inputs, plots=written, shrink=shrink
        )
        if write is not None:
            doc["written"] = {"values": str(write), "fields": changed}
        print(json.dumps(doc, indent=2, default=str))
        return
    console = make_console()
    report.print_report(console, projection, sims=sims, measured=measured, inputs=inputs, shrink=shrink)
    for path in written:
        console.print(f"plot: {path}")
    if write is not None:
        console.print(f"wrote {write}: {', '.join(changed)}")


def _simulations(plan: Plan, projection: Projection, *, runs: int | None, seed: int) -> dict[Mode, SimResult]:
    """Each feasible mode's seeded simulation at the cadences and spares the closed form chose."""
    from nvrx_eks.planner.simulate import simulate as run_sim  # noqa: PLC0415

    count = runs or (200 if plan.fault_rate() is None else 20)
    sims: dict[Mode, SimResult] = {}
    for mode, result in projection.modes.items():
        if result.feasible:
            cadences = {t: i.every_steps for t, i in result.intervals.items()}
            sims[mode] = run_sim(plan, mode, cadences, spares=result.spares.spares, runs=count, seed=seed)
    return sims


def _plots(plan: Plan, projection: Projection, folder: Path, cal: Calibration | None) -> list[str]:
    """The two PNG plots in `folder`: goodput against the interval, and against the fleet's size."""
    from nvrx_eks.planner import report  # noqa: PLC0415

    folder.mkdir(parents=True, exist_ok=True)
    return [
        str(report.plot_interval(projection, folder / "goodput-vs-interval.png")),
        str(report.plot_fleet(plan, folder / "goodput-vs-fleet.png", fits=cal.fitted if cal else None)),
    ]


def register(*, app: typer.Typer, **_: typer.Typer) -> None:
    """Attach `nvrx-eks plan`."""
    app.command("plan")(plan_cmd)
