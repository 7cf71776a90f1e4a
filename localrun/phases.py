"""Where a recovery's seconds went, from the trainer's own event streams (training/events.py).

`python -m nvrx_eks.localrun.phases RUN [RUN ...]` prints, per fault, the seconds from the fault to each
milestone of its recovery, every one the *last* rank's (the job is only as far as its slowest rank):

- detect: the first `detected` (in-process) or `terminated` (launcher stopping a worker) event;
- gone: the old workers' last event (a stopped worker emits `terminated` just before it exits);
- spawn: the kernel started the new worker processes (`process_start.created_t`);
- start: `process_start` (interpreter up, the trainer's modules imported);
- ready: `process_ready` (preloads, stores, resilience layers, checkpointer built);
- restore: `startup_done` (process group, rendezvous on the store, checkpoint restored), with the tier
  and the slowest rank's `load_s`;
- step: the first step completed after the fault.

Faults recovered in process have no new processes: only detect, restore and step. With several runs
(e.g. three demos) it also prints the median per fault class. A RUN is a demo run folder, a chaos
folder or a trainer run folder: the `events` folder below it is found.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from nvrx_eks.training.events import read_events

MILESTONES = ("detect", "gone", "spawn", "start", "ready", "restore", "step")


def find_event_dirs(root: Path) -> list[Path]:
    """Trainer run folders (those holding `events/rank-*.jsonl`) at or below `root`, fault-free
    reference runs left out."""
    found = sorted({p.parent.parent for p in root.rglob("events/rank-*.jsonl")})
    return [d for d in found if "fault-free" not in d.parts]


def _last_rank(events: list[dict[str, Any]], *, key: str = "t") -> float | None:
    """The latest, over ranks, of each rank's first matching event (None unless every rank has one)."""
    first: dict[int, float] = {}
    for event in events:
        if event["rank"] not in first and event.get(key) is not None:
            first[event["rank"]] = event[key]
    return max(first.values()) if first else None


def fault_phases(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per `fault_injected`: seconds from the fault to each milestone (None: not reached or
    not applicable), the layer that recovered it, the restore tier and the slowest load."""
    faults = [e for e in events if e["kind"] == "fault_injected"]
    world = max((e.get("world_size", 1) for e in events if e["kind"] == "process_start"), default=1)
    rows = []
    for i, fault in enumerate(faults):
        t0 = fault["t"]
        t_next = faults[i + 1]["t"] if i + 1 < len(faults) else float("inf")
        window = [e for e in events if t0 < e["t"] < t_next]
        old_pids = {e["pid"] for e in events if e["t"] <= t0}
        new_starts = [e for e in window if e["kind"] == "process_start" and e["pid"] not in old_pids]
        row: dict[str, Any] = {"class": fault["class"], "step": fault["step"], "rank": fault["target_rank"]}
        detect = next((e for e in window if e["kind"] in {"detected", "terminated"}), None)
        row["detect"] = detect["t"] - t0 if detect else None
        restored = [e for e in window if e["kind"] == "startup_done"]
        if new_starts:
            row["layer"] = "launcher"
            first_new = min(e["t"] for e in new_starts)
            old_tail = [e["t"] for e in window if e["pid"] in old_pids and e["t"] < first_new]
            row["gone"] = max(old_tail) - t0 if old_tail else 0.0
            new_pids = {e["pid"] for e in new_starts}
            mine = [e for e in window if e["pid"] in new_pids]
            if len({e["rank"] for e in new_starts}) < world:
                row["layer"] = "launcher (partial)"
            spawn = _last_rank(new_starts, key="created_t")
            row["spawn"] = spawn - t0 if spawn is not None else None
            for name, kind in (("start", "process_start"), ("ready", "process_ready")):
                t = _last_rank([e for e in mine if e["kind"] == kind])
                row[name] = t - t0 if t is not None else None
            restored = [e for e in mine if e["kind"] == "startup_done"]
            steps = [e for e in mine if e["kind"] == "step"]
        else:
            row["layer"] = "inprocess"
            row.update(gone=None, spawn=None, start=None, ready=None)
            steps = [e for e in window if e["kind"] == "step" and e["t"] > (detect or fault)["t"]]
        t_restore = _last_rank(restored)
        row["restore"] = t_restore - t0 if t_restore is not None else None
        firsts: dict[int, dict[str, Any]] = {}
        for e in restored:
            firsts.setdefault(e["rank"], e)
        row["tier"] = ",".join(sorted({e["tier"] for e in firsts.values()})) or None
        row["load_s"] = max((e.get("load_s", 0.0) for e in firsts.values()), default=None)
        after = [e for e in steps if t_restore is None or e["t"] >= min(f["t"] for f in firsts.values())]
        t_step = _last_rank(after)
        row["step_t"] = t_step - t0 if t_step is not None else None
        rows.append(row)
    return rows


def _fmt(value: float | None) -> str:
    return f"{value:7.2f}" if isinstance(value, int | float) else "      -"


def _columns(row: dict[str, Any]) -> list[float | None]:
    return [row.get(m) if m != "step" else row.get("step_t") for m in MILESTONES]


def print_table(title: str, rows: list[dict[str, Any]], out: Any = None) -> None:  # noqa: ANN401
    out = out or sys.stdout
    print(title, file=out)
    head = "".join(f"{m:>8}" for m in MILESTONES)
    print(f"  {'fault':<24}{head}  {'load_s':>6}  tier / layer", file=out)
    for row in rows:
        cells = "".join(f" {_fmt(v)}" for v in _columns(row))
        name = f"{row['class']}@{row['step']}:{row['rank']}"
        print(f"  {name:<24}{cells}  {_fmt(row['load_s'])}  {row['tier']} / {row['layer']}", file=out)


def medians(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per fault class (in first-run order): the median of each milestone over the runs that have it."""
    order = [row["class"] for row in runs[0]] if runs else []
    out = []
    for cls in order:
        rows = [row for run in runs for row in run if row["class"] == cls]
        med: dict[str, Any] = {"class": cls, "step": rows[0]["step"], "rank": rows[0]["rank"]}
        for key in (*MILESTONES[:-1], "step_t", "load_s"):
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
            print_table(f"{run_dir} (seconds from the fault, slowest rank)", rows)
    if len(all_rows) > 1:
        print_table(f"median of {len(all_rows)} runs", medians(all_rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
