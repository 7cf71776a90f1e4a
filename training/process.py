"""The frame of one training process under the kit: what `Job.run` builds once and closes on every path.

The world, the event log, the process-group store, the resilience layers, the metrics and the
checkpointer are built here, then the script's training function is called inside the layers (NVRx's
in-process `Wrapper`, ft_launcher's rank monitor), once per attempt. A failure seen before -- the same
type, message and place at the same step -- is the script's bug, not a fault: it ends the job with its
traceback (`UserCodeError`, exit 2) instead of spending every restart budget on it.
"""

from __future__ import annotations

import gc
import os
import time
import traceback
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.training import failures, parallel
from nvrx_eks.training.attempt import AttemptRun, Context, Record
from nvrx_eks.training.events import EventLog, process_created_at
from nvrx_eks.training.faults import InjectedFaultError
from nvrx_eks.training.metrics import Metrics, checkpoint_intervals
from nvrx_eks.training.resilience.config import RENDEZVOUS_ENV
from nvrx_eks.training.resilience.launcher_liveness import DurableReport
from nvrx_eks.training.resilience.layers import for_mode, install_termination_handler
from nvrx_eks.training.run_scope import RunScope

if TYPE_CHECKING:
    from collections.abc import Callable

    from nvrx_eks.training.checkpoint.base import Checkpointer
    from nvrx_eks.training.checkpoint.config import CheckpointConfig
    from nvrx_eks.training.parallel import World
    from nvrx_eks.training.resilience.config import ResilienceConfig


class UserCodeError(UserError):
    """A rank of the training script failed the same way in two attempts at the same step: a bug, not a
    fault (training/failures.py). Its message is one line; `details` holds the traceback."""


def run_process(
    cfg: ResilienceConfig,
    *,
    record: Record,
    tokens_per_step: int,
    meta: dict[str, Any],
    attempt: Callable[[AttemptRun], object],
) -> str | None:
    """Run the script's training function (`attempt` calls it with the public view of one
    `AttemptRun`) under the configured layers until it returns; the final parameters' sha256."""
    world = parallel.detect_world(cfg.dist.device)
    events = EventLog(run_dir=cfg.run_dir, rank=world.rank)
    events.emit(
        "process_start",
        mode=cfg.mode,
        world_size=world.world_size,
        local_rank=world.local_rank,
        # When the OS created this process: a restart's worker-start phase begins here, before the
        # interpreter and the imports that precede this event (localrun.summary.FaultPhases).
        created_t=process_created_at(),
        **{k: v for k, v in meta.items() if k not in {"mode", "steps"}},
    )
    install_termination_handler(events)
    started = time.time()
    marks: dict[str, float] = {}  # where setup went: seconds per part, in process_ready
    parallel.preload()  # before any timeout or restart machinery is armed (see its docstring)
    marks["preload_s"] = time.time() - started
    store = parallel.base_store(world, cfg.collective_timeout_s)
    scope = record.scope = RunScope.start(cfg, store=store, rank=world.rank)
    resilience = for_mode(cfg, events, store=store, world=world)
    marks["layers_s"] = time.time() - started - sum(marks.values())
    checkpointer: Checkpointer | None = None
    metrics: Metrics | None = None
    try:
        metrics = Metrics(
            run_dir=cfg.run_dir,
            rank=world.rank,
            every=cfg.metrics.textfile_every,
            port=cfg.metrics.prometheus_port,
            local_rank=world.local_rank,
            tokens_per_step=tokens_per_step,
            restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
            checkpoint_intervals=checkpoint_intervals(cfg.effective_checkpoint()),
        )
        events.subscribe(metrics.observe)
        report = durable_report(cfg, world)
        if report is not None:
            events.subscribe(report)
        checkpointer = _make_checkpointer(scope.checkpoint, world, events)
        ctx = Context(
            cfg=cfg,
            world=world,
            store=store,
            events=events,
            resilience=resilience,
            checkpointer=checkpointer,
            metrics=metrics,
            meta=meta,
        )
        marks["trainer_s"] = time.time() - started - sum(marks.values())
        # NVRx collects garbage until nothing is left before each in-process restart; frozen objects
        # are never scanned, and nothing built so far is garbage.
        gc.freeze()
        marks["gc_s"] = time.time() - started - sum(marks.values())
        events.emit("process_ready", setup_s=time.time() - started, cpu_s=time.process_time(), **marks)
        digest: str | None = resilience.wrap(lambda: _attempt(ctx, record, attempt))()
    finally:
        if metrics is not None:
            metrics.write()
        # Training is over: the launcher stops expecting heartbeats before the checkpointer's last
        # persists and the teardown, which may take longer than a heartbeat timeout.
        resilience.close()
        if checkpointer is not None:
            checkpointer.close()
        # The script's objects go before the groups: a DDP model's hooks hold its reducer, and the
        # reducer its process group, which must not outlive the interpreter (parallel.py
        # `release_retired_groups`: a gloo group torn down at exit aborts the process).
        record.kept = None
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()
        parallel.release_retired_groups()
    events.emit("process_end", wall_s=time.time() - started)
    events.close()
    return digest


def durable_report(cfg: ResilienceConfig, world: World) -> DurableReport | None:
    """The listener that tells the control process this rank's durable steps, in a job that runs shrunk
    and whose launcher handed over the store (launcher_liveness.py `DurableReport`); else None."""
    handed = os.environ.get(RENDEZVOUS_ENV, "")
    endpoint, _, run_id = handed.partition("/")
    full = cfg.shrink.nodes * world.local_world_size
    if not (cfg.shrink.enabled and endpoint and run_id and world.world_size < full):
        return None
    return DurableReport(endpoint, run_id=run_id, rank=world.rank, world_size=world.world_size)


def _make_checkpointer(checkpoint: CheckpointConfig, world: World, events: EventLog) -> Checkpointer:
    """The configured checkpointer (the run's own memory folder: training/run_scope.py). No fallback: a
    tier that cannot start fails the rank with its error, never a silent downgrade to a slower
    implementation."""
    from nvrx_eks.training.checkpoint import build_checkpointer  # noqa: PLC0415

    def on_event(kind: str, fields: dict[str, Any]) -> None:
        events.emit(kind if kind.startswith("checkpoint") else f"checkpoint_{kind}", **fields)

    return build_checkpointer(
        checkpoint,
        rank=world.rank,
        world_size=world.world_size,
        # The node's rank in this rendezvous round (torchelastic's GROUP_RANK), not the pod's Job index:
        # with warm spares any index may hold any node rank.
        node_index=int(os.environ.get("GROUP_RANK", os.environ.get("JOB_COMPLETION_INDEX", "0"))),
        device=world.device,
        on_event=on_event,
    )


def _attempt(ctx: Context, record: Record, attempt: Callable[[AttemptRun], object]) -> str | None:
    run = AttemptRun(ctx, record)
    run.start()
    try:
        attempt(run)
    except UserError:
        raise
    except Exception as exc:
        judge(ctx, record, run, exc)
        ctx.resilience.attempt_failed()
        raise
    return run.finish()


def judge(ctx: Context, record: Record, run: AttemptRun, exc: BaseException) -> None:
    """A failure this rank saw in an earlier attempt at the same step, with the same type, message and
    place, is the script's bug: end the job instead of restarting into it again. A first failure is
    always retried (training/failures.py)."""
    if isinstance(exc, InjectedFaultError) or failures.is_restart_interrupt(exc):
        return
    in_step = run.step is not None
    step = run.step if run.step is not None else run.last_done
    run_id = record.scope.run_id if record.scope is not None else "unscoped"
    history = failures.History(ctx.cfg.run_dir, run_id=run_id, rank=ctx.world.rank)
    signature = failures.signature(exc, step=step)
    seen = history.seen(signature)
    history.add(signature)
    if seen:
        text = "".join(traceback.format_exception(exc))[-4000:]
        ctx.events.emit("user_code_error", step=step, error=failures.describe(exc), traceback=text)
        error = UserCodeError(failures.bug_message(exc, rank=ctx.world.rank, step=step if in_step else None))
        error.details = text
        raise error from None
