"""`nvrx-eks bench scale`: what each recovery costs as the job grows, phase by phase.

The local job (the rendered chart, run by the local executor, as `bench peer` runs it) at each node
count, one CPU rank per node (`instance_profile: local-cpu-1`: 8 nodes of 2 ranks would be 16 processes
on this machine's cores), with the scale model of `bench peer` (each step holds the host for an
emulated device time). Every size gets the same fixed plan, one fault per layer:

- `exception` on rank 0 (the in-process restart),
- `sigkill` on rank 1 (ft_launcher's restart of that node's workers),
- `node_loss` of the last node (the Job controller's replacement pod, state from a partner's RAM),
- `store_loss` (the rendezvous store's pod deleted: NVRx 0.7's launchers do not reconnect, so every pod
  fails and the Job restarts them all from the node-local disk; placed right after a local checkpoint).

Every figure comes from the runs' own event streams (`localrun.summary.summarize`); a row is one fault
at one size, with its recovery phases (`localrun.summary.FaultPhases`).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from nvrx_eks.bench.peer import DEFAULT_DEVICE_STEP_S
from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.kitcore.runtime import runtime_versions
from nvrx_eks.localrun.chaos import reference_trainer

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from rich.table import Table

    from nvrx_eks.localrun.summary import FaultSummary

DEFAULT_NODES = (2, 4, 8)
DEFAULT_STEPS = 50
MEMORY_EVERY = 2
"""RAM snapshots every 2 steps (the local job's cadence): a hard fault loses at most this many steps."""
PROFILE = "local-cpu-1"
# (class, step, rank): the rank of the node loss is the last one, filled in per size.
PLAN = (("exception", 10, 0), ("sigkill", 20, 1), ("node_loss", 30, None), ("store_loss", 41, 0))
# The goals for node loss and SIGKILL: a node loss recovered within NODE_LOSS_GOAL_S at the largest size,
# and each class's recovery there at most GROWTH_GOAL times the smallest size's.
NODE_LOSS_GOAL_S = 10.0
GROWTH_GOAL = 2.0
GROWTH_CLASSES = ("node_loss", "sigkill")


def parse_nodes(text: str) -> list[int]:
    """`2,4,8` -> [2, 4, 8]; each count at least 2 (the SIGKILL's rank 1 and the lost node's partner)."""
    counts: list[int] = []
    for item in text.split(","):
        try:
            count = int(item.strip())
        except ValueError:
            count = 0
        if count < 2:
            raise UserError(
                f"--nodes {text!r}: {item.strip()!r} is not a node count of 2 or more; "
                "pass comma-separated counts, e.g. --nodes 2,4,8"
            )
        counts.append(count)
    return sorted(set(counts))


def fault_plan(nodes: int) -> str:
    """The `trainer.faults.plan` of one size (1 rank per node: the last rank is the last node's)."""
    return ",".join(f"{cls}@{step}:{nodes - 1 if rank is None else rank}" for cls, step, rank in PLAN)


def overrides(*, nodes: int, steps: int, device_step_s: float) -> tuple[str, ...]:
    """Job-value overrides of one size: only the node count and the plan's last rank differ."""
    if steps <= PLAN[-1][1]:
        last = PLAN[-1][1]
        raise UserError(
            f"--steps {steps}: the plan's last fault is at step {last}; pass --steps {last + 1} or more"
        )
    return (
        f"num_nodes={nodes}",
        f"instance_profile={PROFILE}",
        *reference_trainer(steps=steps, emulated_device_step_s=device_step_s),
        f"trainer.checkpoint.memory_every={MEMORY_EVERY}",
        f"trainer.faults.plan={fault_plan(nodes)}",
    )


def scale_rows(nodes: int, faults: Sequence[FaultSummary], *, memory_every: int) -> list[dict[str, Any]]:
    """One row per planned class at this size; a class the run never measured is a row that did not
    recover (recovery, phases and steps lost unknown)."""
    rows = []
    for cls, _, _ in PLAN:
        fault = next((f for f in faults if f.cls == cls), None)
        phases = None if fault is None else fault.phases
        rows.append(
            {
                "nodes": nodes,
                "class": cls,
                "recovery_s": None if fault is None else fault.recovery_s,
                "phases": None if phases is None else {**asdict(phases), "total_s": phases.total_s},
                "steps_lost": None if fault is None else fault.steps_lost,
                "memory_every": memory_every,
                # Recovered by the layer that must recover it, and back to productive steps.
                "recovered": fault is not None
                and fault.recovery_s is not None
                and fault.layer == fault.expected_layer,
                "layer": None if fault is None else fault.layer,
                "tier": None if fault is None else fault.tier,
            }
        )
    return rows


def goals(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Node loss at the largest size <= 10 s; largest over smallest recovery <= 2x for node loss and
    SIGKILL. A goal is None where its sizes were not run or did not recover."""
    sizes = sorted({r["nodes"] for r in rows})
    by_key = {(r["nodes"], r["class"]): r["recovery_s"] for r in rows}
    result: dict[str, Any] = {
        "largest": sizes[-1] if sizes else None,
        "smallest": sizes[0] if sizes else None,
    }
    largest_loss = by_key.get((sizes[-1], "node_loss")) if sizes else None
    result["node_loss_s"] = largest_loss
    result["node_loss_met"] = None if largest_loss is None else largest_loss <= NODE_LOSS_GOAL_S
    for cls in GROWTH_CLASSES:
        small = by_key.get((sizes[0], cls)) if len(sizes) > 1 else None
        large = by_key.get((sizes[-1], cls)) if len(sizes) > 1 else None
        ratio = None if not small or large is None else large / small
        result[f"{cls}_growth"] = ratio
        result[f"{cls}_growth_met"] = None if ratio is None else ratio <= GROWTH_GOAL
    return result


def run_scale_bench(
    *,
    values_path: Path,
    nodes: Sequence[int],
    runs_root: Path,
    json_out: Path | None = None,
    steps: int = DEFAULT_STEPS,
    device_step_s: float = DEFAULT_DEVICE_STEP_S,
    timeout_s: float = 900.0,
) -> dict[str, Any]:
    """Run each size one after another; print the table; write the JSON and the PNG beside it."""
    from nvrx_eks.k8s.load import load_values  # noqa: PLC0415
    from nvrx_eks.kitcore.console import make_console  # noqa: PLC0415
    from nvrx_eks.localrun.chaos import run_job  # noqa: PLC0415
    from nvrx_eks.localrun.report import print_phases  # noqa: PLC0415
    from nvrx_eks.localrun.summary import summarize  # noqa: PLC0415

    console = make_console()
    bench_dir = (runs_root / time.strftime("scale-%Y%m%d-%H%M%S")).resolve()
    # Every size's values are checked before the first run: a bad file is one message at once.
    planned = [
        (count, load_values(values_path, overrides(nodes=count, steps=steps, device_step_s=device_step_s)))
        for count in nodes
    ]
    rows: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    for count, values in planned:
        label = f"{count} nodes"
        console.rule(f"{label} x 1 rank: {fault_plan(count)}")
        outcome = run_job(
            values, run_dir=bench_dir / f"nodes-{count}", console=console, label=label, timeout_s=timeout_s
        )
        try:
            summary = summarize(outcome.trainer_run_dir)
        except ValueError:  # the job never got a trainer running: nothing to measure
            console.print(f"[red]{label}: no trainer events ({outcome.job.reason})[/red]")
            faults: list[FaultSummary] = []
            completed = False
        else:
            faults = summary.faults
            completed = outcome.job.succeeded and summary.completed
            print_phases(console, [f.to_dict() for f in faults])
        rows.extend(scale_rows(count, faults, memory_every=MEMORY_EVERY))
        runs.append(
            {
                "nodes": count,
                "completed": completed,
                "reason": outcome.job.reason,
                "wall_s": outcome.job.wall_s,
                "run_dir": str(bench_dir / f"nodes-{count}"),
            }
        )
    document = {
        "scenario": {
            "steps": steps,
            "emulated_device_step_s": device_step_s,
            "ranks_per_node": 1,
            "instance_profile": PROFILE,
            "plan": [{"class": c, "step": s, "rank": "last" if r is None else r} for c, s, r in PLAN],
            "memory_every": MEMORY_EVERY,
            "topology": "N nodes x 1 CPU rank (gloo), tiny model, local executor",
        },
        "rows": rows,
        "runs": runs,
        "goals": goals(rows),
        "versions": runtime_versions(),
    }
    console.print(scale_table(rows, steps=steps, device_step_s=device_step_s))
    console.print(goals_line(goals(rows)))
    out = json_out or bench_dir / "scale.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    png = plot_scale(rows, out.with_suffix(".png"))
    console.print(f"scale JSON: {out}\nscale PNG: {png}")
    return document


def goals_line(result: dict[str, Any]) -> str:
    def verdict(met: bool | None) -> str:
        return "not measured" if met is None else ("PASS" if met else "FAIL")

    def fmt(value: float | None, unit: str) -> str:
        return "-" if value is None else f"{value:.2f}{unit}"

    size = f"{result['largest']} nodes"
    loss = (
        f"node loss at {size} <= {NODE_LOSS_GOAL_S:g} s: {verdict(result['node_loss_met'])} "
        f"({fmt(result['node_loss_s'], ' s')})"
    )
    growth = [
        f"{cls} {result['largest']}/{result['smallest']} nodes <= {GROWTH_GOAL:g}x: "
        f"{verdict(result[f'{cls}_growth_met'])} ({fmt(result[f'{cls}_growth'], 'x')})"
        for cls in GROWTH_CLASSES
    ]
    parts = [loss, *growth]
    return "goals: " + "; ".join(parts)


def scale_table(rows: Sequence[dict[str, Any]], *, steps: int, device_step_s: float) -> Table:
    """A row per fault per size: recovery, its phases, steps lost, the layer and whether it recovered."""
    from rich.table import Table  # noqa: PLC0415

    from nvrx_eks.localrun.report import PHASE_COLUMNS  # noqa: PLC0415

    table = Table(
        title=f"Recovery against nodes (1 CPU rank each): {steps} steps, {device_step_s:g} s emulated "
        f"device time each, RAM snapshots every {MEMORY_EVERY} steps"
    )
    table.add_column("nodes", justify="right")
    table.add_column("class", no_wrap=True, min_width=len("exception"))
    table.add_column("layer", no_wrap=True, min_width=len("job_controller"))
    table.add_column("tier", no_wrap=True, min_width=len("peer_memory"))
    table.add_column("recovery", justify="right")
    for _, header in PHASE_COLUMNS:
        table.add_column(header, justify="right")
    table.add_column("steps lost", justify="right")
    table.add_column("recovered", justify="center")
    for row in rows:
        phases = row["phases"]
        table.add_row(
            str(row["nodes"]),
            row["class"],
            row["layer"] or "-",
            row["tier"] or "-",
            "-" if row["recovery_s"] is None else f"{row['recovery_s']:.1f} s",
            *(f"{phases[key]:.1f}" if phases else "-" for key, _ in PHASE_COLUMNS),
            "-" if row["steps_lost"] is None else str(row["steps_lost"]),
            "yes" if row["recovered"] else "[red]NO[/red]",
        )
    return table


def plot_scale(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """Stacked bars of recovery by phase: a group per node count, a bar per class in it."""
    import matplotlib as mpl  # noqa: PLC0415 - heavy, and only the bench's end needs it

    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.patches import Patch  # noqa: PLC0415

    from nvrx_eks.localrun.report import PHASE_NAMES  # noqa: PLC0415

    sizes = sorted({r["nodes"] for r in rows})
    classes = [cls for cls, _, _ in PLAN]
    width = 0.8 / len(classes)
    figure, axis = plt.subplots(figsize=(max(6.0, 2.5 * len(sizes)), 4.5))
    ticks: list[float] = []
    labels: list[str] = []
    for group, size in enumerate(sizes):
        for slot, cls in enumerate(classes):
            x = group + (slot - (len(classes) - 1) / 2) * width
            ticks.append(x)
            labels.append(cls.replace("_", " "))
            row = next((r for r in rows if r["nodes"] == size and r["class"] == cls), None)
            if row is None or row["phases"] is None:
                axis.text(x, 0, "n/a", ha="center", va="bottom", fontsize=7, color="red")
                continue
            bottom = 0.0
            for key, (_, colour) in PHASE_NAMES.items():
                axis.bar(x, row["phases"][key], width * 0.9, bottom=bottom, color=colour)
                bottom += row["phases"][key]
    axis.set_xticks(ticks, labels, rotation=45, ha="right", fontsize=7)
    # The node counts under their groups, below the class labels.
    for group, size in enumerate(sizes):
        axis.annotate(
            f"{size} nodes",
            xy=(group, 0),
            xycoords=("data", "axes fraction"),
            xytext=(0, -62),
            textcoords="offset points",
            ha="center",
            fontsize=9,
            fontweight="bold",
        )
    axis.set_ylabel("recovery (s), fault -> next productive step")
    axis.set_title("Recovery by phase against nodes (1 CPU rank per node)")
    axis.legend(
        [Patch(color=colour) for _, colour in PHASE_NAMES.values()],
        [name for name, _ in PHASE_NAMES.values()],
        fontsize=7,
        loc="upper left",
    )
    figure.tight_layout()
    figure.subplots_adjust(bottom=0.3)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
