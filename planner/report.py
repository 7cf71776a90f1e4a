"""What a plan prints: the rich table, the `--json` document and the PNG plots.

Presentation only: every figure comes from planner/model.py (and planner/simulate.py beside it), so
the numbers a test asserts are the numbers a user reads.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from nvrx_eks.planner.config import SECONDS_PER_DAY, STORE_LOSS_PER_DAY, TIERS, Plan, TierName
from nvrx_eks.planner.model import KINDS, ModeResult, Projection, evaluate, project
from nvrx_eks.training.resilience.modes import MODES, Mode

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from rich.console import Console

    from nvrx_eks.planner.calibrate import ScaleFit
    from nvrx_eks.planner.shrink import ShrinkComparison
    from nvrx_eks.planner.simulate import SimResult

# Where a default comes from when neither the plan file nor a measurement set the field.
DEFAULT_SOURCES = {
    "recovery.inprocess_s": "default: the AWS sample's published in-process recovery (16 H100)",
    "recovery.launcher_s": "default: the AWS sample's published ft_launcher recovery (16 H100)",
    "recovery.job_restart_s": "default: the AWS sample's published restart-from-checkpoint recovery",
    "recovery.node_swap_s": "default: assumed (HyperPod peer restore < 90 s at 2,304 GPUs)",
    "faults.mix": "default: Llama 3 Table 5, mapped onto the kit's classes (planner/config.py)",
    "fleet.repair_hours": "default: assumed (a day to repair or replace a GPU host)",
    "workload.startup_s": "default: not counted",
    "shrink.pending_limit_s": "default: the job values' shrink.pending_limit_s (k8s/sections.py Shrink)",
}
# The inputs the report lists with their source.
REPORTED_INPUTS = (
    "workload.step_s",
    "workload.steps",
    "workload.days",
    "workload.startup_s",
    "faults.count",
    "faults.per_node_day",
    "faults.schedule",
    "faults.mix",
    "faults.store_loss_per_day",
    "recovery.inprocess_s",
    "recovery.launcher_s",
    "recovery.job_restart_s",
    "recovery.node_swap_s",
    "recovery.store_loss_s",
    "checkpoint.copy_gbps",
    "checkpoint.memory.stall_s",
    "checkpoint.local.write_s",
    "checkpoint.local.restore_s",
    "checkpoint.durable.write_s",
    "checkpoint.durable.restore_s",
    "fleet.repair_hours",
    "shrink.min_nodes",
    "shrink.pending_limit_s",
)
MINUTE_S, HOUR_S = 60.0, 3600.0
SWEEP_GPUS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


def _get(tree: Any, dotted: str) -> Any:  # noqa: ANN401 - any plan value
    node = tree
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else getattr(node, part, None)
        if node is None:
            return None
    return node


def _derived(plan: Plan, dotted: str) -> tuple[Any, str] | None:
    """A reported input the plan left unset but derives: its value and how (None: not derived here)."""
    if dotted == "checkpoint.copy_gbps":
        link = plan.fleet.profile.host_link
        if link is None:
            return None
        return link.gbps, f"default: {plan.fleet.instance_profile} host link, {link.derivation}"
    if dotted == "checkpoint.memory.stall_s":
        return plan.stall_s("memory"), "derived: state per GPU / copy bandwidth (the floor)"
    if dotted in {"recovery.store_loss_s", "faults.store_loss_per_day"}:
        return _derived_store(plan, dotted)
    tier = dotted.split(".")[1]
    if not dotted.endswith(".write_s") or plan.checkpoint.tier(tier) is None:  # type: ignore[arg-type]
        return None
    return plan.write_s(tier), "derived: state / bandwidth_gbps"  # type: ignore[arg-type]


def _derived_store(plan: Plan, dotted: str) -> tuple[Any, str] | None:
    """The store loss's recovery and rate when the plan leaves them to their defaults."""
    if dotted == "recovery.store_loss_s":
        return plan.recovery.store_restart_s(), (
            "default: the plan's recovery.job_restart_s (a store loss restarts every pod, as a whole-job "
            "restart does)"
        )
    if plan.faults.per_node_day is None:
        return None  # a count or schedule names its store losses in the mix or the schedule
    return STORE_LOSS_PER_DAY, (
        "default: assumed, no public figure: Llama 3's dependency failures for the whole job (2 in 54 "
        "days, planner/config.py)"
    )


def provenance(plan: Plan, *, given: dict[str, Any], labels: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Each reported input: its value and whether it was measured, given (assumed) or a default."""
    out: dict[str, dict[str, Any]] = {}
    for dotted in REPORTED_INPUTS:
        if dotted == "faults.mix" and plan.faults.schedule is not None:
            continue  # a schedule names each fault's class
        value = _get(plan, dotted)
        if value is None:
            derived = _derived(plan, dotted)
            if derived is None:
                continue
            value, source = derived
        else:
            source = _source(dotted, given=given, labels=labels)
        out[dotted] = {"value": value, "source": source}
    out.update(_mode_inputs(plan, given=given, labels=labels))
    return out


def _source(dotted: str, *, given: dict[str, Any], labels: dict[str, str], labelled_as: str = "") -> str:
    """Where `dotted`'s value came from: the label of `labelled_as` (default: `dotted` itself), the plan
    file, or the default's source."""
    label = labels.get(labelled_as or dotted)
    if label is not None:
        return label
    if _get(given, dotted) is not None:
        return "assumed: plan file"
    return DEFAULT_SOURCES.get(dotted, "default")


def _mode_inputs(plan: Plan, *, given: dict[str, Any], labels: dict[str, str]) -> dict[str, dict[str, Any]]:
    """A mode's own step, first start and recoveries, which take the place of the plan's for that mode."""
    out: dict[str, dict[str, Any]] = {}
    for mode, setup in plan.modes.items():
        own: dict[str, float] = setup.own_workload()
        own |= {f"recovery.{name}": seconds for name, seconds in setup.recovery.items()}
        for key, value in own.items():
            dotted, labelled_as = f"modes.{mode}.{key}", f"modes.*.{key.partition('.')[0]}"
            out[dotted] = {
                "value": value,
                "source": _source(dotted, given=given, labels=labels, labelled_as=labelled_as),
            }
    return out


def document(
    projection: Projection,
    *,
    sims: dict[Mode, SimResult],
    measured: dict[str, float],
    inputs: dict[str, dict[str, Any]],
    plots: list[str],
    shrink: list[ShrinkComparison] | None = None,
) -> dict[str, Any]:
    """The `--json` document: top-level `modes: {MODE: {training_goodput, ...}}` plus the intervals, and
    `shrink` (a list per mode that can shrink) when the plan sets shrink.min_nodes."""
    from nvrx_eks.planner.shrink import rows_doc  # noqa: PLC0415

    plan = projection.plan
    modes: dict[str, Any] = {}
    for mode, result in projection.modes.items():
        row = result.to_dict()
        if mode in sims:
            row["simulated_goodput"] = sims[mode].training_goodput
            row["simulated_runs"] = sims[mode].runs
        if mode in measured:
            row["measured_goodput"] = measured[mode]
        modes[mode] = row
    headline = _headline_mode(projection)
    return {
        "plan": plan.name,
        "fleet": {
            "instance_profile": plan.fleet.instance_profile,
            "nodes": plan.fleet.nodes,
            "gpus": plan.fleet.gpus,
            "state_bytes": plan.workload.total_state_bytes(),
        },
        "intervals_mode": headline,
        "intervals": {t: asdict(i) for t, i in projection.modes[headline].intervals.items()},
        "spares": asdict(projection.modes[headline].spares),
        "modes": modes,
        "shrink": [rows_doc(c) for c in shrink or []],
        "inputs": inputs,
        "plots": plots,
    }


def _headline_mode(projection: Projection) -> Mode:
    return "both" if "both" in projection.modes else next(iter(projection.modes))


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _seconds(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    if value >= HOUR_S:
        return f"{value / HOUR_S:.1f} h"
    if value >= MINUTE_S:
        return f"{value / MINUTE_S:.1f} min"
    return f"{value:.3g} s"


def print_report(
    console: Console,
    projection: Projection,
    *,
    sims: dict[Mode, SimResult],
    measured: dict[str, float],
    inputs: dict[str, dict[str, Any]],
    shrink: list[ShrinkComparison] | None = None,
) -> None:
    plan = projection.plan
    length = (
        f"{plan.workload.steps} steps" if plan.workload.steps is not None else f"{plan.workload.days:g} days"
    )
    if plan.faults.schedule is not None:
        faults = f"{len(plan.faults.schedule)} scheduled faults"
    elif plan.faults.count is not None:
        faults = f"{plan.faults.count} faults per run"
    else:
        faults = (
            f"{plan.faults.per_node_day:.2e} faults per node-day + "
            f"{plan.faults.store_losses_per_day():.3g} store losses per day"
        )
    console.print(
        f"[bold]{plan.name}[/bold]: {plan.fleet.nodes} x {plan.fleet.instance_profile} = "
        f"{plan.fleet.gpus} {'GPUs' if plan.fleet.profile.gpus else 'CPU ranks'}, "
        f"{length} of {plan.workload.step_s:g} s, {faults}, "
        f"state {plan.workload.total_state_bytes() / 1e9:,.1f} GB"
    )
    _print_intervals(console, projection)
    _print_goodput(console, projection, sims=sims, measured=measured)
    _print_fault_costs(console, projection)
    _print_spares(console, projection)
    if shrink:
        print_shrink(console, plan, shrink)
    _print_inputs(console, inputs)


def _print_intervals(console: Console, projection: Projection) -> None:
    from rich.table import Table  # noqa: PLC0415

    intervals = Table(title="Recommended checkpoint interval per tier", title_justify="left")
    intervals.add_column("mode", no_wrap=True, min_width=len("ft_launcher"))
    intervals.add_column("tier", no_wrap=True, min_width=len("durable"))
    intervals.add_column("bound")
    for column in ("every", "interval", "Young/Daly", "write", "stall", "MTBF"):
        intervals.add_column(column, justify="right")
    for mode, result in projection.modes.items():
        for tier in TIERS:
            i = result.intervals.get(tier)
            if i is None:
                continue
            intervals.add_row(
                mode,
                tier,
                i.bound,
                f"{i.every_steps} steps",
                _seconds(i.seconds),
                _seconds(i.young_daly_s),
                _seconds(i.write_s),
                _seconds(i.stall_s),
                _seconds(i.mtbf_s),
            )
    console.print(intervals)
    console.print(
        "bound: what set the interval (young-daly optimum, write time of an async tier, one step, memory "
        "cadence, max interval: no fault restores from the tier, fixed by the plan); MTBF: between the "
        "faults that restore from the tier"
    )
    for mode, result in projection.modes.items():
        for tier, i in result.intervals.items():
            if i.note:
                console.print(f"[yellow]{mode} {tier}: every {i.every_steps} steps is {i.note}[/yellow]")


def _goodput_cells(r: ModeResult) -> list[str]:
    return [
        f"[bold]{r.training_goodput:.1%}[/bold]",
        _pct(r.badput["checkpoint_stall"]),
        _pct(r.badput["lost_work"]),
        _pct(r.badput["recovery"]),
        _pct(r.badput["capacity_wait"]),
        _pct(r.badput["startup"]),
        f"{r.gpu_hours_lost_per_day:,.0f}",
    ]


def _print_goodput(
    console: Console, projection: Projection, *, sims: dict[Mode, SimResult], measured: dict[str, float]
) -> None:
    from rich.table import Table  # noqa: PLC0415

    table = Table(title="Expected training goodput per mode", title_justify="left")
    table.add_column("mode", no_wrap=True, min_width=len("ft_launcher"))
    columns = ["goodput", "ckpt stall", "lost work", "recovery", "capacity wait", "startup", "GPU-h lost/day"]
    if sims:
        columns.append("simulated")
    if measured:
        columns.append("measured")
    for column in columns:
        table.add_column(column, justify="right")
    for mode, r in projection.modes.items():
        if not r.feasible:
            table.add_row(f"[red]{mode} (faults outpace progress)[/red]", *["-"] * (len(columns)))
            continue
        cells = _goodput_cells(r)
        if sims:
            sim = sims.get(mode)
            cells.append("-" if sim is None else f"{sim.training_goodput:.1%}")
        if measured:
            cells.append(_pct(measured.get(mode)))
        table.add_row(mode, *cells)
    console.print(table)


def _print_fault_costs(console: Console, projection: Projection) -> None:
    """What one fault of each kind costs in the headline mode: the layer, the tier it restores from."""
    from rich.table import Table  # noqa: PLC0415

    mode = _headline_mode(projection)
    result = projection.modes[mode]
    table = Table(title=f"What one fault costs ({mode})", title_justify="left")
    table.add_column("kind", no_wrap=True, min_width=len("process"))
    table.add_column("layer", no_wrap=True, min_width=len("store_restart"))
    table.add_column("restores from", no_wrap=True)
    for column in ("per run", "recovery", "restore", "lost work", "capacity wait", "each"):
        table.add_column(column, justify="right")
    for kind in KINDS:
        cost = result.fault_costs.get(kind)
        if cost is None:
            continue
        table.add_row(
            kind,
            cost.layer,
            cost.tier or "- (in place)",
            f"{result.faults.get(kind, 0.0):.3g}",
            _seconds(cost.recovery_s),
            _seconds(cost.restore_s),
            _seconds(cost.lost_s),
            _seconds(cost.wait_s),
            _seconds(cost.total_s),
        )
    console.print(table)


def _print_spares(console: Console, projection: Projection) -> None:
    plan = projection.plan
    spares = projection.modes[_headline_mode(projection)].spares
    warn = (
        f" [yellow]below the {spares.recommended} recommended: the capacity-wait figure is optimistic "
        "(see the simulation)[/yellow]"
        if spares.spares < spares.recommended
        else ""
    )
    console.print(
        f"spares: {spares.spares} ({spares.source}; {spares.recommended} for {plan.fleet.spare_target:.0%} "
        f"never waiting): {spares.mean_out:.2f} nodes out for repair on average, "
        f"{spares.node_losses:.1f} node losses per run, P(no spare at a loss) {spares.p_no_spare:.1e}, "
        f"P(never waiting) {spares.p_never_wait:.1%}{warn}"
    )


def print_shrink(console: Console, plan: Plan, comparisons: list[ShrinkComparison]) -> None:
    """Goodput waiting for a lost node's replacement against shrinking, per replacement delay."""
    from rich.table import Table  # noqa: PLC0415

    first = comparisons[0]
    table = Table(title="Shrink instead of waiting for a lost node's replacement", title_justify="left")
    table.add_column("mode", no_wrap=True, min_width=len("ft_launcher"))
    for column in ("replacement in", "wait", "shrink", "per loss, waiting", "per loss, shrinking", "better"):
        table.add_column(column, justify="right")
    for comparison in comparisons:
        for row in comparison.rows:
            table.add_row(
                comparison.mode,
                _seconds(row.delay_s),
                # Two decimals: a node loss is rare beside a run's steps, so the strategies differ there.
                f"{row.wait.training_goodput:.2%}" if row.wait.feasible else "-",
                f"{row.shrink.training_goodput:.2%}" if row.shrink.feasible else "-",
                _seconds(row.wait_per_loss_s),
                _seconds(row.shrink_per_loss_s),
                row.better,
            )
    console.print(table)
    console.print(
        f"a node lost with no spare free: {first.nodes} -> {first.shrunk_nodes} nodes "
        f"(shrink.min_nodes {plan.shrink.min_nodes}) after {_seconds(first.pending_limit_s)} pending"
    )
    console.print(
        "goodput: expected training goodput with every node loss that finds no spare handled that way; "
        "per loss: the whole job's time one such loss costs (idle, restart rounds, restores, lost "
        "work, training below full size)"
    )
    for comparison in comparisons:
        even = comparison.break_even_s
        where = (
            f"shrinking wins once a replacement takes longer than {_seconds(even)}"
            if even is not None
            else "waiting wins at every delay up to a month"
        )
        console.print(
            f"{comparison.mode}: {where} (break-even); {comparison.node_losses:.3g} node losses per run, "
            f"{comparison.spares} spare(s)"
        )


def _print_inputs(console: Console, inputs: dict[str, dict[str, Any]]) -> None:
    from rich.table import Table  # noqa: PLC0415

    sources = Table(title="Inputs and where they come from", title_justify="left")
    sources.add_column("field", no_wrap=True)
    sources.add_column("value", justify="right")
    sources.add_column("source")
    for dotted, item in inputs.items():
        value = item["value"]
        if isinstance(value, float):
            text = f"{value:.4g}"
        elif isinstance(value, dict):
            text = ", ".join(f"{k} {v:.2f}" for k, v in value.items())
        elif isinstance(value, list):
            text = ", ".join(str(v) for v in value)
        else:
            text = str(value)
        colour = "green" if item["source"].startswith("measured") else "default"
        sources.add_row(dotted, text, f"[{colour}]{item['source']}[/{colour}]")
    console.print(sources)


# ---- plots ----------------------------------------------------------------------------------------------
def plot_interval(projection: Projection, out: Path) -> Path:
    """Goodput against the durable interval, one line per mode (other tiers at their recommendation)."""
    import matplotlib as mpl  # noqa: PLC0415 - heavy, and only the plots need it

    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    plan = projection.plan
    step = plan.workload.step_s
    figure, axis = plt.subplots(figsize=(9, 5))
    longest = plan.useful_s or plan.workload.days * SECONDS_PER_DAY  # type: ignore[operator]
    for mode, result in projection.modes.items():
        tier: TierName = "durable"
        chosen = result.intervals[tier]
        memory = result.intervals.get("memory")
        multiple = memory.every_steps if (memory is not None and tier != "memory") else 1
        top = max(chosen.every_steps * 30, 100 * multiple)
        grid = sorted(
            {
                max(multiple, round(10 ** (k / 12) / multiple) * multiple)
                for k in range(int(12 * math.log10(max(top, 2))) + 1)
            }
        )
        grid = [n for n in grid if n * step <= longest]
        xs, ys = [], []
        for every in grid:
            cadences = {t: i.every_steps for t, i in result.intervals.items()}
            cadences[tier] = every
            r = evaluate(plan, mode, cadences)
            if r.feasible:
                xs.append(every * step)
                ys.append(r.training_goodput)
        (line,) = axis.plot(xs, ys, label=mode)
        axis.plot([chosen.seconds], [result.training_goodput], "o", color=line.get_color())
    axis.set_xscale("log")
    axis.set_xlabel("durable checkpoint interval (s)")
    axis.set_ylabel("expected training goodput")
    axis.set_title(f"{plan.name}: goodput against the durable interval (dot: the plan's interval)")
    axis.grid(visible=True, which="both", alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out


def scale_plan(
    plan: Plan, gpus: int, *, wall_s: float | None = None, recovery: Mapping[str, float] | None = None
) -> Plan:
    """The same plan on a fleet of `gpus` GPUs (spares sized by the plan), faults as a rate, and each
    `recovery.*` field in `recovery` at its value for this size.

    A count per run becomes the rate it is on this plan's own fleet over `wall_s` (the mode's projected
    wall time), so the sweep passes through the plan's own figure at its own size: per node for the
    per-node classes, per job for store losses (one store whatever the fleet)."""
    nodes = max(1, gpus // plan.fleet.profile.workers_per_node)
    faults = plan.faults
    if faults.per_node_day is None:
        count = faults.count if faults.count is not None else len(faults.schedule or [])
        days = (wall_s or plan.useful_s or 0.0) / SECONDS_PER_DAY
        mix = faults.mix
        if faults.schedule is not None:
            classes = [cls for cls, _ in faults.scheduled()]
            mix = {cls: classes.count(cls) / len(classes) for cls in set(classes)} if classes else mix
        store = mix.get("store_loss", 0.0)
        per_node = {cls: share for cls, share in mix.items() if cls != "store_loss"}
        faults_update = {
            "count": None,
            "schedule": None,
            "per_node_day": count * (1 - store) / (plan.fleet.nodes * days) if days else 0.0,
            # A plan of store losses only has no per-node faults: its rate is 0, whatever the mix names.
            "mix": per_node or {"node_loss": 1.0},
            "store_loss_per_day": count * store / days if days else 0.0,
        }
        faults = faults.model_copy(update=faults_update)
    fleet = plan.fleet.model_copy(update={"nodes": nodes, "spares": None})
    update: dict[str, Any] = {"fleet": fleet, "faults": faults}
    if recovery:
        fields = {dotted.removeprefix("recovery."): seconds for dotted, seconds in recovery.items()}
        update["recovery"] = plan.recovery.model_copy(update=fields)
    return plan.model_copy(update=update)


@dataclass(frozen=True)
class FleetSweep:
    """The fleet-size plot's series, as drawn: goodput per mode at each size, and where each size's
    recovery came from."""

    goodput: dict[Mode, list[tuple[int, float]]]
    recovery: dict[str, list[tuple[int, float]]]
    """A fitted recovery field (recovery.*) -> (GPUs, seconds) it was evaluated to at each size; empty:
    every size holds the plan's recovery."""
    measured_gpus: tuple[int, int] | None
    """The GPUs of the smallest and largest size bench scale ran (its nodes x this plan's GPUs per
    node): recovery there is measured, elsewhere extrapolated. None without a fit."""
    caption: str


def fleet_sweep(plan: Plan, fits: Mapping[str, ScaleFit] | None = None) -> FleetSweep:
    """Goodput per mode from 8 to 32,768 GPUs, intervals and spares re-planned per size; each fitted
    recovery (`fits`: bench scale's a + b*log2(nodes), the ones the plan took) evaluated at every size."""
    gpn = plan.fleet.profile.workers_per_node
    sizes = sorted({g for g in (*SWEEP_GPUS, plan.fleet.gpus) if g >= gpn})
    fits = dict(fits or {})

    def recovery_at(gpus: int) -> dict[str, float]:
        nodes = max(1, gpus // gpn)
        return {dotted: round(fit.at(nodes), 3) for dotted, fit in fits.items()}

    goodput: dict[Mode, list[tuple[int, float]]] = {}
    for mode in MODES:
        if mode not in plan.modes:
            continue
        own = project(plan, mode)
        wall = own.wall_s if own.feasible else None
        for gpus in sizes:
            result = project(scale_plan(plan, gpus, wall_s=wall, recovery=recovery_at(gpus)), mode)
            goodput.setdefault(mode, []).append((gpus, result.training_goodput if result.feasible else 0.0))
    recovery = {dotted: [(g, recovery_at(g)[dotted]) for g in sizes] for dotted in fits}
    if not fits:
        return FleetSweep(
            goodput, {}, None, "recovery per layer: the plan's, held at every size (no bench scale fit)"
        )
    low = min(f.nodes[0] for f in fits.values())
    high = max(f.nodes[-1] for f in fits.values())
    names = ", ".join(d.removeprefix("recovery.") for d in fits)
    caption = (
        f"recovery re-evaluated at each size: {names} = a + b*log2(nodes), fitted to bench scale at "
        f"{low}-{high} nodes ({low * gpn:,}-{high * gpn:,} GPUs, shaded: measured), extrapolated beyond; "
        "other layers the plan's at every size"
    )
    return FleetSweep(goodput, recovery, (low * gpn, high * gpn), caption)


def plot_fleet(plan: Plan, out: Path, *, fits: Mapping[str, ScaleFit] | None = None) -> Path:
    """Goodput against fleet size from 8 to 32,768 GPUs, one line per mode; with bench scale's fits,
    the recovery each size used on a second axis and the sizes it measured shaded."""
    import matplotlib as mpl  # noqa: PLC0415

    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    sweep = fleet_sweep(plan, fits)
    figure, axis = plt.subplots(figsize=(9, 5.5))
    for mode, points in sweep.goodput.items():
        axis.plot([g for g, _ in points], [y for _, y in points], marker=".", label=mode)
    axis.axvline(plan.fleet.gpus, color="grey", linestyle="--", linewidth=1, label="the plan's fleet")
    if sweep.measured_gpus is not None:
        axis.axvspan(
            *sweep.measured_gpus, color="tab:green", alpha=0.12, label="recovery measured (bench scale)"
        )
        seconds = axis.twinx()
        for dotted, points in sweep.recovery.items():
            seconds.plot(
                [g for g, _ in points],
                [y for _, y in points],
                linestyle=":",
                color="black",
                linewidth=1,
                alpha=0.6,
            )
            gpus, last = points[-1]
            seconds.annotate(
                dotted.removeprefix("recovery."), (gpus, last), fontsize=7, ha="right", va="bottom"
            )
        seconds.set_ylabel("fitted recovery (s, dotted)")
    axis.set_xscale("log", base=2)
    axis.set_xlabel("GPUs")
    axis.set_ylabel("expected training goodput (intervals and spares re-planned per size)")
    axis.set_title(f"{plan.name}: goodput against fleet size")
    axis.grid(visible=True, which="both", alpha=0.3)
    axis.legend(fontsize=8, loc="lower left")
    figure.text(0.01, 0.01, sweep.caption, fontsize=7, wrap=True)
    figure.tight_layout(rect=(0, 0.05, 1, 1))
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out
