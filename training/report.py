"""What a run cost, for people and for tools: the fault table, `summary.json` and a PNG timeline.

Everything here is derived from the run's event streams through `training.metrics.summarize`; the
report adds presentation only, so the numbers a test asserts are the numbers a user reads.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from training.events import read_events

if TYPE_CHECKING:
    from pathlib import Path

    from rich.console import Console

    from training.metrics import RunSummary

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
{detect_s, teardown_s, rendezvous_s, start_s, restore_s, first_step_s} (training.metrics.FaultPhases),
or null when the run ended before every rank trained again."""


def summary_document(summary: RunSummary, *, fault_free_sha256: str | None) -> dict[str, Any]:
    """summary.json: the stable keys first, then the run's other figures for whoever wants them."""
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
    return document | full


def write_summary(run_dir: Path, document: dict[str, Any]) -> Path:
    path = run_dir / "summary.json"
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return path


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def print_report(console: Console, document: dict[str, Any]) -> None:
    """One row per fault, then the run's totals."""
    from rich.table import Table  # noqa: PLC0415

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
    verdict = "[green]yes[/green]" if document["bit_identical"] else "[red]no[/red]"
    totals.add_row("bit-identical to fault-free", verdict)
    console.print(totals)


PHASE_COLUMNS = (
    ("detect_s", "detect"),
    ("teardown_s", "down"),
    ("rendezvous_s", "rdzv"),
    ("start_s", "start"),
    ("restore_s", "load"),
    ("first_step_s", "step"),
)


def print_phases(console: Console, faults: list[dict[str, Any]]) -> None:
    """Where each recovery's seconds went, fault to next productive step (training.metrics.FaultPhases)."""
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
}


def plot_timeline(run_dir: Path, document: dict[str, Any], *, out: Path | None = None) -> Path:
    """Throughput (rank 0's steps per second) over wall time, faults marked, recoveries shaded."""
    import matplotlib as mpl  # noqa: PLC0415 - heavy, and only the report needs it

    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

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
    for event, fault in zip(injected, document["faults"], strict=False):
        start = event["t"] - t0
        colour = _CLASS_COLOURS.get(fault["class"], "grey")
        for axis in (ax_rate, ax_loss):
            axis.axvline(start, color=colour, linestyle="--", linewidth=1)
            if fault["recovery_s"] is not None:
                axis.axvspan(start, start + fault["recovery_s"], color=colour, alpha=0.15)
        ax_rate.annotate(
            f"{fault['class']}\n{fault['layer']}",
            (start, ax_rate.get_ylim()[1]),
            fontsize=7,
            va="top",
            color=colour,
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
