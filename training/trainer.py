"""The core loop: set up an attempt (process group, model, restore), then train step by step.

`Trainer.run` is one attempt. The resilience layers wrap it (training/resilience/layers.py); the loop body
only calls `resilience.step_done`, `resilience.atomic` and the checkpointer, whatever the mode.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812

from kitcore.configio import UserError
from training import parallel
from training.data import DataSource, SyntheticTokens, TokenFile
from training.events import imported_since_fork
from training.model import PRESETS, build_model

if TYPE_CHECKING:
    from training.checkpoint.base import Checkpointer
    from training.config import TrainConfig
    from training.events import EventLog
    from training.faults import FaultInjector
    from training.metrics import Metrics
    from training.resilience.layers import Resilience

log = logging.getLogger("training")


def params_sha256(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def state_bytes(state: Any) -> int:  # noqa: ANN401
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, list | tuple):
        return sum(state_bytes(v) for v in state)
    return 0


def memcpy_gbps(num_bytes: int) -> float:
    """Copy bandwidth into a pre-faulted buffer (the checkpoint stall floor's denominator)."""
    size = max(1 << 20, min(num_bytes, 256 << 20))
    src = torch.ones(size, dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)  # fault the pages in
    started = time.perf_counter()
    dst.copy_(src)
    return size / max(time.perf_counter() - started, 1e-9) / 1e9


def emulate_device_wait(seconds: float) -> None:
    """The host blocked on the device, as in a stream sync: no core held, so the previous snapshot's
    background copy overlaps it as a side-stream D2H copy overlaps GPU compute. In short slices: an
    in-process restart interrupts the main thread with an asynchronous exception, which Python delivers
    between bytecodes; on a GPU the aborted communicator ends a real wait just as promptly."""
    deadline = time.perf_counter() + seconds
    while (left := deadline - time.perf_counter()) > 0:
        time.sleep(min(left, 0.01))


class Trainer:
    def __init__(
        self,
        cfg: TrainConfig,
        *,
        world: parallel.World,
        store: dist.Store,
        events: EventLog,
        resilience: Resilience,
        checkpointer: Checkpointer,
        injector: FaultInjector,
        metrics: Metrics,
    ) -> None:
        self.cfg = cfg
        self.world = world
        self.events = events
        self.resilience = resilience
        self.checkpointer = checkpointer
        self.injector = injector
        self.metrics = metrics
        self.store = store
        shape = PRESETS[cfg.model]
        source: SyntheticTokens | TokenFile
        if cfg.data.token_file is not None:
            source = TokenFile(path=cfg.data.token_file, seq_len=shape.seq_len)
        else:
            source = SyntheticTokens(seed=cfg.seed, vocab_size=shape.vocab_size, seq_len=shape.seq_len)
        self.data = DataSource(source=source, batch_size=cfg.data.batch_size, world_size=world.world_size)
        self.attempt = -1
        self.module: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.last_done = -1
        """Newest step whose optimizer update is complete on this rank (-1: none)."""
        self.fence_s = 0.0
        """Time this step's update waited for the previous snapshot's copy (`Checkpointer.fence`)."""

    # ----- setup -------------------------------------------------------------------------------
    def _fresh_model(self) -> None:
        self.module = self.optimizer = None  # all or nothing: a failed attempt leaves no half-built state
        module = build_model(self.cfg.model, seed=self.cfg.seed, device=self.world.device)
        model = parallel.wrap(module, self.world)
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=self.cfg.optim.lr, weight_decay=self.cfg.optim.weight_decay, foreach=False
        )
        self.module, self.model, self.optimizer, self.last_done = module, model, optimizer, -1

    def _state(self) -> dict[str, Any]:
        assert self.module is not None  # noqa: S101
        assert self.optimizer is not None  # noqa: S101
        rng: dict[str, Any] = {
            "torch": torch.get_rng_state(),
            "numpy": np.random.get_state(),  # noqa: NPY002 - the legacy global state is what gets used
            "python": random.getstate(),
        }
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state()
        return {
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": rng,
            "data": {
                "next_step": self.last_done + 1,
                "world_size": self.world.world_size,
                "model": self.cfg.model,
            },
            "resilience": self.resilience.state_dict(),
        }

    def _load(self, state: dict[str, Any]) -> None:
        assert self.module is not None  # noqa: S101
        assert self.optimizer is not None  # noqa: S101
        self._check_resumable(state)
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        # clone(): restored tensors are views into the shard's one buffer, and torch (2.13) reads a
        # generator state from the start of the storage, ignoring the view's offset -- SIGSEGV, or
        # silently another rank's bytes (tests/training: test_rng_state_restores_from_a_view).
        torch.set_rng_state(state["rng"]["torch"].clone())
        np.random.set_state(state["rng"]["numpy"])  # noqa: NPY002
        random.setstate(state["rng"]["python"])
        if "cuda" in state["rng"]:
            torch.cuda.set_rng_state(state["rng"]["cuda"].clone())
        self.last_done = state["data"]["next_step"] - 1
        self.resilience.load_state_dict(state["resilience"])

    def _check_resumable(self, state: dict[str, Any]) -> None:
        """The checkpoint was written by a run of this shape; else one message, and it stays on disk."""
        data = state["data"]
        keep = "the checkpoints are kept; point checkpoint.*_dir at a new folder to start afresh"
        written = data.get("model")
        if written is not None and written != self.cfg.model:
            raise UserError(
                f"model: the newest checkpoint was written by model preset {written!r}, this run is "
                f"{self.cfg.model!r}; pass --model {written} to resume it ({keep})"
            )
        if data["world_size"] != self.world.world_size:
            raise UserError(
                f"checkpoint was written by {data['world_size']} ranks, this run has "
                f"{self.world.world_size}: the data order would differ; run with {data['world_size']} "
                f"ranks to resume ({keep})"
            )
        if written is None:  # a checkpoint from before the preset was recorded: compare the shapes
            own = self.module.state_dict()  # type: ignore[union-attr]
            theirs = state["model"]
            if set(own) != set(theirs) or any(own[k].shape != theirs[k].shape for k in own):
                raise UserError(
                    f"model: the newest checkpoint holds parameters of another shape than preset "
                    f"{self.cfg.model!r}; pass the --model it was written with ({keep})"
                )

    def _in_memory_source(self) -> tuple[int, int] | None:
        """After an in-process restart: can the ranks go on from the state in their memory?

        Returns (source, newest step): source -1 when every rank finished the same steps (nothing to
        copy), else the rank to copy from when some ranks are one step ahead; None when memory cannot
        serve (sharded state, or a rank without a model) and the state must come from a checkpoint.

        Why ranks can be one step apart: a gloo all-reduce completes on each rank on its own, so a fast
        rank can apply step N's update and fail in step N+1 while a slow rank's copy of the same
        collective is still in flight; the restart stops the slow one before its update (`_update`).
        Never more than one: nobody can finish step N+1's collective without the slow rank. The data-
        parallel replicas hold identical parameters and optimizer state after every update, and the
        step consumes no global RNG (data is keyed by sample index), so a rank that finished step N
        holds exactly what the slow rank would have computed: the slow rank takes it instead of every
        rank rolling back to the newest snapshot. FSDP2 shards (CUDA) have no replica: checkpoint.
        """
        if parallel.shards_in_place(self.world):
            return None
        usable = self.optimizer is not None
        # Every rank joins the same collectives whatever its state; -2 marks a rank that has none.
        mine = self.last_done if usable else -2
        done = torch.tensor([mine, -mine], dtype=torch.int64, device=self.world.device)
        parallel.wait(dist.all_reduce(done, op=dist.ReduceOp.MAX, async_op=True))
        newest, oldest = int(done[0]), -int(done[1])
        if oldest == -2 or newest - oldest > 1:  # noqa: PLR2004 - the "no state" marker
            return None
        if newest == oldest:
            return -1, newest
        ahead = torch.tensor(
            [self.world.rank if mine == newest else self.world.world_size], dtype=torch.int64
        )
        parallel.wait(dist.all_reduce(ahead, op=dist.ReduceOp.MIN, async_op=True))
        return int(ahead[0]), newest

    def _catch_up(self, source: int, newest: int) -> None:
        """Ranks a step behind take the parameters and optimizer state of `source`, a rank ahead."""
        assert self.module is not None  # noqa: S101
        assert self.optimizer is not None  # noqa: S101
        payload: list[Any] = [None]
        if self.world.rank == source:
            payload = [
                {
                    "step": self.last_done,
                    "model": self.module.state_dict(),
                    "optimizer": self.optimizer.state_dict(),
                }
            ]
        # A rare path (one per restart that caught ranks apart) on replicated state: pickled over the
        # CPU group is simple and exact; bounded by the collective timeout like the restore's reads.
        dist.broadcast_object_list(payload, src=source)
        state = payload[0]
        if self.last_done < newest:
            self.module.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.events.emit("caught_up", source=source, from_step=self.last_done, to_step=state["step"])
            self.last_done = state["step"]

    def _start_attempt(self) -> None:
        self.attempt += 1
        started = time.time()
        self.events.emit("attempt_start", attempt=self.attempt)
        parallel.init_group(
            self.world, self.store, attempt=self.attempt, timeout_s=self.cfg.collective_timeout_s
        )
        # Ranks reach this point seconds apart (imports, restarts); the collective timeout is short on
        # purpose, so line up on the store first.
        parallel.store_barrier(self.store, f"ready-{self.attempt}", self.world.world_size)
        load_started = time.perf_counter()
        in_memory = self._in_memory_source() if self.attempt > 0 else None
        if in_memory is not None:
            # Parameters never left: re-wrap for the new process group and continue, the ranks a step
            # behind from a rank ahead.
            assert self.module is not None  # noqa: S101
            source, newest = in_memory
            if source >= 0:
                self._catch_up(source, newest)
            self.model = parallel.wrap(self.module, self.world)
            tier, restored_step = "inprocess", self.last_done
        else:
            self._fresh_model()
            restored = self.checkpointer.load_latest()
            tier, restored_step = "none", -1
            if restored is not None:
                self._load(restored.state)
                tier, restored_step = restored.tier, restored.step
        load_s = time.perf_counter() - load_started
        nbytes = state_bytes(self._state())
        self.events.emit(
            "startup_done",
            attempt=self.attempt,
            restored_step=restored_step,
            tier=tier,
            startup_s=time.time() - started,
            load_s=load_s,
            state_bytes=nbytes,
            memcpy_gbps=memcpy_gbps(nbytes),
            imported_since_fork=imported_since_fork(),
        )

    # ----- the loop ----------------------------------------------------------------------------
    def train_step(self, step: int) -> float:
        assert self.optimizer is not None  # noqa: S101
        batch = self.data.batch(step, self.world.rank, self.world.device)
        self.optimizer.zero_grad(set_to_none=True)
        logits = self.model(batch.inputs)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch.targets.flatten())
        self.injector.before_backward(step)
        loss.backward()  # FSDP2 (CUDA) reduce-scatters gradients here
        if self.cfg.emulated_device_step_s:
            emulate_device_wait(self.cfg.emulated_device_step_s)
        pending = parallel.start_average_gradients(self.model, self.world)  # CPU: one flat all-reduce
        self._update(step, pending)
        return float(loss.detach())

    def _update(self, step: int, pending: parallel.PendingAverage | None) -> None:
        """Apply the step's update once its gradient collective has completed on this rank, as one unit
        with that completion: an in-process restart can stop this rank while the collective is in
        flight, never after it completed and before the update.

        Why: peers that finished the collective apply their update and may run on into the next step
        (and fail there). A rank stopped in between would be a step behind them, and the next attempt
        would have to copy the state over from a rank ahead (`_in_memory_source`). The restart's
        asynchronous exception lands only outside `atomic()`, so the completion check and the update
        sit inside one atomic section, and the wait polls outside it (`parallel.POLL_S`).
        """
        while pending is not None:
            with self.resilience.atomic():
                if pending.is_completed():
                    pending.finish()
                    self._clip_gradients()  # plain local tensors on CPU
                    self._apply_update(step)
                    return
            time.sleep(parallel.POLL_S)
        # CUDA: FSDP2 reduced the gradients inside backward. The clip's norm is a collective over the
        # shards, so it stays outside the atomic section, where a restart can still interrupt it.
        self._clip_gradients()
        with self.resilience.atomic():
            self._apply_update(step)

    def _clip_gradients(self) -> None:
        if self.cfg.optim.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optim.grad_clip)

    def _apply_update(self, step: int) -> None:
        assert self.optimizer is not None  # noqa: S101
        # The previous snapshot is copied during this step's forward/backward; the update is the first
        # thing that changes the state it reads (training/checkpoint/base.py).
        fence_started = time.perf_counter()
        self.checkpointer.fence()
        self.fence_s = time.perf_counter() - fence_started
        self.optimizer.step()
        self.last_done = step

    def run(self) -> str | None:
        """One attempt: returns the final parameters' sha256 (rank 0) when all steps are done."""
        self._start_attempt()
        for step in range(self.last_done + 1, self.cfg.steps):
            started = time.perf_counter()
            self.fence_s = 0.0
            loss = self.train_step(step)
            # The fence inside the step is checkpoint stall, not step time.
            step_s = time.perf_counter() - started - self.fence_s
            ckpt_s = self._checkpoint(step) + self.fence_s
            self.events.emit("step", step=step, step_s=step_s, ckpt_s=ckpt_s, loss=loss)
            self.metrics.step(step=step, step_s=step_s, ckpt_s=ckpt_s, loss=loss)
            self.resilience.step_done(step)
            if self.world.rank == 0 and (step % self.cfg.log_every == 0 or step == self.cfg.steps - 1):
                log.info("step %d/%d loss %.4f (%.1f ms)", step, self.cfg.steps, loss, step_s * 1e3)
        self.checkpointer.wait()
        return self._finish()

    def _checkpoint(self, step: int) -> float:
        """The checkpointer decides what is due (it may run a small collective): call it every step."""
        started = time.perf_counter()
        self.checkpointer.save(step, self._state())
        return time.perf_counter() - started

    def _finish(self) -> str | None:
        assert self.module is not None  # noqa: S101
        digest = params_sha256(self.module)
        self.events.emit("end", steps=self.cfg.steps, final_params_sha256=digest)
        if self.world.rank == 0:
            (self.cfg.run_dir / "final.json").write_text(
                json.dumps({"steps": self.cfg.steps, "final_params_sha256": digest}) + "\n"
            )
        # On the store, not a collective: ranks get here seconds apart (each waited for its own
        # persists), far more than the collective timeout, which a barrier here would trip.
        parallel.store_barrier(self.store, f"finished-{self.attempt}", self.world.world_size)
        return digest
