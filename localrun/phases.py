"""Where a recovery's seconds went, from the trainer's own event streams (training/events.py).

`python -m nvrx_eks.localrun.phases RUN [RUN ...]` prints, per fault, the seconds of each recovery
phase as the run's summary.json and report give them (localrun.summary.FaultPhases): detect,
teardown, rendezvous, worker start, restore (the slowest load), first step; each phase ends when its
slowest rank is through it, so they add up to the fault -> next productive step. With several runs
(e.g. three demos) it also prints the median per fault class. A RUN is a demo run folder, a chaos
folder or a trainer run folder: the `events` folder below it is found.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from nvrx_eks.localrun.summary import fault_summaries
from nvrx_eks.training.events import read_events
from nvrx_eks.training.metrics import RECOVERY_PHASES


def find_event_dirs(root: Path) -> list[Path]:
    """Trainer run folders (those holding `events/rank-*.jsonl`) at or below `root`, fault-free
    reference runs left out."""
    found = sorted({p.parent.parent for p in root.rglob("events/rank-*.jsonl")})
    return [d for d in found if "fault-free" not in d.parts]


def fault_phases(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per `fault_injected`: the seconds of each phase (None: the recovery did not finish),
    the layer that recovered it, the tier the slowest rank restored from and the total."""
    rows = []
    for fault in fault_summaries(events):
        phases = asdict(fault.phases) if fault.phases is not None else {}
        row: dict[str, Any] = {"class": fault.cls, "step": fault.step, "rank": fault.rank}
        row.update({phase: phases.get(f"{phase}_s") for phase in RECOVERY_PHASES})
        row.update(layer=fault.layer, tier=fault.tier, total=fault.phases.total_s if fault.phases else None)
        rows.append(row)
    return rows


def _fmt(value: float | None) -> str:
    return f"{value:7.2f}" if isinstance(value, int | float) else "      -"


def print_table(title: str, rows: list[dict[str, Any]], out: Any = None) -> None:  # noqa: ANN401
    out = out or sys.stdout
    print(title, file=out)
    head = "".join(f" {name[:7]:>7}" for name in (*RECOVERY_PHASES, "total"))
    print(f"  {'fault':<24}{head}  tier / layer", file=out)
    for row in rows:
        cells = "".join(f" {_fmt(row[name])}" for name in (*RECOVERY_PHASES, "total"))
        name = f"{row['class']}@{row['step']}:{row['rank']}"
        print(f"  {name:<24}{cells}  {row['tier']} / {row['layer']}", file=out)


def medians(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per fault class (in first-run order): the median of each milestone over the runs that have it."""
    order = [row["class"] for row in runs[0]] if runs else []
    out = []
    for cls in order:
        rows = [row for run in runs for row in run if row["class"] == cls]
        med: dict[str, Any] = {"class": cls, "step": rows[0]["step"], "rank": rows[0]["rank"]}
        for key in (*RECOVERY_PHASES, "total"):
            values = [r[key] for r in rows if r.get(key) is not None]
            med[key] = statistics.median(values) if values else None
        med["tier"] = "/".join(sorted({str(r["tier"]) for r in rows}))
        med["layer"] = "/".join(sorted({r["layer"] for r in rows}))
        med["runs"] = len(rows)
        out.append(med)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="demo run folders (or trainer run folders)")
    args = parser.parse_args(argv)
    all_rows = []
    for root in args.runs:
        dirs = find_event_dirs(root)
        if not dirs:
            print(f"{root}: no events found", file=sys.stderr)
            return 2
        for run_dir in dirs:
            rows = fault_phases(read_events(run_dir))
            all_rows.append(rows)
            print_table(f"{run_dir} (seconds per recovery phase, slowest rank)", rows)
    if len(all_rows) > 1:
        print_table(f"median of {len(all_rows)} runs", medians(all_rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
