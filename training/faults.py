"""Deterministic fault injection: a schedule from the config, fired once each at a fixed point of a step.

Every fault class of the fault table (docs/architecture.md) and the layer that must recover it
(training/resilience/modes.py `recovering_layer`):

| class            | what the target rank does                                  | recovered by       |
|------------------|------------------------------------------------------------|--------------------|
| exception        | raises RuntimeError before backward                        | inprocess          |
| hang             | stops making progress in Python (sleep loop, no pings)     | inprocess          |
| skip_collective  | skips the gradient all-reduce, waits in another collective | inprocess          |
| oom              | a real allocation failure: asks the allocator for more     | inprocess          |
|                  | than RAM+swap (CPU) or free device memory (CUDA) -> error  |                    |
| sigkill          | SIGKILL to itself (as the kernel's OOM killer would)       | ft_launcher        |
| deadlock         | blocks in a C call holding the GIL (libc sleep via PyDLL)  | ft_launcher        |
| node_loss        | asks the harness to delete its node (its chaos dir)        | job_controller     |
| store_loss       | asks the harness to delete the rendezvous store's pod; the | job_controller     |
|                  | Deployment starts a replacement with an empty store        |                    |

OOM: we produce the allocation failure (Python sees an exception, as with torch.cuda.OutOfMemoryError),
not the kernel's OOM kill: on a shared machine a real OOM kill could take another process with it, and
what it does to the trainer -- a SIGKILL -- is the `sigkill` class.
Without the in-process layer (modes baseline/ft_launcher) the soft classes end the process and
ft_launcher recovers them (baseline: nothing does).

Each fault fires once per run even though steps are replayed after a restart: the target creates a
marker file (O_EXCL) in `<run_dir>/faults/` before firing.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.training.resilience.config import FaultsConfig, parse_plan_item
from nvrx_eks.training.resilience.modes import Mode, recovering_layer

if TYPE_CHECKING:
    from nvrx_eks.training.events import EventLog

CHAOS_DIR_ENV = "NVRX_EKS_CHAOS_DIR"


class InjectedFaultError(RuntimeError):
    """The `exception` class."""


@dataclass(frozen=True)
class Fault:
    index: int
    cls: str
    step: int
    rank: int


def build_schedule(cfg: FaultsConfig, *, steps: int, world_size: int, seed: int) -> list[Fault]:
    """The plan's faults plus `count` drawn ones; identical on every rank and every restart."""
    problem = cfg.ranks_problem(world_size)
    if problem:
        raise UserError(problem)
    faults: list[tuple[str, int, int]] = []
    for item in cfg.plan:
        parsed = parse_plan_item(item)
        assert parsed is not None  # noqa: S101 - validated by FaultsConfig
        faults.append(parsed)
    if cfg.count:
        rng = random.Random(cfg.seed if cfg.seed is not None else seed)  # noqa: S311 - not crypto
        last = cfg.last_step if cfg.last_step is not None else steps - 1
        # Spread: one fault per slot of the window, at a random offset inside the slot.
        slot = (last - cfg.first_step + 1) // cfg.count
        classes = [c for c, w in cfg.weights.items() if w > 0]
        weights = [cfg.weights[c] for c in classes]
        for i in range(cfg.count):
            start = cfg.first_step + i * slot
            step = rng.randint(start, start + max(0, slot - cfg.min_gap))
            cls = rng.choices(classes, weights)[0]
            rank = cfg.target_rank if cfg.target_rank is not None else rng.randrange(world_size)
            faults.append((cls, step, rank))
    faults.sort(key=lambda f: f[1])
    return [Fault(index=i, cls=c, step=s, rank=r) for i, (c, s, r) in enumerate(faults)]


class FaultInjector:
    """Fires this rank's scheduled faults at `before_backward(step)`."""

    def __init__(
        self, *, schedule: list[Fault], rank: int, run_dir: Path, mode: Mode, events: EventLog, grace_s: float
    ) -> None:
        self.mine = {f.step: f for f in schedule if f.rank == rank}
        self.markers = run_dir / "faults"
        self.markers.mkdir(parents=True, exist_ok=True)
        self.mode = mode
        self.events = events
        self.grace_s = grace_s
        self.rank = rank

    def _claim(self, fault: Fault) -> bool:
        try:
            fd = os.open(self.markers / f"fired-{fault.index}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        os.close(fd)
        return True

    def before_backward(self, step: int) -> None:
        fault = self.mine.get(step)
        if fault is None or not self._claim(fault):
            return
        self.events.emit(
            "fault_injected",
            **{"class": fault.cls},
            step=step,
            target_rank=fault.rank,
            index=fault.index,
            expected_layer=recovering_layer(fault.cls, self.mode),
        )
        getattr(self, f"_{fault.cls}")(fault)

    # One method per class, named after it.
    def _exception(self, fault: Fault) -> None:
        raise InjectedFaultError(f"injected exception at step {fault.step} on rank {fault.rank}")

    def _hang(self, fault: Fault) -> None:  # noqa: ARG002
        while True:  # Python-visible: the in-process monitor thread can interrupt it
            time.sleep(0.05)

    def _skip_collective(self, fault: Fault) -> None:
        # The peers enter the gradient all-reduce; this rank enters a different collective instead.
        # Neither can complete: the peers leave at the process-group timeout, this rank spins after.
        with contextlib.suppress(Exception):
            dist.barrier()
        self._hang(fault)

    def _oom(self, fault: Fault) -> None:  # noqa: ARG002
        if torch.cuda.is_available():
            free, _ = torch.cuda.mem_get_info()
            torch.empty(2 * free, dtype=torch.uint8, device="cuda")  # torch.OutOfMemoryError
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        # More than RAM + swap: the kernel refuses it outright (overcommit heuristic), malloc returns
        # NULL and torch raises "DefaultCPUAllocator: not enough memory". Nothing is touched.
        torch.empty(8 * physical, dtype=torch.uint8)

    def _sigkill(self, fault: Fault) -> None:  # noqa: ARG002
        os.kill(os.getpid(), signal.SIGKILL)

    def _deadlock(self, fault: Fault) -> None:  # noqa: ARG002
        # PyDLL keeps the GIL during the call: no Python thread of this process runs again (no
        # heartbeats, no in-process monitor thread); only a signal from outside ends it.
        libc = ctypes.PyDLL(ctypes.util.find_library("c"))
        while True:
            libc.sleep(3600)

    def _store_loss(self, fault: Fault) -> None:
        chaos_dir = os.environ.get(CHAOS_DIR_ENV)
        if not chaos_dir:
            # A training pod has no Kubernetes API access (least privilege): on a cluster the store's pod
            # is deleted from outside (kubectl delete pod -l app.kubernetes.io/component=rendezvous-store).
            self.events.emit("fault_not_fired", **{"class": fault.cls}, step=fault.step, reason="no harness")
            return
        body: dict[str, Any] = {"step": fault.step, "rank": fault.rank, "time": time.time()}
        path = Path(chaos_dir) / "delete-store"
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(body))
        tmp.replace(path)
        # Training goes on: what the loss does to the job is what the fault measures.

    def _node_loss(self, fault: Fault) -> None:
        node = os.environ.get("JOB_COMPLETION_INDEX", "0")
        chaos_dir = os.environ.get(CHAOS_DIR_ENV)
        body: dict[str, Any] = {"step": fault.step, "rank": fault.rank, "time": time.time()}
        if chaos_dir:
            path = Path(chaos_dir) / f"delete-node-{node}"
            tmp = path.with_name(f".{path.name}.tmp")  # not a request name until renamed into place
            tmp.write_text(json.dumps(body))
            tmp.replace(path)
            deadline = time.monotonic() + self.grace_s
            while time.monotonic() < deadline:  # the harness kills this node's whole process tree
                time.sleep(0.05)
        # No harness (or it did not act): take the node down ourselves -- the launcher agent first.
        os.kill(os.getppid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
