"""Chaos runs of a rendered job on this machine: render, run with the local executor, summarize.

The job that runs is the one the chart renders (the executor starts the manifests' own command lines),
with the trainer's fault schedule set through the job values. A fault-free run of the same values is
the reference for "nothing lost": its final-parameter hash is cached per configuration and code.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nvrx_eks.k8s.sections import REFERENCE_TRAINER_MODULE
from nvrx_eks.training.events import read_events
from nvrx_eks.training.resilience.config import FaultsConfig

if TYPE_CHECKING:
    from rich.console import Console

    from nvrx_eks.k8s.values import JobValues
    from nvrx_eks.localrun.executor import JobResult
    from nvrx_eks.localrun.runtimes import Runtime

_TRAINER_SOURCES = Path(__file__).resolve().parent.parent / "training"


@dataclass(frozen=True)
class ChaosResult:
    job: JobResult
    trainer_run_dir: Path
    """Where the trainer wrote its events (the FSx PVC's folder in the executor's run dir)."""


def reference_trainer(**flags: object) -> tuple[str, str]:
    """Job-value overrides that run the reference trainer (`python -m nvrx_eks.training`) with these
    flags of its own (`steps=40` is `--steps 40`): what the benchmarks and the tests of the local job
    set, as any script's settings, in `entrypoint.args`."""
    args = [part for name, value in flags.items() for part in (f"--{name.replace('_', '-')}", str(value))]
    return f"entrypoint.module={REFERENCE_TRAINER_MODULE}", f"entrypoint.args={json.dumps(args)}"


def trainer_run_dir(values: JobValues, run_dir: Path) -> Path:
    """The local folder behind the trainer's `--run-dir` for a job the executor ran in `run_dir`."""
    from nvrx_eks.localrun.executor import pvc_folder  # noqa: PLC0415

    mount = values.storage.fsx_mount_path.rstrip("/")
    inside = str(values.trainer.run_dir).removeprefix(mount).lstrip("/")
    return pvc_folder(run_dir, values.storage.fsx_pvc) / inside


@dataclass(frozen=True)
class Progress:
    """Where a run is, from its event streams."""

    done: int
    """Steps rank 0 has finished."""
    total: int | None
    """The run's steps, once its loop said them (`loop_start`); None before."""
    phase: str
    faults: int
    """Faults injected so far."""


def _progress_line(events_root: Path) -> Progress:
    """The run's progress from its event streams: whatever script runs, its loop states its length."""
    try:
        events = read_events(events_root)
    except FileNotFoundError:
        return Progress(0, None, "starting", 0)
    total = next((int(e["steps"]) for e in events if e["kind"] == "loop_start"), None)
    # Steps are numbered from 0: the newest finished step N means N + 1 steps done.
    done = max((e["step"] + 1 for e in events if e["kind"] == "step" and e["rank"] == 0), default=0)
    faults = sum(1 for e in events if e["kind"] == "fault_injected")
    phase = "starting"
    for event in reversed(events):
        kind = event["kind"]
        if kind == "step":
            phase = "training"
        elif kind == "fault_injected":
            phase = f"fault: {event['class']} on rank {event['target_rank']}"
        elif kind in {"detected", "terminated"}:
            phase = f"recovering ({event['layer']})"
        elif kind in {"process_start", "attempt_start"}:
            phase = "restarting" if done else "starting"
        elif kind == "end":
            phase = "done"
        else:
            continue
        break
    return Progress(min(done, total) if total is not None else done, total, phase, faults)


def run_job(
    values: JobValues,
    *,
    run_dir: Path,
    console: Console,
    label: str,
    timeout_s: float = 600.0,
    runtime: Runtime | None = None,
) -> ChaosResult:
    """Render `values` into `run_dir/dist`, run it locally with a progress bar, return the outcome.
    `runtime`: how each container runs (localrun/runtimes.py; default: processes)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415

    from nvrx_eks.k8s.job_chart import render  # noqa: PLC0415
    from nvrx_eks.localrun.executor import run_local  # noqa: PLC0415

    dist = run_dir / "dist"
    render(values, str(dist))
    events_root = trainer_run_dir(values, run_dir)
    stop = threading.Event()
    with Progress(
        TextColumn(f"[bold]{label}[/bold]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[phase]}  faults so far: {task.fields[faults]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        task = progress.add_task(label, total=None, phase="starting", faults=0)

        def watch() -> None:
            while not stop.wait(0.5):
                now = _progress_line(events_root)
                progress.update(task, completed=now.done, total=now.total, phase=now.phase, faults=now.faults)

        watcher = threading.Thread(target=watch, name="progress", daemon=True)
        watcher.start()
        try:
            result = run_local(dist, run_dir=run_dir, timeout_s=timeout_s, runtime=runtime)
        finally:
            stop.set()
            watcher.join()
        end = _progress_line(events_root)
        phase = end.phase if result.succeeded else "FAILED"
        progress.update(task, completed=end.done, total=end.total, phase=phase, faults=end.faults)
    return ChaosResult(job=result, trainer_run_dir=events_root)


def _code_digest(values: JobValues) -> str:
    """The trainer's code, and a script's own: its module's package (or its script's folder); and the
    torch and NVRx releases that run it (another release may round differently)."""
    digest = hashlib.sha256()
    for distribution in ("torch", "nvidia-resiliency-ext"):
        digest.update(f"{distribution}=={metadata.version(distribution)};".encode())
    for path in sorted(_TRAINER_SOURCES.rglob("*.py")) + _script_sources(values):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _script_sources(values: JobValues) -> list[Path]:
    entry = values.entrypoint
    if entry.script is not None:
        return sorted(Path(entry.script).resolve().parent.rglob("*.py"))
    # Where its pods find it: the project folder first (the executor puts it on their Python path).
    relative = Path(*str(entry.module).split("."))
    for base in (Path.cwd(), *map(Path, sys.path)):
        for candidate in (base / relative.with_suffix(".py"), base / relative / "__init__.py"):
            if candidate.is_file():
                return sorted(candidate.parent.rglob("*.py"))
    return []


def fault_free_key(values: JobValues) -> str:
    """Same values (faults removed) and same trainer code -> same final parameters."""
    document: dict[str, Any] = without_faults(values).model_dump(mode="json")
    blob = json.dumps(document, sort_keys=True) + _code_digest(values)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def without_faults(values: JobValues) -> JobValues:
    return values.model_copy(update={"trainer": values.trainer.model_copy(update={"faults": FaultsConfig()})})


def fault_free_sha256(
    values: JobValues, *, cache_dir: Path, run_dir: Path, console: Console, timeout_s: float = 600.0
) -> str | None:
    """The fault-free run's final-parameter hash: from the cache, else by running it once."""
    from nvrx_eks.localrun.summary import summarize  # noqa: PLC0415

    key = fault_free_key(values)
    cached = cache_dir / f"fault-free-{key}.json"
    if cached.exists():
        known = str(json.loads(cached.read_text())["final_params_sha256"])
        console.print(f"fault-free reference: cached ({cached}) sha256 {known[:16]}")
        return known
    outcome = run_job(
        without_faults(values), run_dir=run_dir, console=console, label="fault-free", timeout_s=timeout_s
    )
    if not outcome.job.succeeded:
        console.print(f"[red]fault-free run failed: {outcome.job.reason}[/red] (logs in {run_dir}/pods)")
        return None
    sha = summarize(outcome.trainer_run_dir).final_params_sha256
    cache_dir.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps({"final_params_sha256": sha, "run_dir": str(run_dir)}) + "\n")
    return sha
