"""The kit's resilience for any PyTorch training loop: the public API, and the only one.

A training script -- the reference trainer (training/trainer.py) or a user's own -- gets every layer
of the kit through two objects: a `Job`, built once per process, and the `Attempt` it hands to the
script's training function each time it (re)starts it::

    from nvrx_eks.training import api as kit

    def train(attempt: kit.Attempt) -> None:
        model = attempt.data_parallel(build_model())   # instead of DistributedDataParallel(model)
        optimizer = torch.optim.AdamW(model.parameters())
        attempt.resume(model=model, optimizer=optimizer, data=loader)   # newest state, nearest tier
        for step in attempt.steps(num_steps):          # heartbeats, checkpoints, events, faults
            loss = model(**loader.next_batch()).loss
            loss.backward()
            with attempt.update(loss=loss):            # gradients averaged; a restart never lands inside
                optimizer.step()

    kit.Job().run(train)                               # instead of train(); no init_process_group

What each call gives, whatever the mode (`ResilienceConfig.mode`):

- `Job.run(train)` checks the runtime inputs (exit 2 with one message on every rank before any
  collective), starts the event log, the metrics, the tiered checkpointer and the resilience layers,
  then calls `train` inside NVRx's in-process `Wrapper` (modes inprocess/both) and ft_launcher's rank
  monitor (modes ft_launcher/both). A soft fault (an exception, a hang the watchdog sees) re-enters
  `train` in the same process with a new process group; a hard fault is ft_launcher's; a lost node is
  the Job controller's. The same exception at the same step after a restart is a bug, not a fault: it
  ends the job once, with its traceback (`UserCodeError`, exit 2), instead of spending every budget.
- `Attempt.resume(**objects)` takes the training state as PyTorch's `Stateful` protocol: anything with
  `state_dict()` / `load_state_dict()` -- modules, optimizers, LR schedulers, a data loader's position.
  It restores them from the nearest place that has the newest step every rank can load: the previous
  attempt's objects in memory (in-process restart: nothing left the process), a partner's RAM, local
  disk, durable storage. RNG states (torch, CUDA, NumPy, Python) are part of the state, saved and
  restored with it.
- `Attempt.steps(n)` yields the steps left. At the start of each it zeroes the tracked optimizers'
  gradients and fires the fault schedule's faults; at its end the checkpointer takes what is due, the
  layers get their heartbeat, and the step is recorded (events, Prometheus, goodput).
- `Attempt.update()` is the step's one state change: it averages the gradients (CPU: one flat
  all-reduce in a fixed layout, so a resumed run is bit-identical to an uninterrupted one), clips them
  on request, waits for the previous snapshot's copy, and runs the body as one unit an in-process
  restart never splits.

Modules and optimizers must change only inside `update()`; everything else tracked (a loader, a
scheduler) is captured at the end of every step, so a restart re-enters exactly at a step boundary.
"""

from __future__ import annotations

import contextlib
import copy
import faulthandler
import gc
import hashlib
import json
import logging
import os
import random
import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import torch
import torch.distributed as dist

from nvrx_eks.kitcore import supervisor
from nvrx_eks.kitcore.configio import UserError, exit_on_user_error
from nvrx_eks.training import failures, parallel
from nvrx_eks.training.checkpoint.floor import copy_bandwidth, state_bytes
from nvrx_eks.training.events import EventLog, imported_since_fork, process_created_at
from nvrx_eks.training.faults import FaultInjector, InjectedFaultError, build_schedule
from nvrx_eks.training.inputs import check_runtime_inputs
from nvrx_eks.training.metrics import Metrics, checkpoint_intervals
from nvrx_eks.training.resilience.config import (
    CONFIG_ENV,
    ResilienceConfig,
    check_fault_plan,
    config_from_json,
)
from nvrx_eks.training.resilience.layers import for_mode, install_termination_handler
from nvrx_eks.training.run_scope import RunScope, resumed_line

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence

    from nvrx_eks.training.checkpoint.base import Checkpointer
    from nvrx_eks.training.checkpoint.config import CheckpointConfig
    from nvrx_eks.training.parallel import World
    from nvrx_eks.training.resilience.layers import Resilience

__all__ = [
    "CONFIG_ENV",
    "Attempt",
    "Job",
    "ResilienceConfig",
    "Stateful",
    "UserCodeError",
    "UserError",
    "load_config",
]

RESERVED_NAMES = frozenset({"rng", "progress", "resilience"})
"""Keys of the checkpoint the kit writes itself beside the tracked objects."""

log = logging.getLogger("training")


@runtime_checkable
class Stateful(Protocol):
    """torch.distributed.checkpoint.stateful.Stateful: what `Attempt.resume` tracks."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> Any: ...  # noqa: ANN401 - modules return a report


class UserCodeError(UserError):
    """A rank of the training script failed the same way in two attempts at the same step: a bug, not a
    fault (training/failures.py). Its message is one line; `details` holds the traceback."""


def load_config(env: dict[str, str] | None = None) -> ResilienceConfig:
    """The job's configuration from `NVRX_EKS_CONFIG` (set by the chart), else the defaults."""
    raw = (os.environ if env is None else env).get(CONFIG_ENV)
    return config_from_json(raw, source=CONFIG_ENV) if raw else ResilienceConfig()


@dataclass
class _Kept:
    """What an attempt leaves for the next one in this process: the tracked objects and the state of
    the last step boundary."""

    objects: dict[str, Any]
    last_done: int
    light: dict[str, Any]
    rng: dict[str, Any]
    buffers: dict[str, dict[str, torch.Tensor]]


@dataclass
class _JobState:
    kept: _Kept | None = None
    scope: RunScope | None = None
    """The run this process belongs to (training/run_scope.py), once its store is known."""
    injector: FaultInjector | None = None
    attempts: int = 0


class Job:
    """One training process under the kit: build once, then `run(train)`."""

    def __init__(
        self,
        config: ResilienceConfig | None = None,
        *,
        input_checks: Sequence[Callable[[], list[str]]] = (),
        tokens_per_step: int = 0,
        meta: dict[str, Any] | None = None,
    ) -> None:
        """`config`: default `load_config()` (the job's `NVRX_EKS_CONFIG`). `input_checks`: the script's
        own runtime checks (each returns problems as text), reported with the kit's in one message
        before anything starts. `tokens_per_step` feeds the throughput metric. `meta`: small facts a
        checkpoint must match to resume (e.g. a model preset), compared key by key."""
        with exit_on_user_error():
            self.config = config if config is not None else load_config()
        self.input_checks = tuple(input_checks)
        self.tokens_per_step = tokens_per_step
        self.meta = dict(meta or {})
        self._state = _JobState()

    def run(self, train: Callable[[Attempt], object]) -> str | None:
        """Run `train` under the configured layers until it returns; the final parameters' sha256.

        Exits 2 with one message for bad input and for a bug in `train` (the same exception at the same
        step twice); every other exception is a fault for the layers to recover."""
        with exit_on_user_error():
            problems = [p for check in self.input_checks for p in check()]
            check_runtime_inputs(self.config, more=problems)
        # A worker killed by a signal (SIGSEGV, SIGABRT, the watchdog's SIGKILL excepted) leaves its
        # Python stacks in the launcher's log: the only trace a crash below Python gives.
        faulthandler.enable(all_threads=True)
        if not logging.getLogger().handlers:
            logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        with exit_on_user_error():
            try:
                digest = _Process(self, train).run()
            except UserError:
                self._release()  # bad input or a bug ends the job: this rank is done for good
                raise
            except Exception as exc:
                # A fault for the launcher to restart: its summary names it in the kit's words.
                supervisor.tell(failures.describe(exc), details=traceback.format_exc())
                raise
            self._release()
            return digest

    def _release(self) -> None:
        if self._state.scope is not None:
            self._state.scope.release()


class _Process:
    """Everything one process builds for a Job, closed on every path."""

    def __init__(self, job: Job, train: Callable[[Attempt], object]) -> None:
        self.job = job
        self.cfg = job.config
        self.train = train

    def run(self) -> str | None:

        cfg = self.cfg
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
            **{k: v for k, v in self.job.meta.items() if k not in {"mode", "steps"}},
        )
        install_termination_handler(events)
        started = time.time()
        marks: dict[str, float] = {}  # where setup went: seconds per part, in process_ready
        parallel.preload()  # before any timeout or restart machinery is armed (see its docstring)
        marks["preload_s"] = time.time() - started
        store = parallel.base_store(world, cfg.collective_timeout_s)
        scope = self.job._state.scope = RunScope.start(cfg, store=store, rank=world.rank)  # noqa: SLF001
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
                tokens_per_step=self.job.tokens_per_step,
                restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
                checkpoint_intervals=checkpoint_intervals(cfg.effective_checkpoint()),
            )
            events.subscribe(metrics.observe)
            checkpointer = _make_checkpointer(scope.checkpoint, world, events)
            context = _Context(
                job=self.job,
                cfg=cfg,
                world=world,
                store=store,
                events=events,
                resilience=resilience,
                checkpointer=checkpointer,
                metrics=metrics,
            )
            marks["trainer_s"] = time.time() - started - sum(marks.values())
            # NVRx collects garbage until nothing is left before each in-process restart; frozen objects
            # are never scanned, and nothing built so far is garbage.
            gc.freeze()
            marks["gc_s"] = time.time() - started - sum(marks.values())
            events.emit("process_ready", setup_s=time.time() - started, cpu_s=time.process_time(), **marks)
            digest: str | None = resilience.wrap(lambda: context.attempt(self.train))()
        finally:
            if metrics is not None:
                metrics.write()
            # Training is over: the launcher stops expecting heartbeats before the checkpointer's last
            # persists and the teardown, which may take longer than a heartbeat timeout.
            resilience.close()
            if checkpointer is not None:
                checkpointer.close()
            if dist.is_initialized():
                dist.destroy_process_group()
            parallel.release_retired_groups()
        events.emit("process_end", wall_s=time.time() - started)
        events.close()
        return digest


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


@dataclass
class _Context:
    """The process's parts, shared by its attempts."""

    job: Job
    cfg: ResilienceConfig
    world: World
    store: Any
    events: EventLog
    resilience: Resilience
    checkpointer: Checkpointer
    metrics: Metrics

    def attempt(self, train: Callable[[Attempt], object]) -> str | None:
        state = self.job._state  # noqa: SLF001 - the Job's own record across attempts
        attempt = Attempt(self, number=state.attempts)
        state.attempts += 1
        attempt._start()  # noqa: SLF001
        try:
            train(attempt)
        except UserError:
            raise
        except Exception as exc:
            self._judge(attempt, exc)
            raise
        return attempt._finish()  # noqa: SLF001

    def _judge(self, attempt: Attempt, exc: BaseException) -> None:
        """A failure this rank saw in an earlier attempt at the same step, with the same type, message and
        place, is the script's bug: end the job instead of restarting into it again. A first failure is
        always retried (training/failures.py)."""

        if isinstance(exc, InjectedFaultError) or failures.is_restart_interrupt(exc):
            return
        in_step = attempt._step is not None  # noqa: SLF001
        step = attempt._step if attempt._step is not None else attempt.last_done  # noqa: SLF001
        scope = self.job._state.scope  # noqa: SLF001
        run_id = scope.run_id if scope is not None else "unscoped"
        history = failures.History(self.cfg.run_dir, run_id=run_id, rank=self.world.rank)
        signature = failures.signature(exc, step=step)
        seen = history.seen(signature)
        history.add(signature)
        if seen:
            text = "".join(traceback.format_exception(exc))[-4000:]
            self.events.emit("user_code_error", step=step, error=failures.describe(exc), traceback=text)
            message = failures.bug_message(exc, rank=self.world.rank, step=step if in_step else None)
            error = UserCodeError(message)
            error.details = text
            raise error from None


def _is_heavy(obj: object) -> bool:
    """Modules and optimizers: large, and changed only inside `update()`, so the previous attempt's
    object is itself the state of the last step boundary."""

    return isinstance(obj, torch.nn.Module | torch.optim.Optimizer)


def _rng_state() -> dict[str, Any]:

    rng: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),  # noqa: NPY002 - the legacy global state is what gets used
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["cuda"] = torch.cuda.get_rng_state()
    return rng


def _set_rng_state(rng: dict[str, Any]) -> None:

    # clone(): restored tensors are views into the shard's one buffer, and torch reads a generator
    # state from the start of the storage, ignoring the view's offset -- SIGSEGV, or silently another
    # rank's bytes (tests/training: test_rng_state_restores_from_a_view).
    torch.set_rng_state(rng["torch"].clone())
    np.random.set_state(rng["numpy"])  # noqa: NPY002
    random.setstate(rng["python"])
    if "cuda" in rng:
        torch.cuda.set_rng_state(rng["cuda"].clone())


def params_sha256(modules: Sequence[torch.nn.Module]) -> str | None:
    """sha256 over the tracked modules' state (names and bytes): the bit-identity verdict's value."""
    if not modules:
        return None

    digest = hashlib.sha256()
    for index, module in enumerate(modules):
        for name, tensor in sorted(module.state_dict().items()):
            digest.update(f"{index}.{name}".encode() if index else name.encode())
            digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class Attempt:
    """One run of the training function: the process group of this attempt, and the calls that tie the
    script's loop to the kit. Built by `Job.run`; its calls must come in order: `data_parallel` (before
    the optimizer is built), `resume`, then `steps` with one `update` per step."""

    def __init__(self, context: _Context, *, number: int) -> None:
        self._ctx = context
        self.number = number
        """0 for a process's first attempt; each in-process restart adds one."""
        world = context.world
        self.rank = world.rank
        self.world_size = world.world_size
        self.local_rank = world.local_rank
        self.device: torch.device = world.device
        self.last_done = -1
        """Newest step whose update is complete on this rank (-1: none)."""
        self._objects: dict[str, Any] | None = None
        self._parallel: list[torch.nn.Module] = []
        self._parameters: list[torch.nn.Parameter] = []
        self._step: int | None = None
        self._step_started = 0.0
        self._fence_s = 0.0
        self._light: dict[str, Any] = {}
        self._rng: dict[str, Any] = {}
        self._buffers: dict[str, dict[str, torch.Tensor]] = {}
        self._buffer_refs: dict[str, dict[str, torch.Tensor]] | None = None
        self._loss: float | None = None
        self._steps_called = False
        self._started = time.time()

    # ----- the attempt's frame (called by the Job) -----------------------------------------------
    def _start(self) -> None:

        ctx = self._ctx
        ctx.events.emit("attempt_start", attempt=self.number)
        parallel.init_group(ctx.world, ctx.store, attempt=self.number, timeout_s=ctx.cfg.collective_timeout_s)
        # Ranks reach this point seconds apart (imports, restarts); the collective timeout is short on
        # purpose, so line up on the store first.
        parallel.store_barrier(ctx.store, f"ready-{self.number}", ctx.world.world_size)

    def _finish(self) -> str | None:

        if not self._steps_called:
            raise UserError(
                "the training function returned without running attempt.steps(N): the kit saves, beats "
                "and counts steps there; loop over it (see training/api.py)"
            )
        ctx = self._ctx
        ctx.checkpointer.wait()
        modules = [o for o in (self._objects or {}).values() if _is_module(o)]
        digest = params_sha256(modules)
        ctx.events.emit("end", steps=self.last_done + 1, final_params_sha256=digest)
        if ctx.world.rank == 0:
            (ctx.cfg.run_dir / "final.json").write_text(
                json.dumps({"steps": self.last_done + 1, "final_params_sha256": digest}) + "\n"
            )
        # On the store, not a collective: ranks get here seconds apart (each waited for its own
        # persists), far more than the collective timeout, which a barrier here would trip.
        parallel.store_barrier(ctx.store, f"finished-{self.number}", ctx.world.world_size)
        return digest

    # ----- resume ----------------------------------------------------------------------------------
    def resume(self, **objects: Any) -> int:  # noqa: ANN401
        """Track `objects` (each `Stateful`) and restore them to the newest state every rank can load;
        returns the first step to run (0 for a fresh start). Call once per attempt, on every rank."""
        if self._objects is not None:
            raise UserError("attempt.resume() was called twice in one attempt; call it once, before steps()")
        self._check_objects(objects)
        ctx = self._ctx
        self._objects = objects
        load_started = time.perf_counter()
        kept = ctx.job._state.kept  # noqa: SLF001
        in_memory = self._in_memory_source(kept) if self.number > 0 else None
        if in_memory is not None:
            assert kept is not None  # noqa: S101 - a usable source implies kept state
            source, newest = in_memory
            self._take_from_memory(objects, kept)
            if source >= 0:
                self._catch_up(objects, source, newest)
            tier, restored_step, written_by = "inprocess", self.last_done, None
        else:
            self.last_done = -1
            restored = ctx.checkpointer.load_latest()
            tier, restored_step, written_by = "none", -1, None
            if restored is not None:
                self._load(objects, restored.state)
                tier, restored_step = restored.tier, restored.step
                written_by = restored.state["progress"].get("run_id") or "unknown"
        self._say_resumed(tier, restored_step, written_by)
        self._capture_boundary()
        ctx.job._state.kept = _Kept(  # noqa: SLF001
            objects=objects, last_done=self.last_done, light=self._light, rng=self._rng, buffers=self._buffers
        )
        load_s = time.perf_counter() - load_started
        nbytes = state_bytes(self._state())
        modules = [o for o in objects.values() if _is_module(o)]

        ctx.events.emit(
            "startup_done",
            attempt=self.number,
            restored_step=restored_step,
            tier=tier,
            startup_s=time.time() - self._started,
            load_s=load_s,
            state_bytes=nbytes,
            num_parameters=sum(p.numel() for module in modules for p in module.parameters()),
            memcpy_gbps=copy_bandwidth(nbytes) / 1e9,
            imported_since_fork=imported_since_fork(),
        )
        return self.last_done + 1

    def _say_resumed(self, tier: str, step: int, written_by: str | None) -> None:
        """Every rank says where it resumed from, on its console (a fresh start says nothing); a
        checkpoint another run wrote is named as such (training/run_scope.py)."""
        scope = self._ctx.job._state.scope  # noqa: SLF001
        if tier == "none" or scope is None:
            return
        line = resumed_line(
            rank=self.rank,
            attempt=self.number,
            tier=tier,
            step=step,
            where=scope.location(tier),
            written_by=written_by if written_by != scope.run_id else None,
        )
        print(line, flush=True)

    def _check_objects(self, objects: dict[str, Any]) -> None:
        if not objects:
            raise UserError(
                "attempt.resume() needs the training state: resume(model=model, optimizer=optimizer, ...)"
            )
        problems = []
        for name, obj in objects.items():
            if name in RESERVED_NAMES:
                problems.append(f"{name}: the name is the kit's own checkpoint key; rename it")
            elif not (
                callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))
            ):
                problems.append(
                    f"{name}: a {type(obj).__name__} has no state_dict()/load_state_dict(); pass an object "
                    "that has both (torch.distributed.checkpoint.stateful.Stateful), or wrap it in one"
                )
        if problems:
            raise UserError("attempt.resume():\n" + "\n".join(f"  - {p}" for p in problems))

    def _in_memory_source(self, kept: _Kept | None) -> tuple[int, int] | None:
        """After an in-process restart: can the ranks go on from the state in their memory?

        Returns (source, newest step): source -1 when every rank finished the same steps (nothing to
        copy), else the rank to copy from when some ranks are one step ahead; None when memory cannot
        serve (sharded state, or a rank without state) and the state must come from a checkpoint.

        Why ranks can be one step apart: a gloo all-reduce completes on each rank on its own, so a fast
        rank can apply step N's update and fail in step N+1 while a slow rank's copy of the same
        collective is still in flight; the restart stops the slow one before its update (`update`).
        Never more than one: nobody can finish step N+1's collective without the slow rank. The data-
        parallel replicas hold identical parameters and optimizer state after every update, so a rank
        that finished step N holds exactly what the slow rank would have computed: the slow rank takes
        it instead of every rank rolling back to the newest snapshot. FSDP2 shards (CUDA) have no
        replica: checkpoint.
        """

        world = self._ctx.world
        if parallel.shards_in_place(world):
            return None
        # Every rank joins the same collectives whatever its state; -2 marks a rank that has none.
        mine = kept.last_done if kept is not None else -2
        done = torch.tensor([mine, -mine], dtype=torch.int64, device=world.device)
        parallel.wait(dist.all_reduce(done, op=dist.ReduceOp.MAX, async_op=True))
        newest, oldest = int(done[0]), -int(done[1])
        if oldest == -2 or newest - oldest > 1:  # noqa: PLR2004 - the "no state" marker
            return None
        if newest == oldest:
            return -1, newest
        ahead = torch.tensor([world.rank if mine == newest else world.world_size], dtype=torch.int64)
        parallel.wait(dist.all_reduce(ahead, op=dist.ReduceOp.MIN, async_op=True))
        return int(ahead[0]), newest

    def _take_from_memory(self, objects: dict[str, Any], kept: _Kept) -> None:
        """The new attempt's objects take the state of the last step boundary: the previous attempt's
        modules and optimizers themselves (changed only inside an update), the captured rest."""
        missing = sorted(set(kept.objects) ^ set(objects))
        if missing:
            raise UserError(
                f"attempt.resume(): this attempt tracks {sorted(objects)}, the previous one "
                f"{sorted(kept.objects)}; pass the same names on every attempt"
            )
        for name, obj in objects.items():
            old = kept.objects[name]
            if _is_heavy(obj):
                if obj is not old:
                    obj.load_state_dict(old.state_dict())
                # A forward after the boundary (the failed step's) moved buffers such as BatchNorm's
                # running statistics: back to the boundary's.
                own = dict(obj.named_buffers()) if _is_module(obj) else {}
                for buffer, value in kept.buffers.get(name, {}).items():
                    own[buffer].copy_(value)
            else:
                obj.load_state_dict(copy.deepcopy(kept.light[name]))
        _set_rng_state(kept.rng)
        self.last_done = kept.last_done

    def _catch_up(self, objects: dict[str, Any], source: int, newest: int) -> None:
        """Ranks a step behind take the state of `source`, a rank ahead."""

        payload: list[Any] = [None]
        if self._ctx.world.rank == source:
            self._capture_boundary()
            payload = [
                {
                    "step": self.last_done,
                    "heavy": {n: o.state_dict() for n, o in objects.items() if _is_heavy(o)},
                    "light": self._light,
                    "rng": self._rng,
                }
            ]
        # A rare path (one per restart that caught ranks apart) on replicated state: pickled over the
        # CPU group is simple and exact; bounded by the collective timeout like the restore's reads.
        dist.broadcast_object_list(payload, src=source)
        state = payload[0]
        if self.last_done < newest:
            for name, obj in objects.items():
                obj.load_state_dict(state["heavy"][name] if _is_heavy(obj) else state["light"][name])
            _set_rng_state(state["rng"])
            self._ctx.events.emit("caught_up", source=source, from_step=self.last_done, to_step=state["step"])
            self.last_done = state["step"]

    def _load(self, objects: dict[str, Any], state: dict[str, Any]) -> None:
        progress = state["progress"]
        keep = "the checkpoints are kept; point checkpoint.*_dir at a new folder to start afresh"
        for key, want in self._ctx.job.meta.items():
            written = progress.get("meta", {}).get(key)
            if written is not None and written != want:
                raise UserError(
                    f"{key}: the newest checkpoint was written with {key} {written!r}, this run has "
                    f"{want!r}; run with {key} {written!r} to resume it ({keep})"
                )
        if progress["world_size"] != self._ctx.world.world_size:
            raise UserError(
                f"checkpoint was written by {progress['world_size']} ranks, this run has "
                f"{self._ctx.world.world_size}: the data order would differ; run with "
                f"{progress['world_size']} ranks to resume ({keep})"
            )
        missing = sorted(set(objects) - set(state))
        if missing:
            raise UserError(
                f"the newest checkpoint holds no state for {', '.join(missing)} (it has "
                f"{', '.join(sorted(set(state) - RESERVED_NAMES))}): pass the names it was written "
                f"with ({keep})"
            )
        for name, obj in objects.items():
            try:
                obj.load_state_dict(state[name])
            except (RuntimeError, KeyError, ValueError) as exc:
                raise UserError(
                    f"{name}: the newest checkpoint does not fit this run's {type(obj).__name__} ({exc}); "
                    f"build it as it was when the checkpoint was written ({keep})"
                ) from None
        _set_rng_state(state["rng"])
        self.last_done = progress["next_step"] - 1
        self._ctx.resilience.load_state_dict(state["resilience"])

    # ----- the loop ----------------------------------------------------------------------------------
    def data_parallel(
        self, module: torch.nn.Module, *, blocks: Iterable[torch.nn.Module] = ()
    ) -> torch.nn.Module:
        """`module` ready for this attempt's process group, in place of DistributedDataParallel. Call it
        before building the optimizer and before `resume`: FSDP2 replaces the parameters with sharded
        ones, which the optimizer must hold and the checkpoint's shards load into.

        CUDA: FSDP2 (`fully_shard` on each of `blocks`, then on `module`); gradients are reduce-scattered
        in backward. CPU: the module itself; `update()` averages its gradients in one flat all-reduce
        in parameter order, the same layout every step and every attempt (DDP re-buckets after its first
        step, and gloo's ring sums each element in an order that depends on its bucket position, so a
        resumed DDP run drifts from an uninterrupted one in the last bits)."""

        if self._objects is not None:
            raise UserError(
                "attempt.data_parallel() after attempt.resume(): wrap the model first, then build the "
                "optimizer on its parameters and resume (FSDP2 replaces the parameters in place)"
            )
        wrapped = parallel.wrap(module, self._ctx.world, blocks=blocks)
        self._parallel.append(wrapped)
        self._parameters = [p for module in self._parallel for p in module.parameters()]
        return wrapped

    def steps(self, num_steps: int) -> Iterator[int]:
        """The steps left of `num_steps`, from the resumed one. Run each to the end of its body."""
        if self._objects is None:
            raise UserError("attempt.steps() before attempt.resume(): resume the state first")
        if num_steps < 1:
            raise UserError(f"attempt.steps({num_steps}): the number of steps must be at least 1")
        ctx = self._ctx
        try:
            check_fault_plan(ctx.cfg.faults, steps=num_steps)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        self._steps_called = True
        ctx.events.emit("loop_start", attempt=self.number, steps=num_steps, first_step=self.last_done + 1)
        injector = self._injector(num_steps)
        optimizers = [o for o in self._objects.values() if _is_optimizer(o)]
        for step in range(self.last_done + 1, num_steps):
            self._step, self._fence_s, self._loss = step, 0.0, None
            self._step_started = time.perf_counter()
            for optimizer in optimizers:
                optimizer.zero_grad(set_to_none=True)
            injector.before_backward(step)
            yield step
            self._end_step(step)
        self._step = None

    def _injector(self, num_steps: int) -> FaultInjector:

        ctx, state = self._ctx, self._ctx.job._state  # noqa: SLF001
        if state.injector is None:
            schedule = build_schedule(
                ctx.cfg.faults, steps=num_steps, world_size=ctx.world.world_size, seed=ctx.cfg.seed
            )
            state.injector = FaultInjector(
                schedule=schedule,
                rank=ctx.world.rank,
                run_dir=ctx.cfg.run_dir,
                mode=ctx.cfg.mode,
                events=ctx.events,
                grace_s=ctx.cfg.faults.node_loss_grace_s,
            )
        return state.injector

    @contextlib.contextmanager
    def update(self, *, loss: object = None, clip_grad_norm: float | None = None) -> Iterator[None]:
        """The step's state change, as one unit: gradients averaged (CPU), clipped to `clip_grad_norm`,
        the previous snapshot's copy done, then the body (the optimizer's step, a scheduler's step).

        An in-process restart can stop this rank while the gradient collective is in flight, never after
        it completed and before the body: peers that finished the collective apply their update and may
        run on into the next step (and fail there); a rank stopped in between would be a step behind
        them. The restart's asynchronous exception lands only outside the layers' atomic section, so
        the completion check and the body sit inside one, and the wait polls outside it."""

        step = self._step
        if step is None:
            raise UserError("attempt.update() outside attempt.steps(): call it once inside each step")
        if self.last_done == step:
            raise UserError(f"attempt.update() twice in step {step}: one update per step")
        ctx = self._ctx
        if not self._parallel and ctx.world.world_size > 1:
            raise UserError(
                "attempt.update() with no data-parallel module: pass the model through "
                "attempt.data_parallel(model) after resume(), or the ranks' gradients are never averaged"
            )
        params = self._parameters
        pending = [
            p
            for module in self._parallel
            if (p := parallel.start_average_gradients(module, ctx.world)) is not None
        ]
        sharded = parallel.shards_in_place(ctx.world)
        if clip_grad_norm and sharded:
            # FSDP2 reduced the gradients inside backward. The clip's norm is a collective over the
            # shards, so it stays outside the atomic section, where a restart can still interrupt it.
            torch.nn.utils.clip_grad_norm_(params, clip_grad_norm)
        with contextlib.ExitStack() as stack:
            while True:
                stack.enter_context(ctx.resilience.atomic())
                if all(p.is_completed() for p in pending):
                    break
                stack.close()
                time.sleep(parallel.POLL_S)
            for average in pending:
                average.finish()
            if clip_grad_norm and not sharded:
                torch.nn.utils.clip_grad_norm_(params, clip_grad_norm)
            # The previous snapshot is copied during this step's forward/backward; the update is the
            # first thing that changes the state it reads (training/checkpoint/base.py).
            fence_started = time.perf_counter()
            ctx.checkpointer.fence()
            self._fence_s = time.perf_counter() - fence_started
            yield
            self.last_done = step
            self._capture_boundary()
        if loss is not None:
            self._loss = float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)  # type: ignore[arg-type]

    def _capture_boundary(self) -> None:
        """The small tracked state (everything but modules and optimizers, and the modules' persistent
        buffers, which a forward changes outside `update()`) and the RNGs, as they are at this step
        boundary: what a restart re-enters with, and what a snapshot saves."""
        objects = self._objects or {}
        self._light = {n: copy.deepcopy(o.state_dict()) for n, o in objects.items() if not _is_heavy(o)}
        if self._buffer_refs is None:
            self._buffer_refs = {n: _persistent_buffers(o) for n, o in objects.items() if _is_module(o)}
        self._buffers = {
            n: {b: t.detach().clone() for b, t in refs.items()}
            for n, refs in self._buffer_refs.items()
            if refs
        }
        self._rng = _rng_state()
        kept = self._ctx.job._state.kept  # noqa: SLF001
        if kept is not None and kept.objects is self._objects:
            kept.last_done, kept.light, kept.rng, kept.buffers = (
                self.last_done,
                self._light,
                self._rng,
                self._buffers,
            )

    def _end_step(self, step: int) -> None:
        ctx = self._ctx
        if self.last_done != step:
            raise UserError(
                f"step {step} ended without attempt.update(): run the optimizer's step inside "
                "`with attempt.update():` once per step"
            )
        # The fence inside the step is checkpoint stall, not step time.
        step_s = time.perf_counter() - self._step_started - self._fence_s
        started = time.perf_counter()
        ctx.checkpointer.save(step, self._state())
        ckpt_s = time.perf_counter() - started + self._fence_s
        loss = self._loss if self._loss is not None else float("nan")
        ctx.events.emit("step", step=step, step_s=step_s, ckpt_s=ckpt_s, loss=loss)
        ctx.metrics.step(step=step, step_s=step_s, ckpt_s=ckpt_s, loss=loss)
        ctx.resilience.step_done(step)

    def _state(self) -> dict[str, Any]:
        objects = self._objects or {}
        state: dict[str, Any] = {
            name: (obj.state_dict() if _is_heavy(obj) else self._light[name]) for name, obj in objects.items()
        }
        state["rng"] = self._rng
        state["progress"] = {
            "next_step": self.last_done + 1,
            "world_size": self._ctx.world.world_size,
            "meta": self._ctx.job.meta,
            "run_id": scope.run_id if (scope := self._ctx.job._state.scope) is not None else "",  # noqa: SLF001
        }
        state["resilience"] = self._ctx.resilience.state_dict()
        return state

    @property
    def step_loss(self) -> float | None:
        """The loss `update(loss=...)` was given in the current step."""
        return self._loss


def _persistent_buffers(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The buffers a module's state holds (BatchNorm's running statistics, a step counter), by name;
    non-persistent ones (masks, rotary tables) are constants the module rebuilds."""
    saved = set(module.state_dict(keep_vars=True))
    return {name: buffer for name, buffer in module.named_buffers() if name in saved}


def _is_module(obj: object) -> bool:

    return isinstance(obj, torch.nn.Module)


def _is_optimizer(obj: object) -> bool:

    return isinstance(obj, torch.optim.Optimizer)
