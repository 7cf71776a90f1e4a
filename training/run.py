"""Build the parts for this process from the config and run the (wrapped) loop."""

from __future__ import annotations

import gc
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from training import parallel
from training.events import EventLog, process_created_at
from training.faults import FaultInjector, build_schedule
from training.metrics import Metrics, checkpoint_intervals
from training.resilience.layers import for_mode, install_termination_handler
from training.shapes import PRESETS
from training.trainer import Trainer

if TYPE_CHECKING:
    from training.checkpoint.base import Checkpointer
    from training.config import TrainConfig

log = logging.getLogger("training")


def make_checkpointer(cfg: TrainConfig, world: parallel.World, events: EventLog) -> Checkpointer:
    from training.checkpoint import build_checkpointer  # noqa: PLC0415

    def on_event(kind: str, fields: dict[str, Any]) -> None:
        events.emit(kind if kind.startswith("checkpoint") else f"checkpoint_{kind}", **fields)

    config = cfg.effective_checkpoint()
    kwargs: dict[str, Any] = {
        "rank": world.rank,
        "world_size": world.world_size,
        # The node's rank in this rendezvous round (torchelastic's GROUP_RANK), not the pod's Job index:
        # with warm spares any index may hold any node rank (k8s/values.py `spares`).
        "node_index": int(os.environ.get("GROUP_RANK", os.environ.get("JOB_COMPLETION_INDEX", "0"))),
        "device": world.device,
        "on_event": on_event,
    }
    try:
        return build_checkpointer(config, **kwargs)
    except ImportError:
        # A trainer build without the tiered checkpointer falls back to the synchronous one.
        log.warning("tiered checkpointer unavailable; using the synchronous one")
        return build_checkpointer(config.model_copy(update={"implementation": "sync"}), **kwargs)


def run(cfg: TrainConfig) -> str | None:
    world = parallel.detect_world(cfg.dist.device)
    events = EventLog(run_dir=cfg.run_dir, rank=world.rank)
    events.emit(
        "process_start",
        mode=cfg.mode,
        world_size=world.world_size,
        local_rank=world.local_rank,
        model=cfg.model,
        steps=cfg.steps,
        # When the OS created this process: a restart's worker-start phase begins here, before the
        # interpreter and the imports that precede this event (training.metrics.FaultPhases).
        created_t=process_created_at(),
    )
    install_termination_handler(events)
    started = time.time()
    marks: dict[str, float] = {}  # where setup went: seconds per part, in process_ready
    parallel.preload()  # before any timeout or restart machinery is armed (see its docstring)
    marks["preload_s"] = time.time() - started
    store = parallel.base_store(world, cfg.collective_timeout_s)
    resilience = for_mode(cfg, events, store=store, world=world)
    marks["layers_s"] = time.time() - started - sum(marks.values())
    checkpointer: Checkpointer | None = None
    trainer: Trainer | None = None
    # Everything built below is closed on every path. An exception between starting the
    # checkpointer's background workers and the loop once left them to NVRx's PersistentAsyncCaller
    # __del__ at interpreter exit, which joins the worker's queue forever when the worker never came
    # up: the rank printed a traceback and never exited.
    try:
        metrics = Metrics(
            run_dir=cfg.run_dir,
            rank=world.rank,
            every=cfg.metrics.textfile_every,
            port=cfg.metrics.prometheus_port,
            local_rank=world.local_rank,
            tokens_per_step=cfg.data.batch_size * PRESETS[cfg.model].seq_len,
            restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
            checkpoint_intervals=checkpoint_intervals(cfg.effective_checkpoint()),
        )
        events.subscribe(metrics.observe)
        schedule = build_schedule(cfg.faults, steps=cfg.steps, world_size=world.world_size, seed=cfg.seed)
        checkpointer = make_checkpointer(cfg, world, events)
        trainer = Trainer(
            cfg,
            world=world,
            store=store,
            events=events,
            resilience=resilience,
            checkpointer=checkpointer,
            injector=FaultInjector(
                schedule=schedule,
                rank=world.rank,
                run_dir=cfg.run_dir,
                mode=cfg.mode,
                events=events,
                grace_s=cfg.faults.node_loss_grace_s,
            ),
            metrics=metrics,
        )
        marks["trainer_s"] = time.time() - started - sum(marks.values())
        # NVRx collects garbage until nothing is left before each in-process restart; frozen objects
        # are never scanned. No gc.collect() first: measured 0.18 CPU-s per rank after the imports,
        # finding 4 unreachable objects -- on every launcher restart, 4 ranks on 2 cores.
        gc.freeze()
        marks["gc_s"] = time.time() - started - sum(marks.values())
        events.emit("process_ready", setup_s=time.time() - started, cpu_s=time.process_time(), **marks)
        digest = resilience.wrap(trainer.run)()
    finally:
        if trainer is not None:
            trainer.metrics.write()
        # Training is over: the launcher stops expecting heartbeats before the checkpointer's last
        # persists and the teardown, which may take longer than a heartbeat timeout.
        resilience.close()
        if checkpointer is not None:
            checkpointer.close()
        if parallel.dist.is_initialized():
            parallel.dist.destroy_process_group()
        parallel.release_retired_groups()
    events.emit("process_end", wall_s=time.time() - started)
    events.close()
    return digest
