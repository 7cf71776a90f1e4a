"""Chaos runs of a rendered job on this machine: render, run with the local executor, summarize.

The job that runs is the one the chart renders (the executor starts the manifests' own command lines),
with the trainer's fault schedule set through the job values. A fault-free run of the same values is
the reference for "nothing lost": its final-parameter hash is cached per configuration and code.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
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


class RunFailed(Exception):  # noqa: N818 - a run's outcome, not a programming error
    """A local run of the job that did not complete: why, and whether the job's input or the user's
    script is to blame (the demo exits 2 then, as for any bad input)."""

    def __init__(self, reason: str, *, user_error: bool, logs: Path) -> None:
        super().__init__(reason)
        self.reason, self.user_error, self.logs = reason, user_error, logs


def local_entry_problem(values: JobValues) -> str | None:
    """Why the job's own module or script cannot run under the local executor (`image: local`: from
    the folder `nvrx-eks` runs in, which the executor puts on the pods' Python path), or None. Said
    before anything is rendered or started; the launcher of every pod would say it again."""
    from nvrx_eks.k8s.nvrx_versions import LOCAL_IMAGE  # noqa: PLC0415
    from nvrx_eks.training.entry import entry_problem  # noqa: PLC0415

    entry = values.entrypoint
    if entry is None or values.image != LOCAL_IMAGE:
        return None
    project = str(Path.cwd())
    sys.path.insert(0, project)
    try:
        if entry.module is not None:
            return entry_problem("module", entry.module)
        return entry_problem("script", str(entry.script))
    finally:
        sys.path.remove(project)


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
    """The trainer's code, and a script's own (`code_files`); and the torch and NVRx releases that run it
    (another release may round differently)."""
    digest = hashlib.sha256()
    for distribution in ("torch", "nvidia-resiliency-ext"):
        digest.update(f"{distribution}=={metadata.version(distribution)};".encode())
    for path in sorted(_TRAINER_SOURCES.rglob("*.py")) + code_files(values):
        digest.update(path.read_bytes())
    return digest.hexdigest()


NOT_CODE_DIRS = frozenset({"site-packages", "dist-packages", "node_modules", "__pycache__", "build", "dist"})
"""Folders below a script's that hold no code of its own: installed or vendored packages, build output."""


def code_files(values: JobValues) -> list[Path]:
    """A script's own code, as the fault-free cache key counts it: the `*.py` files of its module's
    top-level package (or of its script's folder), recursively, but for hidden folders (`.venv`, `.git`),
    folders holding a virtual environment (a `pyvenv.cfg`) and NOT_CODE_DIRS. What it imports from
    installed packages is not code here: their versions are, for torch and NVRx (`fault_free_key`)."""
    entry = values.entrypoint
    if entry.script is not None:
        return _own_py_files(Path(entry.script).resolve().parent)
    # Where its pods find it: the project folder first (the executor puts it on their Python path).
    top = str(entry.module).split(".")[0]
    for base in (Path.cwd(), *map(Path, sys.path)):
        if (base / top / "__init__.py").is_file() or (base / top).is_dir():
            return _own_py_files(base / top)
        if (base / f"{top}.py").is_file():
            return [base / f"{top}.py"]
    return []


def _own_py_files(folder: Path) -> list[Path]:
    found: list[Path] = []
    for parent, dirs, files in os.walk(folder):
        dirs[:] = sorted(
            d
            for d in dirs
            if not d.startswith(".")
            and d not in NOT_CODE_DIRS
            and not (Path(parent) / d / "pyvenv.cfg").exists()
        )
        found += [Path(parent) / f for f in files if f.endswith(".py")]
    return sorted(found)


def fault_free_key(values: JobValues) -> str:
    """Same values (faults removed), same code (the kit's trainer and `code_files`) and the same torch,
    NVRx and Python -> same final parameters."""
    from nvrx_eks.kitcore.runtime import runtime_versions  # noqa: PLC0415

    document: dict[str, Any] = without_faults(values).model_dump(mode="json")
    blob = json.dumps([document, runtime_versions()], sort_keys=True) + _code_digest(values)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def without_faults(values: JobValues) -> JobValues:
    return values.model_copy(update={"trainer": values.trainer.model_copy(update={"faults": FaultsConfig()})})


def fault_free_sha256(
    values: JobValues, *, cache_dir: Path, run_dir: Path, console: Console, timeout_s: float = 600.0
) -> str | None:
    """The fault-free run's final-parameter hash: from the cache, else by running it once (RunFailed when
    that run fails: there is nothing to compare a chaos run with)."""
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
        raise RunFailed(outcome.job.reason, user_error=outcome.job.user_error, logs=run_dir / "pods")
    from nvrx_eks.training.attempt import FINAL_STATE  # noqa: PLC0415 - torch, only when a run ran

    sha = summarize(outcome.trainer_run_dir).final_params_sha256
    cache_dir.mkdir(parents=True, exist_ok=True)
    state = outcome.trainer_run_dir / FINAL_STATE
    if state.is_file():
        shutil.copyfile(state, cached.with_suffix(".pt"))
    cached.write_text(json.dumps({"final_params_sha256": sha, "run_dir": str(run_dir)}) + "\n")
    return sha


def fault_free_state(values: JobValues, *, cache_dir: Path) -> Path | None:
    """The fault-free run's final parameters, whole (`training.attempt.FINAL_STATE`), when it kept them."""
    path = cache_dir / f"fault-free-{fault_free_key(values)}.pt"
    return path if path.is_file() else None
