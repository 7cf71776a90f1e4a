"""`python -m nvrx_eks.training.resilience.launch`: ft_launcher whose restarted workers fork from a warm
process.

The command line is ft_launcher's own flags, then `--` and the training script as `python` would take
it: `-m MODULE ARGS` or `SCRIPT ARGS` (k8s/launcher.py writes it so: the boundary is marked, never
guessed from the flags). What this adds: the workers are not fresh interpreters. ft_launcher's
`--run-path` runs the script through training/entry.py, a Python callable, and
`--start-method=forkserver` (torch.distributed.elastic's multiprocessing, not ours) starts each worker
as a fork of one forkserver process per pod; `multiprocessing.set_forkserver_preload` makes that process
import torch, torch._dynamo and the kit once, before any worker exists.

Why: with fresh interpreters, a restart's worker start is the longest phase of a hard-fault recovery:
every rank of every node imports torch and torch._dynamo (training/parallel.py `preload`) again after
each restart, seconds of CPU per rank. A fork of the warm forkserver is ready in milliseconds; the
imports are paid once per pod, when it starts.

Why a forkserver and not `--start-method=fork`: the agent has threads (the rendezvous client, the rank
monitors' connections); fork copies a process with those threads' locks in whatever state they were.
The forkserver is a fresh interpreter that only imports (torch's one native thread is idle then, as for
DataLoader workers forked after `import torch`), never initialises CUDA (a fork after CUDA init is
unusable) and never runs a collective.

A worker is still a separate process with its own rendezvous and exit status: a SIGKILL, an OOM kill,
a watchdog's SIGKILL reach it as before, and ft_launcher sees the same exit codes. It shares the
forkserver's process group, which is the launcher's (training/resilience/nvrx_compat.py
`keep_launcher_process_group`). What it inherits from the forkserver is only imported modules: nothing in
kitcore/ or training/ reads the environment or opens files at import (tests/training/test_training_launch.py
checks both).

The forkserver starts at once, so its imports run while this process imports NVRx and its agent waits
in the rendezvous round: a pod's first start (a replacement after a node loss) overlaps the two. Where
this launcher is itself a fork of an interpreter that has imported torch (the local executor's warm
runtime says so through `FORKSERVER_FORK_ENV`), the forkserver is a fork of this process instead
(`fork_forkserver`), which imports only what this process has not: the suite's many short local jobs
would otherwise import torch again in every pod they start.

The exit status tells the Job controller whether the fault was here. ft_launcher exits 1 whenever its
workers failed, also when the only failure was its own stop of them (SIGTERM) because a rank on another
node failed. Such a pod exits `COLLATERAL_EXIT_CODE` instead, and the Job's podFailurePolicy replaces
it without charging its index (k8s/job_chart.py): the index that is charged is the one whose rank
failed by itself.
"""

from __future__ import annotations

import itertools
import multiprocessing
import multiprocessing.forkserver
import os
import socket
import sys
import threading
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

from nvrx_eks.kitcore.configio import USER_ERROR_EXIT_CODE, UserError, exit_on_user_error
from nvrx_eks.kitcore.lines import say
from nvrx_eks.training.entry import entry_problem, entry_source
from nvrx_eks.training.resilience.config import RENDEZVOUS_ENV, RUN_ID_ENV, ResilienceConfig, config_from_env
from nvrx_eks.training.resilience.launcher_liveness import LauncherBeat
from nvrx_eks.training.resilience.nvrx_compat import (
    capture_worker_failures,
    check_supported_nvrx,
    format_tracebacks_without_dynamo,
    keep_launcher_process_group,
    poll_rendezvous_faster,
    rank_reason,
    report_every_failed_worker,
    stop_on_user_error,
    train_at_the_rounds_size,
)
from nvrx_eks.training.resilience.warm_entry import PRELOAD_IMPORTS_ENV, write_warm_module

WARM_MODULES = (
    "torch",
    "torch._dynamo",
    "torch.distributed",
    # What each worker unpickles to start: torch's worker wrapper and NVRx's `--run-path` entry point
    # (the launcher module, with its gRPC, rich and httpx imports), then the launcher's own main module,
    # which multiprocessing imports again in every child as `__mp_main__`.
    "torch.distributed.elastic.multiprocessing.api",
    "nvidia_resiliency_ext.fault_tolerance.launcher",
    "nvrx_eks.training.resilience.launch",
    # The kit's side of every script (the API and what it builds on the way to the first step) and the
    # reference trainer, the default entry point: all of it ships in the image.
    "nvrx_eks.training.inputs",
    "nvrx_eks.training.config",
    "nvrx_eks.training.api",
    "nvrx_eks.training.trainer",
    "nvrx_eks.training.entry",
    "nvrx_eks.training.checkpoint.factory",
    "nvrx_eks.training.checkpoint.tiered",
    "nvrx_eks.training.checkpoint.sync",
    # What a checkpoint's DCP files and a script's own parallelism import on first use (training/
    # parallel.py `preload` names the same for a process started without a forkserver): torch.save's
    # and torch.load's helpers, the latin-1 codec numpy's pickled RNG state needs, the profiler hook
    # DCP's writer reaches for, the state-dict API, the device mesh, FSDP2 and tensor parallelism.
    "encodings.latin_1",
    "torch.utils.serialization",
    "torch.profiler._cupti_monitor",
    "torch.distributed.checkpoint.state_dict",
    "torch.distributed.device_mesh",
    "torch.distributed.fsdp",
    "torch.distributed.tensor.parallel",
    "nvidia_resiliency_ext.inprocess",
    "prometheus_client",
    "psutil",
    # The in-process Wrapper forks its monitor process and talks to it through a queue; multiprocessing
    # unpickles each worker with its forkserver process object; a store client resolves its host.
    "multiprocessing.popen_fork",
    "multiprocessing.queues",
    "multiprocessing.popen_forkserver",
    "encodings.idna",
)
"""What the forkserver imports once, so that a worker forked from it imports nothing before its first
step (each start records what it did import: `startup_done`'s `imported_since_fork`). Every module a
worker imports itself is imported again at every restart by every rank of every node at once: NVRx's
launcher module, torch's worker wrapper and the checkpointer were most of a worker's start before they
were preloaded (docs/measurements.md). torch._dynamo: see training/parallel.py `preload` (an optimizer
or DDP imports it on first use; inside an attempt that import was slow and unsafe to interrupt)."""


S3_MODULES = ("boto3",)
"""What a trainer whose durable tier is on S3 imports before its first step: the SDK, for the credential
check at start (training/inputs.py) and the tier's client."""


def warm_modules(config: ResilienceConfig) -> list[str]:
    """`WARM_MODULES`, `S3_MODULES` when the job's configuration (the ranks' `NVRX_EKS_CONFIG`) puts the
    durable tier on S3, and the script's own preloads."""
    durable = config.checkpoint.durable_dir or ""
    preload = [m.strip() for m in os.environ.get(PRELOAD_ENV, "").split(",") if m.strip()]
    return [*WARM_MODULES, *(S3_MODULES if durable.startswith("s3://") else ()), *preload]


def entry_script() -> str:
    """The absolute path of training/entry.py, which runs the training script in the worker, wherever the
    kit is installed: `--run-path` wants a path."""
    return str(Path(__file__).resolve().parents[1] / "entry.py")


FORKSERVER_FORK_ENV = "NVRX_EKS_FORKSERVER_FORK"
"""Set (to 1) by a runtime that starts this launcher as a fork of an interpreter that has imported torch
and forked nothing yet, and that marks what the launcher forks as its pod's (the local executor's warm
runtime, localrun/warm.py): the forkserver is then a fork of this process (`fork_forkserver`), not a
fresh interpreter importing torch again. Read once and removed, so no worker inherits it."""

PRELOAD_ENV = "NVRX_EKS_PRELOAD"
"""Comma-separated modules a training script imports before its first step (the job values'
`entrypoint.preload`): the forkserver imports them once per pod instead of every worker at every start."""

ENTRY_SEPARATOR = "--"
"""On this wrapper's command line, where ft_launcher's flags end and the training script begins."""
USAGE = "python -m nvrx_eks.training.resilience.launch FT_LAUNCHER_FLAGS -- (-m MODULE | SCRIPT) [ARGS...]"


def launcher_argv(argv: list[str]) -> list[str]:
    """ft_launcher's arguments: the flags before `--`, then the training script after it (a fresh
    interpreter each) as `--run-path` (a callable in a worker forked from the warm forkserver):
    training/entry.py, which runs the module or the script."""
    if ENTRY_SEPARATOR not in argv:
        raise SystemExit(f"usage: {USAGE}")
    at = argv.index(ENTRY_SEPARATOR)
    flags, entry = argv[:at], argv[at + 1 :]
    if len(entry) >= 2 and entry[0] == "-m":  # noqa: PLR2004 - `-m` and the module
        run, rest = [entry_script(), "--module", entry[1]], entry[2:]
    elif entry and not entry[0].startswith("-"):
        run, rest = [entry_script(), "--script", entry[0]], entry[1:]
    else:
        raise SystemExit(f"usage: {USAGE}")
    start = [] if _flag(flags, "--start-method") is not None else ["--start-method=forkserver"]
    return [*flags, *start, "--run-path", *run, *rest]


def entry_of(ft_argv: list[str]) -> tuple[str, str] | None:
    """The training script `launcher_argv` hands to training/entry.py: ("module" | "script", its name or
    path); None for the reference trainer (or a command line that runs neither)."""
    if "--run-path" not in ft_argv:
        return None
    run = ft_argv[ft_argv.index("--run-path") + 1 :]
    if len(run) < 3 or run[0] != entry_script() or run[1] not in {"--module", "--script"}:  # noqa: PLR2004
        return None
    return run[1].removeprefix("--"), run[2]


def check_entry(ft_argv: list[str]) -> None:
    """UserError when the job's module or script cannot run here: said once, before any rank starts
    (each rank would say it again, after the rendezvous, in every pod)."""
    entry = entry_of(ft_argv)
    problem = entry_problem(*entry) if entry is not None else None
    if problem is not None:
        raise UserError(problem)


def warm_entry_imports(ft_argv: list[str]) -> tuple[Path, str] | None:
    """The entry point's top-level imports as a module for the forkserver (training/resilience/
    warm_entry.py): (its folder, its name), or None (the reference trainer, no imports, turned off)."""
    entry = entry_of(ft_argv)
    if entry is None or os.environ.get(PRELOAD_IMPORTS_ENV, "1") == "0":
        return None
    source = entry_source(*entry)
    if source is None:
        return None
    return write_warm_module(source, script_folder=source.parent if entry[0] == "script" else None)


def _own_args(argv: list[str]) -> list[str]:
    """ft_launcher's own arguments: those before the training script (`--` on this wrapper's command
    line, `--run-path` on ft_launcher's); what follows is the script's, whose flags may share a launcher
    flag's name."""
    for i, arg in enumerate(argv):
        if arg in (ENTRY_SEPARATOR, "--run-path", "--run_path"):
            return argv[:i]
    return argv


def _flag(argv: list[str], name: str) -> str | None:
    """The value of ft_launcher's flag `name` (`--name=V` or `--name V`; with dashes or, as argparse in
    ft_launcher also accepts, underscores), or None when it is not given."""
    spellings = {name, "--" + name.removeprefix("--").replace("-", "_")}
    own = _own_args(argv)
    for i, arg in enumerate(own):
        flag, eq, value = arg.partition("=")
        if flag in spellings:
            if eq:
                return value
            if i + 1 < len(own):
                return own[i + 1]
    return None


STOPPED_EXIT_CODES = frozenset({-15, 143})
"""A worker's exit status when its own launcher stopped it with SIGTERM (-15 as torch's process context
reports a signal, 143 = 128 + 15 through a shell) to restart or leave the group after a peer failed.
Nothing else in a job sends a rank SIGTERM: NVRx's rank monitor ends a hung rank with SIGKILL (its
default `rank_termination_signal`, which the kit keeps), the kernel's OOM killer sends SIGKILL, and a
pod's deletion is a disruption the Job never charges."""
COLLATERAL_EXIT_CODE = 76
"""This launcher's exit when every worker failure it saw was its own stop of them (`is_collateral`):
distinct from ft_launcher's 1, from the configuration error's 2, from the self-check's node problem 75
and from the 128 + N of a signal."""


NO_RESTART_EXIT_CODE = 93
"""ft_launcher's exit when NVRx decided the job must not restart (its DEFAULT_NO_RESTART_EXIT_CODE; a
test checks they agree): every launcher of the job exits with it, and the Job fails at once."""


def is_collateral(failures: dict[int, Any]) -> bool:
    """Whether every failed worker (global rank -> ProcessFailure) was stopped by its own launcher."""
    return bool(failures) and all(f.exitcode in STOPPED_EXIT_CODES for f in failures.values())


def exit_status(code: object, failures: dict[int, Any]) -> object:
    """ft_launcher's exit status, with its 1 for workers that were only stopped (collateral) replaced by
    `COLLATERAL_EXIT_CODE`; every other status as it was."""
    return COLLATERAL_EXIT_CODE if code == 1 and is_collateral(failures) else code


def start_method(ft_argv: list[str]) -> str | None:
    """The start method ft_launcher will use for the workers, as the command line gives it (None: its
    default)."""
    return _flag(ft_argv, "--start-method")


STORE_CONNECT_S = 30.0
"""How long the hand-over waits for the store (its pod may be starting with the job)."""
REOPEN_POLL_S = 0.5
DEFAULT_JOIN_TIMEOUT_S = 600.0
"""torch's c10d rendezvous default, when `--rdzv-conf` gives no join_timeout."""


def hand_over(ft_argv: list[str]) -> None:
    """A pod's start: wait past a rendezvous closed for good (`open_rendezvous_store`), then open the next
    round if this pod's predecessor trained in the newest one (training/resilience/nvrx_compat.py
    `open_round_for_lost_predecessor`). Best effort: anything unexpected is reported, and the agent then
    joins as NVRx alone would."""
    pod, nnodes = _pod_in_rendezvous(ft_argv), _flag(ft_argv, "--nnodes")
    if pod is None or not nnodes:
        return
    endpoint, run_id, infra_rank = pod
    from nvrx_eks.training.resilience.nvrx_compat import open_round_for_lost_predecessor  # noqa: PLC0415

    try:
        store = open_rendezvous_store(endpoint, run_id=run_id, wait_s=_join_timeout_s(ft_argv))
        opened = open_round_for_lost_predecessor(
            store, run_id=run_id, infra_rank=infra_rank, active_nodes=int(nnodes.partition(":")[0])
        )
    except Exception as exc:  # noqa: BLE001 - the hand-over is an optimisation of NVRx's own path
        say(f"rendezvous hand-over skipped: {type(exc).__name__}: {exc}")
        return
    if opened is not None:
        say(f"opened rendezvous round {opened}: this pod's predecessor trained in the last one")


def open_rendezvous_store(endpoint: str, *, run_id: str, wait_s: float) -> Any:  # noqa: ANN401 - a TCPStore
    """A client of the rendezvous store at `endpoint` whose rendezvous `run_id` is not closed for good,
    waiting up to `wait_s` for one; after that, the store as it is (NVRx then fails the join as before).

    When every launcher of a job has ended (a worker group's failure with no restart left), NVRx marks the
    rendezvous shut down and its control process exits a few seconds later, so that the launchers read
    the final state; the store's Deployment then restarts it empty, where the Job's replacement pods
    form a fresh rendezvous. A replacement that starts within those seconds would join the closed one
    and fail at once (`RendezvousClosedError`), one more failure charged to its index for no fault of
    its own. A new launcher never belongs in a rendezvous closed before it started: it waits for the
    store's restart (the old store's connections break, a new one answers, open)."""
    from datetime import timedelta  # noqa: PLC0415

    from torch.distributed import TCPStore  # noqa: PLC0415

    from nvrx_eks.training.resilience.nvrx_compat import barrier_state  # noqa: PLC0415

    host, _, port = endpoint.rpartition(":")
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=STORE_CONNECT_S))
        try:
            if not barrier_state(store, run_id=run_id).is_shutdown() or time.monotonic() >= deadline:
                return store
        except RuntimeError:  # torch's store errors: the closed store went away as we asked
            if time.monotonic() >= deadline:
                raise
        if not said:
            say(f"rendezvous {run_id} at {endpoint} is closed for good; waiting for the store's restart")
            said = True
        time.sleep(REOPEN_POLL_S)


def _join_timeout_s(ft_argv: list[str]) -> float:
    """The rendezvous join timeout `--rdzv-conf` gives (join_timeout=S), else torch's default."""
    for item in (_flag(ft_argv, "--rdzv-conf") or "").split(","):
        key, _, value = item.partition("=")
        if key.strip() == "join_timeout" and value.strip().replace(".", "", 1).isdigit():
            return float(value)
    return DEFAULT_JOIN_TIMEOUT_S


def beat(ft_argv: list[str]) -> LauncherBeat | None:
    """Prove to the control process, for as long as this launcher lives, that this pod's node can still
    rejoin a restart round, and restart the job as soon as the peer this node watches is lost
    (training/resilience/launcher_liveness.py)."""
    pod = _pod_in_rendezvous(ft_argv)
    if pod is None:
        return None
    endpoint, run_id, infra_rank = pod
    nnodes = _flag(ft_argv, "--nnodes") or ""
    active = nnodes.partition(":")[0]
    return LauncherBeat(
        endpoint, run_id=run_id, infra_rank=infra_rank, active_nodes=int(active) if active.isdigit() else None
    ).start()


def _pod_in_rendezvous(ft_argv: list[str]) -> tuple[str, str, int] | None:
    """The store endpoint, the run id and this pod's infra rank (its Job index, GROUP_RANK), or None
    when the command line or the environment does not name all three."""
    endpoint, run_id = _flag(ft_argv, "--rdzv-endpoint"), _flag(ft_argv, "--rdzv-id")
    infra_rank = os.environ.get("GROUP_RANK")
    if not (endpoint and run_id and infra_rank and infra_rank.isdigit()):
        return None
    return endpoint, run_id, int(infra_rank)


def start_forkserver(ft_argv: list[str], preload: list[str], *, fork: bool = False) -> Path | None:
    """Start the forkserver now, not at the first worker (its imports overlap this process's and the
    rendezvous), importing `preload` (the launcher's: `warm_modules`) and the entry point's own imports
    (`warm_entry_imports`); `fork`: as a fork of this process (`FORKSERVER_FORK_ENV`). Returns the
    folder of the module written for the entry point's imports, if one was."""
    preload = list(preload)
    warm = warm_entry_imports(ft_argv)
    if warm is not None:
        # The forkserver is a fresh `python -c`: it finds modules on PYTHONPATH, not on this process's
        # sys.path. Appended: nothing but the one generated module is there to shadow anything.
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (os.environ.get("PYTHONPATH"), str(warm[0])) if p
        )
        preload.append(warm[1])
    multiprocessing.set_forkserver_preload(preload)
    if fork and threading.active_count() == 1:
        if warm is not None:
            sys.path.append(str(warm[0]))  # what PYTHONPATH gives a fresh interpreter
        fork_forkserver(preload)
    multiprocessing.forkserver.ensure_running()
    return warm[0] if warm is not None else None


def fork_forkserver(preload: list[str]) -> None:
    """multiprocessing's `ForkServer.ensure_running` with the server forked from this process, which has
    imported torch already, instead of started as a fresh interpreter: the same listener, "alive" pipe
    and `forkserver.main`, which imports `preload` (what is imported already costs nothing) and then
    forks each worker. Only while this process has one thread: a fork copies no other thread's locks.
    The child keeps only its two descriptors and the standard streams, as `spawnv_passfds` leaves it."""
    from multiprocessing import connection, resource_tracker, spawn, util  # noqa: PLC0415

    server = multiprocessing.forkserver._forkserver  # noqa: SLF001
    resource_tracker.ensure_running()
    data = {k: v for k, v in spawn.get_preparation_data("ignore").items() if k in {"main_path", "sys_path"}}
    with socket.socket(socket.AF_UNIX) as listener:
        address = connection.arbitrary_address("AF_UNIX")  # type: ignore[attr-defined]
        listener.bind(address)
        if not util.is_abstract_socket_namespace(address):
            Path(address).chmod(0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()
        for stream in (sys.stdout, sys.stderr):  # or every worker would write what they hold again
            stream.flush()
        pid = os.fork()
        if pid == 0:
            keep = sorted({0, 1, 2, listener.fileno(), alive_r})
            for low, high in itertools.pairwise([-1, *keep, os.sysconf("SC_OPEN_MAX")]):
                if high > low + 1:  # closerange(n, n) would close from n up, past every kept one
                    os.closerange(low + 1, high)
            _threads_as_the_environment_says()
            code = 0
            try:
                multiprocessing.forkserver.main(listener.fileno(), alive_r, preload, **data)
            except SystemExit as exc:  # the server's end once every client is gone
                code = exc.code if isinstance(exc.code, int) else 0
            except BaseException:  # noqa: BLE001 - reported as a fresh interpreter would, then exit 1
                traceback.print_exc()
                code = 1
            os._exit(code)
        os.close(alive_r)
    # What `ensure_running` records, so that it and every worker's start find this server running.
    server._forkserver_address = address  # type: ignore[attr-defined]  # noqa: SLF001
    server._forkserver_alive_fd = alive_w  # type: ignore[attr-defined]  # noqa: SLF001
    server._forkserver_pid = pid  # type: ignore[attr-defined]  # noqa: SLF001


def _threads_as_the_environment_says() -> None:
    """torch sizes its intra-op thread pool from OMP_NUM_THREADS when it is imported; a fork keeps the
    size its parent's environment gave (a warm interpreter's, not the pod's): size it as a fresh
    interpreter with this environment would (two threads per rank on a core each oversubscribe)."""
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch  # noqa: PLC0415 - imported already: this process is a warm fork

        torch.set_num_threads(int(threads))


def main() -> None:
    check_supported_nvrx()
    # Defence in depth for GPU nodes: should anything in the forkserver ask torch for the device count,
    # PyTorch answers from NVML instead of initialising the CUDA driver, which a fork cannot inherit
    # (tests/training/test_training_launch.py checks that nothing asks).
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    ft_argv = launcher_argv(sys.argv[1:])
    fork = os.environ.pop(FORKSERVER_FORK_ENV, "") == "1"
    with exit_on_user_error():
        config = config_from_env()
        check_entry(ft_argv)
    # One run's identity for every rank this launcher starts, at every restart (training/run_scope.py):
    # the chart's (the Job's UID), else this launch's own. Set before the forkserver copies the environment.
    os.environ.setdefault(RUN_ID_ENV, uuid.uuid4().hex[:12])
    pod = _pod_in_rendezvous(ft_argv)
    if pod is not None and config.shrink.enabled:  # a shrunk job's ranks report durable steps to it
        os.environ[RENDEZVOUS_ENV] = f"{pod[0]}/{pod[1]}"
    if start_method(ft_argv) == "forkserver":
        start_forkserver(ft_argv, warm_modules(config), fork=fork)
        keep_launcher_process_group()
    hand_over(ft_argv)
    alive = beat(ft_argv)
    report_every_failed_worker()
    stop_on_user_error(USER_ERROR_EXIT_CODE)
    train_at_the_rounds_size()
    format_tracebacks_without_dynamo()
    poll_rendezvous_faster()
    failures = capture_worker_failures()
    from nvidia_resiliency_ext.fault_tolerance.launcher import main as ft_launcher  # noqa: PLC0415

    try:
        ft_launcher(ft_argv)
    except SystemExit as exc:  # ft_launcher always ends in sys.exit
        if alive is not None:
            alive.finish(done=exc.code in (0, None))
        raise SystemExit(exit_status(exc.code, failures)) from None
    finally:
        if failures:  # last, short: what the pod's termination message keeps (k8s/termination.py)
            say(f"worker failures: {failure_summary(failures)}")


def failure_summary(failures: dict[int, Any]) -> str:
    """`{rank: ProcessFailure(...)}` with each entry short: the exit code and the rank's reason (or its
    signal), in one line."""

    def said(failure: Any) -> str:  # noqa: ANN401 - torch's ProcessFailure
        if failure.exitcode < 0:  # torch's "Signal 9 (SIGKILL) received by PID ..."
            return str(failure.message).strip().splitlines()[0][:160] if str(failure.message).strip() else ""
        return rank_reason(failure)[:160].replace("'", "")

    entries = [
        f"{rank}: ProcessFailure(local_rank={f.local_rank}, pid={f.pid}, exitcode={f.exitcode}, "
        f"message='{said(f)}')"
        for rank, f in sorted(failures.items())
    ]
    return "{" + ", ".join(entries) + "}"


if __name__ == "__main__":
    main()
