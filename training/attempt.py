"""One attempt's machinery behind the public `Attempt` (training/api.py): its process group and device
mesh, the restore, the step loop's bookkeeping and the update's fences.

Built by the process frame (training/process.py) with explicit collaborators (`Context`: the config,
the world, the store, the event log, the layers, the checkpointer, the metrics) and the record the
process keeps across its attempts (`Record`: the previous attempt's tracked objects, the fault
injector). Nothing here reaches into another object's private state.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.kitcore.lines import say
from nvrx_eks.training import parallel
from nvrx_eks.training.checkpoint.dcp_format import (
    KIT_SECTION,
    RANK_SECTION,
    LayoutMismatchError,
    Stager,
    load_copy,
)
from nvrx_eks.training.checkpoint.floor import copy_bandwidth
from nvrx_eks.training.events import imported_since_fork
from nvrx_eks.training.faults import FaultInjector, build_schedule
from nvrx_eks.training.resilience.config import check_fault_plan
from nvrx_eks.training.run_scope import resumed_line
from nvrx_eks.training.tracked import KEEP, Tracked, local_parameters, set_rng_state

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from nvrx_eks.training.checkpoint.base import Checkpointer
    from nvrx_eks.training.events import EventLog
    from nvrx_eks.training.metrics import Metrics
    from nvrx_eks.training.parallel import World
    from nvrx_eks.training.resilience.config import ResilienceConfig
    from nvrx_eks.training.resilience.layers import Resilience
    from nvrx_eks.training.run_scope import RunScope


@dataclass
class Context:
    """The process's parts, shared by its attempts."""

    cfg: ResilienceConfig
    world: World
    store: Any
    events: EventLog
    resilience: Resilience
    checkpointer: Checkpointer
    metrics: Metrics
    meta: dict[str, Any]
    """Small facts a checkpoint must match to resume (the script's `Job(meta=...)`)."""


@dataclass
class Kept:
    """What an attempt leaves for the next one in this process: its tracked objects (their boundary
    captures included), its newest finished step and that step's time to its update."""

    tracked: Tracked
    last_done: int
    step_s: float = 0.0


@dataclass
class Record:
    """What a process keeps across its attempts."""

    kept: Kept | None = None
    recorded: int = -1
    """The newest step whose `step` event this process wrote."""
    injector: FaultInjector | None = None
    attempts: int = 0
    scope: RunScope | None = None
    """The run this process belongs to (training/run_scope.py), once its store is known."""

    def release(self) -> None:
        """This rank has ended for good: the last of the host's ranks removes the run's RAM snapshots."""
        if self.scope is not None:
            self.scope.release()


class LossReader:
    """The loss a step reports, read without stalling the device.

    On CPU a tensor's value is there at once. On a GPU, reading it (`float(loss)`) waits for every
    kernel queued before it: once per step, that sync costs the overlap of the host running ahead.
    So the loss is copied to pinned host memory behind the step's kernels, with an event, and read at
    a later step end once the event has passed: the step event carries the newest loss that is ready
    (`loss_step` says which step it belongs to), a step or two behind on a busy GPU. A
    `torch.futures.Future` (a loss averaged over the ranks with `async_op=True`, `work.get_future()`)
    is read the same way, once done."""

    def __init__(self) -> None:
        self._pending: list[tuple[int, Any, Any]] = []
        self.step = -1
        self.value = float("nan")

    def put(self, step: int, loss: object) -> None:
        if loss is None:
            return
        if isinstance(loss, torch.futures.Future):
            self._pending.append((step, loss, None))
            return
        if not isinstance(loss, torch.Tensor):
            self.step, self.value = step, float(loss)  # type: ignore[arg-type]
            return
        value = loss.detach()
        if value.device.type != "cuda":
            self.step, self.value = step, float(value)
            return
        host = torch.empty((), dtype=value.dtype, pin_memory=True)
        host.copy_(value, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._pending.append((step, host, event))

    def poll(self) -> None:
        """Take every value that has landed (never waits)."""
        while self._pending and _landed(self._pending[0]):
            step, value, _ = self._pending.pop(0)
            self.step, self.value = step, _as_float(value)

    def read(self) -> float:
        """The newest loss, waiting for it (a sync: the caller asked for it)."""
        if self._pending:
            step, value, event = self._pending[-1]
            if event is not None:
                event.synchronize()
            else:
                value.wait()
            self._pending.clear()
            self.step, self.value = step, _as_float(value)
        return self.value


def _landed(pending: tuple[int, Any, Any]) -> bool:
    _, value, event = pending
    return bool(value.done()) if event is None else bool(event.query())


def _as_float(value: Any) -> float:  # noqa: ANN401 - a host tensor or a Future of one
    result = value.value() if isinstance(value, torch.futures.Future) else value
    if isinstance(result, list | tuple):  # an all_reduce's future holds the reduced tensors
        result = result[0]
    return float(result)


NO_STATE = -2
"""A rank's newest step in the in-process agreement when its previous attempt cannot serve."""


class AttemptRun:
    """The engine of one `Attempt`: every public call delegates here."""

    def __init__(self, ctx: Context, record: Record) -> None:
        self.ctx = ctx
        self.record = record
        self.number = record.attempts
        record.attempts += 1
        self.last_done = -1
        self.tracked: Tracked | None = None
        self.stager = Stager(rank=ctx.world.rank, world_size=ctx.world.world_size)
        self.kit_parallel: list[torch.nn.Module] = []
        self.meshes: list[DeviceMesh] = []
        self.mesh_shape: dict[str, int] = {}
        self.step: int | None = None
        self.loss = LossReader()
        self._step_started = 0.0
        self._fence_s = 0.0
        self._steps_called = False
        self._checked_replicas = False
        self._started = time.time()

    @property
    def full_world_size(self) -> int:
        """The job's world at its full size: smaller than this attempt's when the job shrank after
        losing a node it could not replace (the job values' `shrink`)."""
        world, shrink = self.ctx.world, self.ctx.cfg.shrink
        return shrink.nodes * world.local_world_size if shrink.enabled else world.world_size

    # ----- the attempt's frame ----------------------------------------------------------------------
    def start(self) -> None:
        ctx = self.ctx
        ctx.events.emit(
            "attempt_start",
            attempt=self.number,
            world_size=ctx.world.world_size,
            full_world_size=self.full_world_size,
        )
        if ctx.world.rank == 0 and ctx.world.world_size < self.full_world_size:
            say(
                f"the job runs shrunk: {ctx.world.world_size} of its {self.full_world_size} ranks, until its "
                "lost node's replacement is scheduled (attempt.full_world_size: keep the global batch)"
            )
        parallel.init_group(ctx.world, ctx.store, attempt=self.number, timeout_s=ctx.cfg.collective_timeout_s)
        # Ranks reach this point seconds apart (imports, restarts); the collective timeout is short on
        # purpose, so line up on the store first.
        parallel.store_barrier(ctx.store, f"ready-{self.number}", ctx.world.world_size)

    def finish(self) -> str | None:
        if not self._steps_called:
            raise UserError(
                "the training function returned without running attempt.steps(N): the kit saves, beats "
                "and counts steps there; loop over it (docs/your-script.md)"
            )
        ctx = self.ctx
        with ctx.resilience.kept_alive(ctx.cfg.inprocess.interval_s):
            ctx.checkpointer.wait()
            modules = list(self.tracked.modules.values()) if self.tracked is not None else []
            small = (
                self.tracked is not None and self.tracked.nbytes() * ctx.world.world_size <= FINAL_STATE_BYTES
            )
            whole: dict[str, torch.Tensor] | None = {} if small and ctx.world.rank == 0 else None
            digest = params_sha256(modules, keep=whole)
            ctx.events.emit("end", steps=self.last_done + 1, final_params_sha256=digest)
            if ctx.world.rank == 0:
                (ctx.cfg.run_dir / "final.json").write_text(
                    json.dumps({"steps": self.last_done + 1, "final_params_sha256": digest}) + "\n"
                )
                if whole is not None:
                    torch.save(whole, ctx.cfg.run_dir / FINAL_STATE)
            # On the store, not a collective: ranks get here seconds apart (each waited for its own
            # persists), far more than the collective timeout, which a barrier here would trip.
            # Once every rank has arrived the job is done: a restart decided after that is declined.
            key, world_size = f"finished-{self.number}", ctx.world.world_size
            ctx.resilience.finished_when(lambda: parallel.store_barrier_reached(ctx.store, key, world_size))
            parallel.store_barrier(ctx.store, key, world_size)
        return digest

    # ----- parallelism -------------------------------------------------------------------------------
    def device_mesh(self, shape: dict[str, int] | None) -> DeviceMesh:
        from nvrx_eks.training.resilience.config import ParallelConfig  # noqa: PLC0415

        ctx = self.ctx
        try:
            layout = ctx.cfg.parallel if shape is None else ParallelConfig(mesh=dict(shape))
            names, sizes = layout.shape(ctx.world.world_size)
        except ValueError as exc:
            where = "parallel.mesh" if shape is None else "attempt.device_mesh()"
            raise UserError(f"{where}: {_first_line(exc)}") from None
        mesh = parallel.device_mesh(ctx.world, names, sizes, timeout_s=ctx.cfg.collective_timeout_s)
        self.meshes.append(mesh)
        self.mesh_shape = dict(zip(names, sizes, strict=True))
        ctx.events.emit("device_mesh", attempt=self.number, mesh=self.mesh_shape)
        return mesh

    def data_parallel(
        self,
        module: torch.nn.Module,
        *,
        blocks: Iterable[torch.nn.Module],
        mp_policy: MixedPrecisionPolicy | None,
    ) -> torch.nn.Module:
        if self.tracked is not None:
            raise UserError(
                "attempt.data_parallel() after attempt.resume(): wrap the model first, then build the "
                "optimizer on its parameters and resume (FSDP2 replaces the parameters in place)"
            )
        wrapped = parallel.wrap(module, self.ctx.world, blocks=blocks, mp_policy=mp_policy)
        self.kit_parallel.append(wrapped)
        return wrapped

    # ----- resume ------------------------------------------------------------------------------------
    def resume(self, objects: dict[str, Any]) -> int:
        if self.tracked is not None:
            raise UserError("attempt.resume() was called twice in one attempt; call it once, before steps()")
        tracked = Tracked(objects)
        problems = tracked.stale_group_problems()
        if problems:
            raise UserError("attempt.resume(): " + "; ".join(problems))
        ctx = self.ctx
        self.tracked = tracked
        kept = self.record.kept
        load_started = time.perf_counter()
        source = self._in_memory_source(kept, tracked) if self.number > 0 and kept is not None else None
        restored_step, tier, resharded, from_world, written_by = -1, "none", False, 0, None
        if source is not None and kept is not None:
            self._record_cut_step(kept)
            self._take_from_memory(kept, tracked, source)
            restored_step, tier = self.last_done, "inprocess"
        else:
            self.last_done = -1
            try:
                restored = ctx.checkpointer.load_latest(
                    lambda: tracked.target(kit=self._kit(), rank=self._rank_section()), self._check_meta
                )
            except LayoutMismatchError as exc:
                raise UserError(
                    f"attempt.resume(): the newest checkpoint does not fit this run's state ({exc}): build "
                    f"the model and optimizer as they were when it was written ({KEEP})"
                ) from None
            if restored is None:
                tracked.discard_target()
            else:
                self._load(restored.state)
                restored_step, tier = restored.step, restored.tier
                written_by = (restored.state.get(KIT_SECTION) or {}).get("run_id") or "unknown"
                resharded, from_world = restored.resharded, restored.from_world_size
        self._say_resumed(tier, restored_step, written_by)
        tracked.capture()
        self.record.kept = Kept(tracked=tracked, last_done=self.last_done)
        # What this attempt resumed (restored, kept or caught up) was counted where it was trained.
        self.record.recorded = max(self.record.recorded, self.last_done)
        load_s = time.perf_counter() - load_started
        nbytes = tracked.nbytes()
        ctx.events.emit(
            "startup_done",
            attempt=self.number,
            restored_step=restored_step,
            tier=tier,
            resharded=resharded,
            from_world_size=from_world or ctx.world.world_size,
            startup_s=time.time() - self._started,
            load_s=load_s,
            state_bytes=nbytes,
            parallelism=self._parallelism(tracked),
            num_parameters=sum(p.numel() for module in tracked.modules.values() for p in module.parameters()),
            memcpy_gbps=copy_bandwidth(nbytes) / 1e9,
            imported_since_fork=imported_since_fork(),
        )
        return self.last_done + 1

    def _kit(self) -> dict[str, Any]:
        scope = self.record.scope
        return {
            "run_id": scope.run_id if scope is not None else "",
            "next_step": self.last_done + 1,
            "world_size": self.ctx.world.world_size,
            "mesh": json.dumps(self.mesh_shape),
            "meta": json.dumps(self.ctx.meta, sort_keys=True, default=str),
        }

    def _rank_section(self) -> dict[str, Any]:
        return {"resilience": json.dumps(self.ctx.resilience.state_dict(), default=str)}

    def _parallelism(self, tracked: Tracked) -> str:
        """How the modules' state is spread over the ranks, for the report: `sharded` (DTensors: FSDP2,
        tensor parallelism), `kit` (the kit's own gradient average), `replicated` (the script's own,
        DistributedDataParallel or alike), `single` (one rank)."""
        if tracked.sharded:
            return "sharded"
        if self.ctx.world.world_size == 1:
            return "single"
        return "kit" if self.kit_parallel else "replicated"

    def _say_resumed(self, tier: str, step: int, written_by: str | None) -> None:
        """Every rank says where it resumed from, on its console (a fresh start says nothing); a
        checkpoint another run wrote is named as such (training/run_scope.py)."""
        scope = self.record.scope
        if tier == "none" or scope is None:
            return
        line = resumed_line(
            rank=self.ctx.world.rank,
            attempt=self.number,
            tier=tier,
            step=step,
            where=scope.location(tier),
            written_by=written_by if written_by != scope.run_id else None,
        )
        say(line)

    def _check_meta(self, kit: dict[str, Any]) -> None:
        """Before a tensor is loaded: the step was written with the job's facts (`Job(meta=...)`)."""
        try:
            written = json.loads(kit.get("meta") or "{}")
        except (TypeError, ValueError):
            return
        for key, want in self.ctx.meta.items():
            have = written.get(key)
            if have is not None and have != json.loads(json.dumps(want, default=str)):
                raise UserError(
                    f"{key}: the newest checkpoint was written with {key} {have!r}, this run has {want!r}; "
                    f"run with {key} {have!r} to resume it ({KEEP})"
                )

    def _load(self, state: dict[str, Any]) -> None:
        assert self.tracked is not None  # noqa: S101 - resume set it
        kit = state.get(KIT_SECTION) or {}
        self._check_meta(kit)
        sections = self.tracked.apply(state)
        self.last_done = int(kit["next_step"]) - 1
        rank = sections[RANK_SECTION]
        if rank.get("resilience"):
            with contextlib.suppress(ValueError, TypeError):
                self.ctx.resilience.load_state_dict(json.loads(rank["resilience"]))

    # ----- an in-process restart ------------------------------------------------------------------
    def _in_memory_source(self, kept: Kept, tracked: Tracked) -> int | None:
        """After an in-process restart: can the ranks go on from the state in their memory?

        Returns -1 when every rank finished the same steps and this attempt's objects have the layout
        of the last one's (nothing to copy between ranks), the rank to copy from when some ranks are
        one step ahead and the state is replicated (plain data parallelism), None when memory cannot
        serve and the state comes from the checkpointer (a rank without state, a new layout, sharded
        ranks a step apart).

        Why ranks can be one step apart: a gloo all-reduce completes on each rank on its own, so a fast
        rank can apply step N's update and fail in step N+1 while a slow rank's copy of the same
        collective is still in flight; the restart stops the slow one before its update (`update`).
        Never more than one: nobody can finish step N+1's collective without the slow rank. Data-
        parallel replicas hold identical parameters and optimizer state after every update, so a rank
        that finished step N holds exactly what the slow rank would have computed: the slow rank takes
        it instead of every rank rolling back to the newest snapshot. Shards have no replica."""
        world = self.ctx.world
        why = self._same_layout(kept.tracked, tracked)
        replicated = not (tracked.sharded or kept.tracked.sharded)
        # Every rank joins the same collectives whatever its state; -2 marks a rank that cannot serve.
        mine = kept.last_done if not why else NO_STATE
        flags = torch.tensor([mine, -mine, 0 if replicated else 1], dtype=torch.int64, device=world.device)
        parallel.wait(dist.all_reduce(flags, op=dist.ReduceOp.MAX, async_op=True))
        newest, oldest, any_sharded = int(flags[0]), -int(flags[1]), bool(flags[2])
        if oldest == NO_STATE or newest - oldest > 1 or (newest != oldest and any_sharded):
            if not why:
                why = (
                    "a rank's previous attempt left no state"
                    if oldest == NO_STATE
                    else f"ranks finished steps {oldest} to {newest} and their state is sharded (no replica)"
                )
            self.ctx.events.emit("inprocess_state_unused", attempt=self.number, reason=why)
            return None
        if newest == oldest:
            return -1
        ahead = torch.tensor([world.rank if mine == newest else world.world_size], dtype=torch.int64)
        parallel.wait(dist.all_reduce(ahead, op=dist.ReduceOp.MIN, async_op=True))
        return int(ahead[0])

    def _same_layout(self, old: Tracked, new: Tracked) -> str:
        """Why the previous attempt's objects cannot give this one its state ("" when they can)."""
        if set(old.objects) != set(new.objects):
            return f"this attempt tracks {sorted(new.objects)}, the previous one {sorted(old.objects)}"
        if old is new:
            return ""
        try:
            kit, rank = self._kit(), self._rank_section()
            keys = [
                self.stager.stage(old.memory_tree(kit=kit, rank=rank)).key,
                self.stager.stage(new.target(kit=kit, rank=rank)).key,
            ]
        except (RuntimeError, ValueError, KeyError) as exc:
            return f"the previous attempt's state could not be read: {type(exc).__name__}: {exc}"[:300]
        return "" if keys[0] == keys[1] else "the parallel layout changed"

    def _record_cut_step(self, kept: Kept) -> None:
        """The restart stopped this rank after its update landed and before the step's end (its
        snapshot, its loss, its event): the step is trained, this attempt goes on after it, so it is
        counted now, once, as every step is (`cut`: its checkpoint stall and loss went unmeasured)."""
        if kept.last_done > self.record.recorded:
            self._count_step(
                kept.last_done, step_s=kept.step_s, ckpt_s=0.0, loss=float("nan"), loss_step=-1, cut=True
            )

    def _count_step(
        self, step: int, *, step_s: float, ckpt_s: float, loss: float, loss_step: int, cut: bool = False
    ) -> None:
        """The one place a finished step is counted: its event, its metrics, this process's record."""
        fields = {"cut": True} if cut else {}
        self.ctx.events.emit(
            "step", step=step, step_s=step_s, ckpt_s=ckpt_s, loss=loss, loss_step=loss_step, **fields
        )
        self.ctx.metrics.step(step=step, step_s=step_s, ckpt_s=ckpt_s, loss=loss)
        self.record.recorded = step

    def _take_from_memory(self, kept: Kept, tracked: Tracked, source: int) -> None:
        """The new attempt's objects take the state of the last step boundary from the previous
        attempt's (same layout, tensors copied in place), or from `source`, a rank a step ahead."""
        world = self.ctx.world
        self.last_done = kept.last_done
        old = kept.tracked
        if source >= 0:
            payload: list[Any] = [None]
            if world.rank == source:
                payload = [
                    (
                        kept.last_done,
                        self.stager.stage(old.memory_tree(kit=self._kit(), rank=self._rank_section())).tree,
                    )
                ]
            # A rare path (one per restart that caught ranks apart) on replicated state: pickled over the
            # CPU group is simple and exact; bounded by the collective timeout like the restore's reads.
            dist.broadcast_object_list(payload, src=source)
            step, tree = payload[0]
            if self.last_done < step:
                live = tracked.target(kit=self._kit(), rank=self._rank_section())
                self._load(load_copy(live, tree, rank=source))
                self.ctx.events.emit("caught_up", source=source, from_step=kept.last_done, to_step=step)
                return
        if old is tracked:
            set_rng_state(old.rng)
            return
        tree = self.stager.stage(old.memory_tree(kit=self._kit(), rank=self._rank_section())).tree
        live = tracked.target(kit=self._kit(), rank=self._rank_section())
        self._load(load_copy(live, tree, rank=world.rank))

    # ----- the loop ----------------------------------------------------------------------------------
    def steps(self, num_steps: int) -> Iterator[int]:
        if self.tracked is None:
            raise UserError("attempt.steps() before attempt.resume(): resume the state first")
        if num_steps < 1:
            raise UserError(f"attempt.steps({num_steps}): the number of steps must be at least 1")
        ctx = self.ctx
        try:
            check_fault_plan(ctx.cfg.faults, steps=num_steps)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        self._steps_called = True
        ctx.events.emit("loop_start", attempt=self.number, steps=num_steps, first_step=self.last_done + 1)
        injector = self._injector(num_steps)
        optimizers = list(self.tracked.optimizers.values())
        for step in range(self.last_done + 1, num_steps):
            self.step, self._fence_s = step, 0.0
            self._step_started = time.perf_counter()
            for optimizer in optimizers:
                optimizer.zero_grad(set_to_none=True)
            injector.before_backward(step)
            yield step
            self._end_step(step)
        self.step = None

    def _injector(self, num_steps: int) -> FaultInjector:
        ctx, record = self.ctx, self.record
        if record.injector is None:
            # The job's ranks at its full size: a shrunk job keeps its plan (a fault of a rank it no
            # longer has does not fire).
            schedule = build_schedule(
                ctx.cfg.faults, steps=num_steps, world_size=self.full_world_size, seed=ctx.cfg.seed
            )
            record.injector = FaultInjector(
                schedule=schedule,
                rank=ctx.world.rank,
                run_dir=ctx.cfg.run_dir,
                mode=ctx.cfg.mode,
                events=ctx.events,
                grace_s=ctx.cfg.faults.node_loss_grace_s,
            )
        return record.injector

    @contextlib.contextmanager
    def update(self, *, loss: object, clip_grad_norm: float | None) -> Iterator[None]:
        """The step's state change, as one unit (api.py `Attempt.update` says what it does).

        An in-process restart can stop this rank while a gradient collective is in flight, never after
        it completed and before the body: peers that finished the collective apply their update and may
        run on into the next step (and fail there); a rank stopped in between would be a step behind
        them. The restart's asynchronous exception lands only outside the layers' atomic section, so
        the completion check and the body sit inside one, and the wait polls outside it."""
        step = self.step
        if step is None:
            raise UserError("attempt.update() outside attempt.steps(): call it once inside each step")
        if self.last_done == step:
            raise UserError(f"attempt.update() twice in step {step}: one update per step")
        assert self.tracked is not None  # noqa: S101 - steps() requires resume
        ctx = self.ctx
        params = [p for module in self.tracked.modules.values() for p in module.parameters()]
        pending = [
            p
            for module in self.kit_parallel
            if (p := parallel.start_average_gradients(module, ctx.world)) is not None
        ]
        outside = clip_grad_norm and not pending and _has_dtensor_grads(params)
        if outside:
            # DTensor gradients (FSDP2, tensor parallelism) were reduced in backward; the clip's norm is a
            # collective over their meshes, so it stays outside the atomic section, where a restart can
            # still interrupt it.
            parallel.clip_grad_norm(params, clip_grad_norm)  # type: ignore[arg-type]
        with contextlib.ExitStack() as stack:
            while True:
                stack.enter_context(ctx.resilience.atomic())
                if all(p.is_completed() for p in pending):
                    break
                stack.close()
                time.sleep(parallel.POLL_S)
            for average in pending:
                average.finish()
            if clip_grad_norm and not outside:
                parallel.clip_grad_norm(params, clip_grad_norm)
            # The previous snapshot is copied during this step's forward/backward; the update is the
            # first thing that changes the state it reads (training/checkpoint/base.py).
            fence_started = time.perf_counter()
            ctx.checkpointer.fence()
            self._fence_s = time.perf_counter() - fence_started
            yield
            self.last_done = step
            self.tracked.capture()
            kept = self.record.kept
            if kept is not None and kept.tracked is self.tracked:
                kept.last_done = step
                kept.step_s = time.perf_counter() - self._step_started - self._fence_s
        self.loss.put(step, loss)
        if not self._checked_replicas:
            self._checked_replicas = True
            self._check_replicas_agree(step)

    def _check_replicas_agree(self, step: int) -> None:
        """Once per attempt, after its first update: ranks whose models are replicas (no shards, the same
        parameters by name and shape) must hold the same parameters. They differ when no one averaged
        the gradients: a model the script forgot to wrap. One small collective, no host copy of a GPU
        tensor beyond a few numbers."""
        ctx = self.ctx
        if ctx.world.world_size == 1 or self.tracked is None or self.kit_parallel or self.tracked.sharded:
            return
        modules = list(self.tracked.modules.values())
        shapes = hashlib.sha256(
            repr([(n, tuple(p.shape)) for m in modules for n, p in m.named_parameters()]).encode()
        ).digest()
        layout = float(int.from_bytes(shapes[:6], "big"))
        with torch.no_grad():
            sample = [p.detach().reshape(-1)[:64].double().sum() for p in local_parameters(modules)]
            fingerprint = float(torch.stack(sample).sum()) if sample else 0.0
        flags = torch.tensor(
            [layout, -layout, fingerprint, -fingerprint], dtype=torch.float64, device=ctx.world.device
        )
        parallel.wait(dist.all_reduce(flags, op=dist.ReduceOp.MAX, async_op=True))
        same_layout = flags[0] == -flags[1]
        if same_layout and flags[2] != -flags[3]:
            raise UserError(
                f"the ranks' parameters differ after step {step}: their gradients were not averaged. Wrap "
                "the model in DistributedDataParallel or fully_shard (or attempt.data_parallel(model)) "
                "before building the optimizer"
            )

    def _end_step(self, step: int) -> None:
        ctx = self.ctx
        if self.last_done != step:
            raise UserError(
                f"step {step} ended without attempt.update(): run the optimizer's step inside "
                "`with attempt.update():` once per step"
            )
        assert self.tracked is not None  # noqa: S101
        # The fence inside the step is checkpoint stall, not step time.
        step_s = time.perf_counter() - self._step_started - self._fence_s
        started = time.perf_counter()
        tracked = self.tracked
        # Read only when a snapshot is due: the state dicts' walk is not free on a large model.
        ctx.checkpointer.save(step, lambda: tracked.state(kit=self._kit(), rank=self._rank_section()))
        ckpt_s = time.perf_counter() - started + self._fence_s
        self.loss.poll()
        loss = self.loss.value if self.loss.step >= 0 else float("nan")
        self._count_step(step, step_s=step_s, ckpt_s=ckpt_s, loss=loss, loss_step=self.loss.step)
        ctx.resilience.step_done(step)


def _has_dtensor_grads(params: list[torch.nn.Parameter]) -> bool:
    return any(isinstance(p.grad, DTensor) for p in params if p.grad is not None)


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    for prefix in ("1 validation error for ParallelConfig\nmesh\n  Value error, ",):
        text = text.replace(prefix, "")
    return text.splitlines()[0]


FINAL_STATE = "final_state.pt"
"""The final parameters, whole, beside final.json (rank 0) when they are at most FINAL_STATE_BYTES: what
the demo compares with its fault-free run when the hashes differ, to say by how much."""
FINAL_STATE_BYTES = 256 << 20


def params_sha256(
    modules: Iterable[torch.nn.Module], *, keep: dict[str, torch.Tensor] | None = None
) -> str | None:
    """sha256 over the modules' whole state (keys and bytes, sharded tensors made whole): the
    bit-identity verdict's value, the same whatever the parallel layout. Collective when a module is
    sharded: every rank calls it. `keep`: filled with each whole tensor, by its key (CPU copies)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict  # noqa: PLC0415

    modules = list(modules)
    if not modules:
        return None
    digest = hashlib.sha256()
    for index, module in enumerate(modules):
        state = get_model_state_dict(module)
        for name in sorted(state):
            tensor = state[name]
            if isinstance(tensor, DTensor):
                tensor = tensor.full_tensor()
            if not isinstance(tensor, torch.Tensor):
                continue  # a module's extra state: not parameters
            key = f"{index}.{name}" if index else name
            whole = tensor.detach().cpu().contiguous()
            digest.update(key.encode())
            digest.update(whole.reshape(-1).view(torch.uint8).numpy().tobytes())
            if keep is not None:
                keep[key] = whole.clone()
    return digest.hexdigest()
