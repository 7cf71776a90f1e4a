"""The kit's resilience for any PyTorch training loop: the public API, and the only one.

A training script -- the reference trainer (training/trainer.py) or a user's own -- gets every layer
of the kit through two objects: a `Job`, built once per process, and the `Attempt` it hands to the
script's training function each time it (re)starts it. The script keeps its own parallelism::

    from nvrx_eks.training import api as kit

    def train(attempt: kit.Attempt) -> None:
        mesh = attempt.device_mesh()                    # this attempt's ranks, the job's layout
        model = parallelize(build_model(), mesh)        # DDP, fully_shard, parallelize_module: yours
        optimizer = torch.optim.AdamW(model.parameters())
        attempt.resume(model=model, optimizer=optimizer, data=loader)   # newest state, nearest tier
        for step in attempt.steps(num_steps):           # heartbeats, checkpoints, events, faults
            loss = model(**loader.next_batch()).loss
            loss.backward()
            with attempt.update(loss=loss, clip_grad_norm=1.0):   # a restart never lands inside
                optimizer.step()

    kit.Job().run(train)                                # instead of init_process_group(); train()

- `Job.run(train)` checks the runtime inputs (exit 2 with one message on every rank before any
  collective), starts the event log, the metrics, the tiered checkpointer and the resilience layers,
  then calls `train` inside NVRx's in-process `Wrapper` (modes inprocess/both) and ft_launcher's rank
  monitor (modes ft_launcher/both). A soft fault re-enters `train` in the same process with a new
  process group; a hard fault is ft_launcher's; a lost node is the Job controller's. The same exception
  at the same step after a restart is a bug, not a fault: it ends the job once (`UserCodeError`, exit 2).
- `Attempt.group` / `Attempt.device_mesh()` are this attempt's process group and a DeviceMesh of its
  ranks (its shape from the job values' `parallel.mesh`, or the script's): build the model's
  parallelism on them inside `train`, every attempt. `Attempt.data_parallel` is the easy path.
- `Attempt.resume(**objects)` tracks `Stateful` objects -- modules and optimizers by fully-qualified
  name through `torch.distributed.checkpoint.state_dict` (DDP, FSDP2, TP and HSDP alike), the rest by
  their `state_dict()` -- and restores them from the nearest place that holds the newest step every
  rank can load: the previous attempt's objects, this node's RAM, a partner's RAM, local disk, durable
  storage; at another world size or layout, resharded from the durable tier's DCP checkpoint. RNG
  states are saved and restored with it.
- `Attempt.steps(n)` yields the steps left; `Attempt.update()` is the step's one state change.

Modules and optimizers must change only inside `update()`; everything else tracked (a loader, a
scheduler) is captured at the end of every step, so a restart re-enters exactly at a step boundary. A
loader that must resume at another world size keeps a global position (a sample index), not a rank's.
"""

from __future__ import annotations

import faulthandler
import logging
import traceback
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch.distributed as dist

from nvrx_eks.kitcore import supervisor
from nvrx_eks.kitcore.configio import UserError, exit_on_user_error
from nvrx_eks.training import failures
from nvrx_eks.training.attempt import Record, params_sha256
from nvrx_eks.training.inputs import check_runtime_inputs
from nvrx_eks.training.process import UserCodeError, run_process
from nvrx_eks.training.resilience.config import CONFIG_ENV, ResilienceConfig, config_from_env

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
    from contextlib import AbstractContextManager

    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from nvrx_eks.training.attempt import AttemptRun

__all__ = [
    "CONFIG_ENV",
    "Attempt",
    "Job",
    "ResilienceConfig",
    "Stateful",
    "UserCodeError",
    "UserError",
    "load_config",
    "params_sha256",
]

log = logging.getLogger("training")


@runtime_checkable
class Stateful(Protocol):
    """torch.distributed.checkpoint.stateful.Stateful: what `Attempt.resume` tracks."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> Any: ...  # noqa: ANN401 - modules return a report


def load_config(env: dict[str, str] | None = None) -> ResilienceConfig:
    """The job's configuration from `NVRX_EKS_CONFIG` (set by the chart), else the defaults."""
    return config_from_env(env)


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
            self.config = (config if config is not None else load_config()).for_this_world()
        self.input_checks = tuple(input_checks)
        self.tokens_per_step = tokens_per_step
        self.meta = dict(meta or {})
        self._record = Record()

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
                digest = run_process(
                    self.config,
                    record=self._record,
                    tokens_per_step=self.tokens_per_step,
                    meta=self.meta,
                    attempt=lambda run: train(Attempt(run)),
                )
            except UserError:
                self._record.release()  # bad input or a bug ends the job: this rank is done for good
                raise
            except Exception as exc:
                # A fault for the launcher to restart: its summary names it in the kit's words.
                supervisor.tell(failures.describe(exc), details=traceback.format_exc())
                raise
            self._record.release()
            return digest


class Attempt:
    """One run of the training function: the process group of this attempt, and the calls that tie the
    script's loop to the kit. Built by `Job.run`; its calls come in order: the model's parallelism
    (`device_mesh`, `data_parallel` or the script's own), the optimizer, `resume`, then `steps` with one
    `update` per step."""

    def __init__(self, run: AttemptRun) -> None:
        self._run = run
        world = run.ctx.world
        self.number: int = run.number
        """0 for a process's first attempt; each in-process restart adds one."""
        self.rank: int = world.rank
        self.world_size: int = world.world_size
        self.full_world_size: int = run.full_world_size
        """The job's world at its full size. Below it, the job shrank after losing a node it could not
        replace (the job values' `shrink`): keep the global batch by giving each rank a larger share of
        it (docs/your-script.md); the job grows back to this size when the node returns."""
        self.local_rank: int = world.local_rank
        self.device: torch.device = world.device

    @property
    def last_done(self) -> int:
        """Newest step whose update is complete on this rank (-1: none)."""
        return self._run.last_done

    @property
    def group(self) -> dist.ProcessGroup:
        """This attempt's process group (the default one): made anew after every restart."""
        return dist.group.WORLD  # type: ignore[return-value]

    def device_mesh(self, shape: Mapping[str, int] | None = None) -> DeviceMesh:
        """A DeviceMesh of this attempt's ranks, for the script's FSDP2 / tensor parallelism / HSDP.

        `shape`: dimension name -> size, outermost first, one size -1 for the ranks left (e.g.
        `{"dp": -1, "tp": 8}`); default: the job values' `parallel.mesh` ({"dp": -1}). Call it on every
        rank, inside the training function: it is rebuilt with the process group after a restart. A
        shape that does not fit this job's world size exits 2, naming both."""
        return self._run.device_mesh(dict(shape) if shape is not None else None)

    def data_parallel(
        self,
        module: torch.nn.Module,
        *,
        blocks: Iterable[torch.nn.Module] = (),
        mp_policy: MixedPrecisionPolicy | None = None,
    ) -> torch.nn.Module:
        """The easy path, in place of DistributedDataParallel: `module` ready for this attempt's group.
        Call it before building the optimizer and before `resume`.

        CUDA: FSDP2 (`fully_shard` on each of `blocks` -- the repeated layers, e.g. a transformer's
        decoder layers -- then on `module`, with `mp_policy`). CPU: the module itself; `update()`
        averages its gradients in one flat all-reduce in parameter order, the same layout every step and
        every attempt, so a resumed run is bit-identical to an uninterrupted one."""
        return self._run.data_parallel(module, blocks=blocks, mp_policy=mp_policy)

    def resume(self, **objects: Any) -> int:  # noqa: ANN401
        """Track `objects` (each `Stateful`) and restore them to the newest state every rank can load;
        returns the first step to run (0 for a fresh start). Call once per attempt, on every rank, after
        the model is parallelized and the optimizer built on its parameters."""
        return self._run.resume(objects)

    def steps(self, num_steps: int) -> Iterator[int]:
        """The steps left of `num_steps`, from the resumed one. Run each to the end of its body."""
        return self._run.steps(num_steps)

    def update(
        self, *, loss: object = None, clip_grad_norm: float | None = None
    ) -> AbstractContextManager[None]:
        """The step's state change, as one unit: the kit's own gradient average (`data_parallel` on
        CPU), the gradients clipped to `clip_grad_norm` (over every mesh for DTensors), the previous
        snapshot's copy done, then the body (the optimizer's step, a scheduler's step). An in-process
        restart never lands inside it.

        `loss`: what the step reports (events, metrics); with gradient accumulation, the step's mean
        over its micro-batches, detached. It is read without a per-step device sync (see `step_loss`)."""
        return self._run.update(loss=loss, clip_grad_norm=clip_grad_norm)

    @property
    def step_loss(self) -> float:
        """The newest loss `update(loss=...)` was given. On a GPU reading it waits for the device: log it
        every N steps, not every step (the step events carry it without waiting)."""
        return self._run.loss.read()
