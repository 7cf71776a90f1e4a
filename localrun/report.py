"""What a run cost, for people and for tools: the fault table, `summary.json` and a PNG timeline.

Everything here is derived from the run's event streams through `localrun.summary.summarize`; the
report adds presentation only, so the numbers a test asserts are the numbers a user reads.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from nvrx_eks.kitcore.configio import UserError, read_json, validate_file
from nvrx_eks.kitcore.runtime import runtime_versions
from nvrx_eks.training.events import read_events

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rich.console import Console

    from nvrx_eks.localrun.summary import RunSummary

# The keys other tools read from summary.json (issue: "summary.json keys").
SUMMARY_KEYS = (
    "mode",
    "steps",
    "faults",
    "training_goodput",
    "infra_goodput",
    "checkpoint_efficiency",
    "stall_ratio",
    "final_params_sha256",
    "fault_free_params_sha256",
)
FAULT_KEYS = ("class", "step", "rank", "layer", "detect_s", "recovery_s", "steps_lost", "tier", "phases")
"""Each fault row of summary.json: `tier` is where the state came back from (memory, peer_memory, local,
durable, none; the slowest rank's), `phases` the seconds from the fault to the next productive step as
{detect_s, teardown_s, rendezvous_s, start_s, restore_s, first_step_s} (localrun.summary.FaultPhases),
or null when the run ended before every rank trained again."""


class _FaultRow(BaseModel):
    """The fields of a summary.json fault row the page shows (FAULT_KEYS)."""

    model_config = ConfigDict(extra="allow")
    fault_class: str = Field(alias="class")
    step: int
    rank: int | None
    layer: str | None
    detect_s: float | None
    recovery_s: float | None
    steps_lost: int | None


class _SummaryShape(BaseModel):
    """What report.html reads from summary.json (SUMMARY_KEYS), checked before it is read."""

    model_config = ConfigDict(extra="allow")
    mode: str
    steps: int
    faults: list[_FaultRow]
    training_goodput: float
    infra_goodput: float
    checkpoint_efficiency: float
    stall_ratio: float | None
    final_params_sha256: str | None
    fault_free_params_sha256: str | None
    bit_identical: bool


def summary_document(
    summary: RunSummary, *, fault_free_sha256: str | None, ran: dict[str, str] | None = None
) -> dict[str, Any]:
    """summary.json: the stable keys first, then the run's other figures for whoever wants them. `ran`:
    what the run was ({"entrypoint": ..., "values": ...}, as `nvrx-eks demo` knows it)."""
    full = summary.to_dict()
    faults = [{key: fault[key] for key in FAULT_KEYS} | fault for fault in full.pop("faults")]
    document: dict[str, Any] = {
        "mode": full.pop("mode"),
        "steps": full.pop("steps"),
        "faults": faults,
        "training_goodput": full.pop("training_goodput"),
        "infra_goodput": full.pop("infra_goodput"),
        "checkpoint_efficiency": full.pop("checkpoint_efficiency"),
        "stall_ratio": full.pop("stall_ratio"),
        "final_params_sha256": full.pop("final_params_sha256"),
        "fault_free_params_sha256": fault_free_sha256,
    }
    document["bit_identical"] = (
        fault_free_sha256 is not None and document["final_params_sha256"] == fault_free_sha256
    )
    document["versions"] = runtime_versions()
    if ran:
        document["ran"] = dict(ran)
    return document | full


def ran_line(document: dict[str, Any]) -> str:
    """What ran, in one line, so that two reports of two scripts are told apart: the entry point, its
    values file, the model and its size."""
    ran = document.get("ran") or {}
    parts = [
        ran.get("entrypoint")
        or (f"the reference trainer, model {document['model']}" if document.get("model") else "")
    ]
    if ran.get("values"):
        parts.append(f"values {ran['values']}")
    size = []
    if document.get("num_parameters"):
        size.append(f"{document['num_parameters']:,} parameters")
    if document.get("state_bytes"):
        size.append(f"{document['state_bytes'] / 1e6:.1f} MB of state per rank")
    parts.append(", ".join(size))
    return "; ".join(p for p in parts if p)


def write_summary(run_dir: Path, document: dict[str, Any]) -> Path:
    path = run_dir / "summary.json"
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return path


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


FLEET_PLAN = Path(__file__).resolve().parents[1] / "planner" / "examples" / "llama3-16k-h100.yaml"
"""The plan a run's recoveries are projected onto for a real job's figures (`nvrx-eks plan --from`): the
planner's example, beside this part in a checkout and in an install alike (no import: the planner is a
sibling of the local run, not below it)."""


def totals_in_scale(document: dict[str, Any], run_dir: Path | None = None) -> list[str]:
    """What a run's totals measure, in sentences: the run's own scale (steps, step time, faults per
    second, state), why its goodput and stall ratio read as they do, and the command that projects the
    same recoveries onto a real job's fault rates."""
    faults, wall, step = len(document["faults"]), document.get("wall_s"), document.get("mean_step_s")
    lines = []
    if wall and step:
        every = f" (one every {wall / faults:.1f} s)" if faults else ""
        recovery = document.get("recovery_s")
        spent = f"; recoveries took {recovery:.1f} s of it" if recovery is not None else ""
        lines.append(
            f"These totals measure this run: {document['steps']} steps of {step * 1e3:.0f} ms, "
            f"{faults} faults in {wall:.1f} s{every}{spent}."
        )
    if faults:
        lines.append(
            "Goodput is productive step time over wall time: a few fixed seconds per recovery against a "
            "run this short keep it low. A real job meets faults hours apart, not seconds."
        )
    per_call, floor = document.get("stall_per_checkpoint_s"), document.get("stall_floor_s")
    if per_call is not None and floor:
        lines.append(
            f"stall / floor is the loop's {per_call * 1e3:.1f} ms per checkpoint against "
            f"{floor * 1e3:.2f} ms, "
            "one copy of this run's state at the host's measured copy bandwidth: with a state this small the "
            "per-call work dominates (`nvrx-eks bench checkpoint` measures it at real state sizes)."
        )
    source = run_dir if run_dir is not None else Path("RUN_DIR")
    lines.append(
        "A real job's figures from these recoveries, at a fleet's fault rates: "
        f"`nvrx-eks plan {_shown(FLEET_PLAN)} --from {_shown(source)}`."
    )
    return lines


def _shown(path: Path) -> str:
    """`path` relative to the working folder when it is below it (shorter to copy), else as given."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def numerics_line(numerics: dict[str, Any]) -> str:
    """The measured difference from the fault-free run, in one phrase."""
    difference = numerics.get("difference") or {}
    if not difference:
        return "no final parameters kept to compare"
    return (
        f"max |diff| {difference['max_abs_diff']:.3g}, relative L2 {difference['relative_l2']:.3g} "
        f"({difference['differing']} of {difference['tensors']} tensors differ)"
    )


def _identity_verdict(identical: bool, numerics: dict[str, Any]) -> str:
    if identical:
        return "[green]yes[/green]"
    if numerics.get("explained"):
        return f"[yellow]no, as expected: {numerics_line(numerics)}[/yellow]"
    return f"[red]no{': ' + numerics_line(numerics) if numerics.get('difference') else ''}[/red]"


def print_report(console: Console, document: dict[str, Any], run_dir: Path | None = None) -> None:
    """One row per fault, then the run's totals and what they measure (`run_dir`: the run's folder, for
    the planner's command line)."""
    from rich.table import Table  # noqa: PLC0415

    what = ran_line(document)
    if what:
        console.print(f"ran: {what}", markup=False, highlight=False)
    faults = Table(title=f"Faults ({document['mode']}, {document['steps']} steps)", title_justify="left")
    # Names never wrap (an 80-column terminal still shows them whole); numbers' headers may.
    for column in ("class", "recovered by"):
        faults.add_column(column, no_wrap=True)
    for column in ("step", "rank", "detect", "recovery", "steps lost"):
        faults.add_column(column, justify="right")
    for fault in document["faults"]:
        layer, expected = fault["layer"], fault.get("expected_layer", fault["layer"])
        if layer != expected:
            layer = f"[red]{layer} (not {expected})[/red]"
        faults.add_row(
            fault["class"],
            layer,
            str(fault["step"]),
            str(fault["rank"]),
            _seconds(fault["detect_s"]),
            _seconds(fault["recovery_s"]),
            "-" if fault["steps_lost"] is None else str(fault["steps_lost"]),
        )
    console.print(faults)
    print_phases(console, document["faults"])

    totals = Table(title="Run totals", title_justify="left", show_header=False)
    totals.add_column("figure")
    totals.add_column("value", justify="right")
    stall = document["stall_ratio"]
    totals.add_row("training goodput", f"{document['training_goodput']:.1%}")
    totals.add_row("infra goodput", f"{document['infra_goodput']:.1%}")
    totals.add_row("checkpoint efficiency", f"{document['checkpoint_efficiency']:.2%}")
    per_call, floor = document.get("stall_per_checkpoint_s"), document.get("stall_floor_s")
    stall_text = "-" if stall is None else f"{stall:.2f}x"
    if per_call is not None and floor is not None:
        stall_text += f" ({per_call * 1e3:.1f} ms vs {floor * 1e3:.2f} ms floor)"
    totals.add_row("stall / floor", stall_text)
    totals.add_row("final params sha256", str(document["final_params_sha256"])[:16])
    totals.add_row("fault-free params sha256", str(document["fault_free_params_sha256"])[:16])
    numerics = document.get("numerics") or {}
    totals.add_row("bit-identical to fault-free", _identity_verdict(document["bit_identical"], numerics))
    console.print(totals)
    why = [f"why: {numerics['explained']}"] if numerics.get("explained") else []
    for line in [*why, *totals_in_scale(document, run_dir)]:
        console.print(line, markup=False, highlight=False)
    for line in document.get("checkpoint_warnings", []):
        console.print(f"[yellow]warning:[/yellow] {line}", markup=True, highlight=False)


PHASE_COLUMNS = (
    ("detect_s", "detect"),
    ("teardown_s", "down"),
    ("rendezvous_s", "rdzv"),
    ("start_s", "start"),
    ("restore_s", "load"),
    ("first_step_s", "step"),
)


def print_phases(console: Console, faults: list[dict[str, Any]]) -> None:
    """Where each recovery's seconds went, fault to next productive step (localrun.summary.FaultPhases)."""
    from rich import box  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    table = Table(
        title="Recovery phases (s), fault -> next productive step: detect, teardown, rendezvous, "
        "worker start, restore (load), first step",
        title_justify="left",
        box=box.SIMPLE_HEAD,  # no column rules and no edge padding: a row fits an 80-column terminal
        pad_edge=False,
        collapse_padding=True,
    )
    table.add_column("class", no_wrap=True, min_width=len("skip_collective"))
    table.add_column("tier", no_wrap=True, min_width=len("peer_memory"))
    for _, header in (*PHASE_COLUMNS, ("total_s", "total")):
        table.add_column(header, justify="right", no_wrap=True, min_width=max(len(header), 5))
    for fault in faults:
        phases = fault.get("phases")
        cells = [f"{phases[key]:.1f}" for key, _ in PHASE_COLUMNS] if phases else ["-"] * len(PHASE_COLUMNS)
        total = f"{sum(phases[key] for key, _ in PHASE_COLUMNS):.1f}" if phases else "-"
        table.add_row(fault["class"], fault.get("tier", "-"), *cells, total)
    console.print(table)


_CLASS_COLOURS = {
    "exception": "tab:orange",
    "hang": "tab:purple",
    "skip_collective": "tab:pink",
    "oom": "tab:brown",
    "sigkill": "tab:red",
    "deadlock": "tab:olive",
    "node_loss": "black",
    "store_loss": "tab:cyan",
}


def plot_timeline(run_dir: Path, document: dict[str, Any], *, out: Path | None = None) -> Path:
    """Throughput (rank 0's steps per second) over wall time, faults marked, recoveries shaded."""
    import matplotlib as mpl  # noqa: PLC0415 - heavy, and only the report needs it

    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.lines import Line2D  # noqa: PLC0415

    events = read_events(run_dir)
    t0 = min(e["t"] for e in events)
    steps = [e for e in events if e["kind"] == "step" and e["rank"] == 0]
    figure, (ax_rate, ax_loss) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    ax_rate.plot(
        [e["t"] - t0 for e in steps], [1.0 / max(e["step_s"], 1e-6) for e in steps], ".", markersize=3
    )
    ax_rate.set_ylabel("steps/s (rank 0)")
    ax_loss.plot([e["t"] - t0 for e in steps], [e["loss"] for e in steps], "-", linewidth=1)
    ax_loss.set_ylabel("loss")
    ax_loss.set_xlabel("wall time (s)")
    injected = [e for e in events if e["kind"] == "fault_injected"]
    legend: dict[str, Any] = {}
    for event, fault in zip(injected, document["faults"], strict=False):
        start = event["t"] - t0
        colour = _CLASS_COLOURS.get(fault["class"], "grey")
        # A legend entry per class, not a label per fault: close faults' labels overlapped here
        # (report.html's timeline labels each fault, in lanes).
        legend.setdefault(fault["class"], Line2D([], [], color=colour, linestyle="--", linewidth=1))
        for axis in (ax_rate, ax_loss):
            axis.axvline(start, color=colour, linestyle="--", linewidth=1)
            if fault["recovery_s"] is not None:
                axis.axvspan(start, start + fault["recovery_s"], color=colour, alpha=0.15)
    if legend:
        ax_rate.legend(
            legend.values(), legend.keys(), fontsize=7, loc="lower right", ncols=min(len(legend), 4)
        )
    ax_rate.set_title(
        f"{document['mode']}: training goodput {document['training_goodput']:.1%}, "
        f"infra goodput {document['infra_goodput']:.1%} (dashed: fault, shaded: recovery)"
    )
    figure.tight_layout()
    path = out or run_dir / "timeline.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


# ----- report.html ------------------------------------------------------------------------------
# One self-contained page (inline CSS and SVG, no script, nothing fetched): the fault table, the
# recovery phases (a stacked bar per fault), the totals, the timeline and the bit-identity verdict.
# Written by the demo and `nvrx-eks report`.

REPORT_FILE = "report.html"
SVG_WIDTH = 1100
PLOT_LEFT, PLOT_RIGHT = 60, 20
LABEL_FONT_PX = 11
LABEL_CHAR_EM = 0.62
"""Advance per character of the label font, in em. Each label's text is drawn with
`textLength` = its computed width (lengthAdjust spacingAndGlyphs), so the width the layout reserves
is the width the browser draws, whatever monospace font it picks."""
LABEL_GAP_PX = 6
LANE_HEIGHT_PX = 16
_HTML_COLOURS = {
    "exception": "#ff7f0e",
    "hang": "#9467bd",
    "skip_collective": "#e377c2",
    "oom": "#8c564b",
    "sigkill": "#d62728",
    "deadlock": "#bcbd22",
    "node_loss": "#222222",
    "store_loss": "#17becf",
}


@dataclass(frozen=True)
class LabelBox:
    """A fault label on the timeline: x (left), width and lane (0 = top) in SVG pixels."""

    index: int
    """Position of the label's fault in the input."""
    text: str
    x: float
    width: float
    lane: int


def label_width(text: str, font_px: float = LABEL_FONT_PX) -> float:
    return len(text) * LABEL_CHAR_EM * font_px


def place_labels(anchors: Sequence[tuple[float, str]], *, left: float, right: float) -> list[LabelBox]:
    """Labels at their faults' x, in lanes so that no two overlap.

    Each label spans [x, x + width) on its lane (shifted left to end at `right` when it would run
    past it). Labels are taken left to right and each goes to the first lane whose last label ends
    LABEL_GAP_PX before it starts (first-fit interval partitioning). Two labels on one lane are
    therefore apart horizontally, and two on different lanes are LANE_HEIGHT_PX apart vertically,
    more than the font's line height: no two boxes intersect, by construction.
    """
    boxes: list[LabelBox] = []
    lane_ends: list[float] = []
    spans = []
    for index, (anchor, text) in enumerate(anchors):
        width = label_width(text)
        spans.append((max(left, min(anchor, right - width)), width, text, index))
    for x, width, text, index in sorted(spans, key=lambda s: s[0]):
        lane = next((i for i, end in enumerate(lane_ends) if end + LABEL_GAP_PX <= x), len(lane_ends))
        if lane == len(lane_ends):
            lane_ends.append(x + width)
        else:
            lane_ends[lane] = x + width
        boxes.append(LabelBox(index=index, text=text, x=x, width=width, lane=lane))
    return boxes


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def timeline_svg(events: Sequence[dict[str, Any]], document: dict[str, Any]) -> str:
    """Rank 0's progress (step over wall time) with each fault and its recovery, labels in lanes."""
    t0 = min(e["t"] for e in events)
    t1 = max(e["t"] for e in events)
    span = max(t1 - t0, 1e-6)
    plot_w = SVG_WIDTH - PLOT_LEFT - PLOT_RIGHT
    steps = [e for e in events if e["kind"] == "step" and e["rank"] == 0]
    injected = [e for e in events if e["kind"] == "fault_injected"]
    faults = list(zip(injected, document["faults"], strict=False))

    def x_of(t: float) -> float:
        return float(PLOT_LEFT + (t - t0) / span * plot_w)

    labels = place_labels(
        [(x_of(event["t"]), f"{fault['class']} > {fault['layer']}") for event, fault in faults],
        left=PLOT_LEFT,
        right=SVG_WIDTH - PLOT_RIGHT,
    )
    lanes = 1 + max((b.lane for b in labels), default=0)
    plot_top = 10 + lanes * LANE_HEIGHT_PX + 8
    plot_h = 220
    height = plot_top + plot_h + 40
    max_step = max((e["step"] for e in steps), default=1) or 1

    def y_of(step: float) -> float:
        return plot_top + plot_h - step / max_step * plot_h

    parts = [
        (
            f'<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{SVG_WIDTH}" height="{height}" '
            f'viewBox="0 0 {SVG_WIDTH} {height}" role="img" aria-label="timeline of the run">'
        ),
        (
            f'<rect x="{PLOT_LEFT}" y="{plot_top}" width="{plot_w}" height="{plot_h}" '
            'fill="#fafafa" stroke="#999"/>'
        ),
    ]
    for event, fault in faults:
        colour = _HTML_COLOURS.get(fault["class"], "#777")
        x = x_of(event["t"])
        if fault["recovery_s"] is not None:
            w = max(1.0, fault["recovery_s"] / span * plot_w)
            parts.append(
                f'<rect class="recovery" x="{x:.1f}" y="{plot_top}" '
                f'width="{min(w, PLOT_LEFT + plot_w - x):.1f}" '
                f'height="{plot_h}" fill="{colour}" fill-opacity="0.15"/>'
            )
        parts.append(
            f'<line class="fault" x1="{x:.1f}" x2="{x:.1f}" y1="{plot_top}" y2="{plot_top + plot_h}" '
            f'stroke="{colour}" stroke-dasharray="4 3"/>'
        )
    for box in labels:
        y = 10 + box.lane * LANE_HEIGHT_PX + LABEL_FONT_PX
        colour = _HTML_COLOURS.get(faults[box.index][1]["class"], "#777")
        parts.append(
            f'<text class="fault-label" x="{box.x:.1f}" y="{y}" font-family="monospace" '
            f'font-size="{LABEL_FONT_PX}" textLength="{box.width:.1f}" lengthAdjust="spacingAndGlyphs" '
            f'fill="{colour}">{_esc(box.text)}</text>'
        )
    if steps:
        points = " ".join(f"{x_of(e['t']):.1f},{y_of(e['step']):.1f}" for e in steps)
        parts.append(
            f'<polyline class="progress" points="{points}" fill="none" stroke="#1f77b4" stroke-width="1.5"/>'
        )
    for i in range(6):
        t = span * i / 5
        x = x_of(t0 + t)
        parts.append(
            f'<text x="{x:.1f}" y="{plot_top + plot_h + 16}" font-size="11" '
            f'text-anchor="middle">{t:.0f} s</text>'
        )
    parts.append(
        f'<text x="{PLOT_LEFT - 6}" y="{plot_top + 10}" font-size="11" text-anchor="end">{max_step}</text>'
    )
    parts.append(
        f'<text x="{PLOT_LEFT - 6}" y="{plot_top + plot_h}" font-size="11" text-anchor="end">0</text>'
    )
    parts.append(
        f'<text x="{PLOT_LEFT + plot_w / 2}" y="{height - 6}" font-size="11" text-anchor="middle">'
        "wall time; line: rank 0's step; dashed: fault; shaded: recovery</text>"
    )
    parts.append("</svg>")
    return "\n".join(parts)


_CSS = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 24px; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { border: 1px solid #ccc; padding: 4px 10px; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.verdict { display: inline-block; padding: 6px 12px; border-radius: 4px; font-weight: 600; }
.ok { background: #e3f5e1; color: #1b5e20; } .bad { background: #fde2e1; color: #b71c1c; }
.wrong { color: #b71c1c; font-weight: 600; }
.legend { white-space: nowrap; }
.swatch { display: inline-block; width: 10px; height: 10px; margin: 0 4px 0 12px; }
"""


def _fault_rows(document: dict[str, Any]) -> str:
    rows = []
    for fault in document["faults"]:
        layer, expected = fault["layer"], fault.get("expected_layer", fault["layer"])
        cell = (
            _esc(layer)
            if layer == expected
            else f'<span class="wrong">{_esc(layer)} (not {_esc(expected)})</span>'
        )
        lost = "-" if fault["steps_lost"] is None else fault["steps_lost"]
        rows.append(
            f"<tr><td>{_esc(fault['class'])}</td><td>{cell}</td><td class='num'>{fault['step']}</td>"
            f"<td class='num'>{fault['rank']}</td><td class='num'>{_seconds(fault['detect_s'])}</td>"
            f"<td class='num'>{_seconds(fault['recovery_s'])}</td><td class='num'>{lost}</td></tr>"
        )
    return "\n".join(rows)


def _totals_rows(document: dict[str, Any]) -> str:
    stall = document.get("stall_ratio")
    rows = [
        ("training goodput", f"{document['training_goodput']:.1%}"),
        ("infra goodput", f"{document['infra_goodput']:.1%}"),
        ("checkpoint efficiency", f"{document['checkpoint_efficiency']:.2%}"),
        ("stall / floor", "-" if stall is None else f"{stall:.2f}x"),
        ("wall time", _seconds(document.get("wall_s"))),
        (
            "productive / replayed steps",
            f"{document.get('productive_steps', '-')} / {document.get('replayed_steps', '-')}",
        ),
        ("faults", str(len(document["faults"]))),
        ("final params sha256", str(document["final_params_sha256"])),
        ("fault-free params sha256", str(document["fault_free_params_sha256"])),
    ]
    return "\n".join(f"<tr><th>{_esc(k)}</th><td class='num'>{_esc(v)}</td></tr>" for k, v in rows)


PHASE_NAMES = {
    "detect_s": ("detect", "#d62728"),
    "teardown_s": ("teardown", "#ff7f0e"),
    "rendezvous_s": ("rendezvous", "#9467bd"),
    "start_s": ("worker start", "#8c564b"),
    "restore_s": ("restore", "#2ca02c"),
    "first_step_s": ("first step", "#1f77b4"),
}
"""The recovery phases in order (localrun.summary.FaultPhases), with their names and bar colours."""
PHASE_BAR_PX = 300
"""The longest recovery's bar; the others are to scale."""


def _phase_bar(phases: dict[str, float], scale: float) -> str:
    """One recovery as a stacked bar: a segment per phase, in order, `scale` pixels per second."""
    parts, x = [], 0.0
    for key, (name, colour) in PHASE_NAMES.items():
        width = phases[key] * scale
        parts.append(
            f'<rect class="phase" data-phase="{key}" x="{x:.2f}" y="2" width="{width:.2f}" height="14" '
            f'fill="{colour}"><title>{name} {phases[key]:.2f} s</title></rect>'
        )
        x += width
    return (
        f'<svg class="phase-bar" xmlns="http://www.w3.org/2000/svg" width="{PHASE_BAR_PX}" height="18" '
        f'viewBox="0 0 {PHASE_BAR_PX} 18" role="img" aria-label="recovery phases">{"".join(parts)}</svg>'
    )


def _phase_rows(document: dict[str, Any]) -> str:
    totals = [sum(f["phases"][k] for k in PHASE_NAMES) for f in document["faults"] if f.get("phases")]
    scale = PHASE_BAR_PX / max(max(totals, default=0.0), 1e-9)
    rows = []
    for fault in document["faults"]:
        phases = fault.get("phases")
        if phases:
            cells = "".join(f"<td class='num'>{phases[key]:.2f}</td>" for key in PHASE_NAMES)
            total = f"{sum(phases[key] for key in PHASE_NAMES):.2f}"
            bar = _phase_bar(phases, scale)
        else:  # the run ended before every rank trained again
            cells, total, bar = "<td class='num'>-</td>" * len(PHASE_NAMES), "-", ""
        rows.append(
            f"<tr class='phase-row'><td>{_esc(fault['class'])}</td><td>{_esc(fault.get('tier', '-'))}</td>"
            f"{cells}<td class='num total'>{total}</td><td>{bar}</td></tr>"
        )
    return "\n".join(rows)


def _phase_headers() -> str:
    return "".join(f"<th>{_esc(name)}</th>" for name, _ in PHASE_NAMES.values())


def _phase_legend() -> str:
    return " ".join(
        f'<span class="legend"><span class="swatch" style="background:{colour}"></span>{_esc(name)}</span>'
        for name, colour in PHASE_NAMES.values()
    )


def _warnings(document: dict[str, Any]) -> str:
    lines = document.get("checkpoint_warnings") or []
    if not lines:
        return ""
    items = "\n".join(f"<li>{_esc(line)}</li>" for line in lines)
    return f'<h2>Warnings</h2>\n<ul id="warnings" class="bad">\n{items}\n</ul>\n'


def render_html(
    document: dict[str, Any], events: Sequence[dict[str, Any]], *, title: str, run_dir: Path | None = None
) -> str:
    identical = document["bit_identical"]
    numerics = document.get("numerics") or {}
    if identical:
        verdict = '<span id="verdict" class="verdict ok">bit-identical to the fault-free run</span>'
    elif numerics.get("explained"):
        verdict = (
            '<span id="verdict" class="verdict ok">not bit-identical to the fault-free run, as expected: '
            f"{_esc(numerics_line(numerics))} ({_esc(numerics['explained'])})</span>"
        )
    else:
        verdict = '<span id="verdict" class="verdict bad">NOT bit-identical to the fault-free run</span>'
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_esc(title)}</title><style>{_CSS}</style></head>
<body>
<h1>{_esc(title)}</h1>
<p id="ran">{_esc(ran_line(document))}</p>
<p>mode <b>{_esc(document["mode"])}</b>, {document["steps"]} steps, {len(document["faults"])} faults.
{verdict}</p>
<h2>Timeline</h2>
{timeline_svg(events, document)}
<h2>Faults</h2>
<table id="faults"><thead><tr><th>class</th><th>recovered by</th><th>step</th><th>rank</th><th>detect</th>
<th>recovery</th><th>steps lost</th></tr></thead>
<tbody>
{_fault_rows(document)}
</tbody></table>
<h2>Recovery phases</h2>
<p>Seconds from each fault to the next productive step, phase by phase (they add up to the total;
bars to scale): {_phase_legend()}</p>
<table id="phases"><thead><tr><th>class</th><th>state from</th>{_phase_headers()}<th>total</th>
<th>breakdown</th></tr></thead>
<tbody>
{_phase_rows(document)}
</tbody></table>
<h2>Totals</h2>
<table id="totals"><tbody>
{_totals_rows(document)}
</tbody></table>
<div id="scale">{"".join(f"<p>{_esc(line)}</p>" for line in totals_in_scale(document, run_dir))}</div>
{_warnings(document)}</body></html>
"""


def write_html_report(
    out_dir: Path, document: dict[str, Any], trainer_run_dir: Path, *, title: str | None = None
) -> Path:
    """`<out_dir>/report.html` from the summary document and the trainer run's event streams."""
    events = read_events(trainer_run_dir)
    if not events:
        raise ValueError(f"{trainer_run_dir}: no events (expected events/rank-*.jsonl)")
    path = out_dir / REPORT_FILE
    path.write_text(
        render_html(document, events, title=title or f"nvrx-eks run {out_dir.name}", run_dir=out_dir),
        encoding="utf-8",
    )
    return path


def trainer_run_dir(run_dir: Path) -> Path:
    """The folder holding the trainer's `events/` in a run folder: the run itself (a trainer run), or
    the one faulty run inside a demo / bench run folder (its fault-free reference is not reported)."""
    if (run_dir / "events").is_dir():
        return run_dir
    found = sorted(
        p.parent
        for p in run_dir.rglob("events")
        if p.is_dir() and any(p.glob("rank-*.jsonl")) and "fault-free" not in p.relative_to(run_dir).parts
    )
    if len(found) != 1:
        listed = ", ".join(str(p) for p in found) or "none"
        raise UserError(
            f"{run_dir}: expected one trainer run (a folder with events/rank-*.jsonl) in it, found {listed}; "
            "pass that folder"
        )
    return found[0]


def report_run(run_dir: Path) -> Path:
    """`nvrx-eks report RUN_DIR`: report.html from summary.json (or the events alone) into RUN_DIR."""
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such run folder")
    trainer_dir = trainer_run_dir(run_dir)
    if not any(event["kind"] == "process_start" for event in read_events(trainer_dir)):
        raise UserError(
            f"{trainer_dir}/events: the rank-*.jsonl files hold no trainer events (empty, or the run was "
            "stopped before its first process started); pass a run folder of a run that trained"
        )
    summary = run_dir / "summary.json"
    if summary.is_file():
        what = "summary.json as `nvrx-eks demo` writes it (delete it to report from the events alone)"
        document = read_json(summary, what=what)
        validate_file(_SummaryShape, document, summary, what=what)
    else:
        from nvrx_eks.localrun.summary import summarize  # noqa: PLC0415

        document = summary_document(summarize(trainer_dir), fault_free_sha256=None)
    return write_html_report(run_dir, document, trainer_dir)
