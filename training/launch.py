"""`python -m training.launch`: ft_launcher whose restarted workers fork from a warm process.

The command line is ft_launcher's own, unchanged, ending in `-m training ARGS` as for ft_launcher. What
this adds: the workers are not fresh interpreters. ft_launcher's `--run-path` runs the trainer through a
Python callable, and `--start-method=forkserver` (torch.distributed.elastic's multiprocessing, not ours)
starts each worker as a fork of one forkserver process per pod; `multiprocessing.set_forkserver_preload`
makes that process import torch, torch._dynamo and the trainer once, before any worker exists.

Why: a restart's worker start was the longest phase of a hard-fault recovery. Measured on this 2-core
machine (`make demo`, 2 nodes x 2 ranks; shared README "how we measure"), a SIGKILL took 9.4 s to the
next productive step, 7.8 s of it worker start: every rank of both nodes imported torch (1.6 s CPU)
and torch._dynamo (1.6 s CPU, training/parallel.py `preload`) again, four at once on two cores. A fork
of the warm forkserver is ready in milliseconds; the imports are paid once per pod, when it starts.

Why a forkserver and not `--start-method=fork`: the agent has threads (the rendezvous keep-alive, the
rank monitors' connections); fork copies a process with those threads' locks in whatever state they were.
The forkserver is a fresh interpreter that only imports (torch's one native thread is idle then, as for
DataLoader workers forked after `import torch`), never initialises CUDA (a fork after CUDA init is
unusable) and never runs a collective.

A worker is still a separate process with its own rendezvous, process group and exit status: a SIGKILL,
an OOM kill, a watchdog's SIGKILL reach it as before, and ft_launcher sees the same exit codes. What it
inherits from the forkserver is only imported modules: nothing in kitcore/ or training/ reads the
environment or opens files at import (tests/training/test_training_launch.py checks both).

A pod's first start overlaps what used to run one after another (the node-loss path: a replacement
pod's trainer container took 6.8 s to its first step after two init containers of 2.5 s each):
- the forkserver starts at once, so its imports run while this process imports NVRx, hands the
  rendezvous over and its agent waits in the rendezvous round;
- `--evict-predecessor=keep-alive|barrier` (this wrapper's own flag, ahead of ft_launcher's) runs the
  replacement's rendezvous hand-over (training/rendezvous.py: evict the dead predecessor, reopen a
  rendezvous a launcher out of restarts closed) in this process before its agent joins. It was an init
  container of its own: a second interpreter importing torch, on the critical path of every
  replacement. It needs nothing the trainer container lacks: it is a client of the same store.
- `--warm-spares=S` (NVRx 0.4.1's keep-alive rendezvous only): the launcher starts as usual and its
  agent's first join waits until the pod has a place (training/rendezvous.py `Standby`), so a spare's
  whole start is behind it when a node is lost.
- `--rdzv-poll=S` (NVRx 0.4.1): how often a waiting agent reads the rendezvous state (hard-coded 1 s).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from training.nvrx_compat import mend_multiprocess_workers, set_rendezvous_poll

WARM_MODULES = ("torch", "torch._dynamo", "torch.distributed", "training.run")
"""What the forkserver imports once. torch._dynamo: see training/parallel.py `preload` (an optimizer or
DDP imports it on first use; inside an attempt that import was slow and unsafe to interrupt)."""


def trainer_script() -> str:
    """The absolute path of training/__main__.py, as `--run-path` wants it, wherever it is installed."""
    return str(Path(__file__).resolve().with_name("__main__.py"))


EVICT_FLAG = "--evict-predecessor"
EVICT_TIMEOUT_FLAG = "--evict-timeout"
WARM_SPARES_FLAG = "--warm-spares"
RDZV_POLL_FLAG = "--rdzv-poll"
OWN_FLAGS = (EVICT_FLAG, EVICT_TIMEOUT_FLAG, WARM_SPARES_FLAG, RDZV_POLL_FLAG)


@dataclass(frozen=True)
class Handover:
    """The pod's rendezvous hand-over (training/rendezvous.py `hand_over`), from this wrapper's flags."""

    rendezvous: Literal["keep-alive", "barrier"]
    store_timeout_s: float


def _flag(argv: list[str], name: str) -> str | None:
    """The value of `name=V` or `name V` in `argv`, or None."""
    for i, arg in enumerate(argv):
        if arg.startswith(f"{name}="):
            return arg.partition("=")[2]
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
    return None


def handover_of(argv: list[str]) -> Handover | None:
    """`--evict-predecessor=keep-alive|barrier [--evict-timeout=S]`, or None without them."""
    rendezvous = _flag(argv, EVICT_FLAG)
    if rendezvous is None:
        return None
    if rendezvous not in ("keep-alive", "barrier"):
        raise SystemExit(f"training.launch: {EVICT_FLAG} takes keep-alive or barrier, not {rendezvous!r}")
    return Handover(rendezvous, float(_flag(argv, EVICT_TIMEOUT_FLAG) or 60.0))  # type: ignore[arg-type]


def _rendezvous_flags(ft_argv: list[str], *, needed_by: str) -> tuple[str, str, str]:
    """(endpoint, run id, this node's address) from ft_launcher's own flags, which `needed_by` reads."""
    wanted = ("--rdzv-endpoint", "--rdzv-id", "--local-addr")
    endpoint, run_id, node_addr = (_flag(ft_argv, name) for name in wanted)
    if endpoint is None or run_id is None or node_addr is None:
        raise SystemExit(f"training.launch: {needed_by} needs ft_launcher's {', '.join(wanted)}")
    return endpoint, run_id, node_addr


def hand_over(handover: Handover, ft_argv: list[str]) -> None:
    """training/rendezvous.py `hand_over`, with the endpoint, run id and address of ft_launcher's flags."""
    from training.rendezvous import hand_over as rendezvous_hand_over  # noqa: PLC0415

    endpoint, run_id, node_addr = _rendezvous_flags(ft_argv, needed_by=EVICT_FLAG)
    rendezvous_hand_over(
        endpoint=endpoint,
        run_id=run_id,
        node_addr=node_addr,
        rendezvous=handover.rendezvous,
        store_timeout_s=handover.store_timeout_s,
    )


def stand_by_first(argv: list[str], ft_argv: list[str]) -> None:
    """`--warm-spares=S` (S >= 1, NVRx 0.4.1): this pod's agent first joins only once it has a place
    (training/rendezvous.py `Standby`). Active nodes: `--nnodes=N:...`; the pod's index: the Job's."""
    spares = int(_flag(argv, WARM_SPARES_FLAG) or 0)
    if spares < 1:
        return
    endpoint, run_id, node_addr = _rendezvous_flags(ft_argv, needed_by=WARM_SPARES_FLAG)
    nnodes = _flag(ft_argv, "--nnodes")
    if nnodes is None:
        raise SystemExit(f"training.launch: {WARM_SPARES_FLAG} needs ft_launcher's --nnodes")
    from training.nvrx_compat import gate_first_join  # noqa: PLC0415
    from training.rendezvous import stand_by  # noqa: PLC0415

    active_nodes = int(nnodes.partition(":")[0])
    index = int(os.environ.get("JOB_COMPLETION_INDEX", "0"))
    gate_first_join(
        lambda: stand_by(
            endpoint=endpoint, run_id=run_id, node_addr=node_addr, active_nodes=active_nodes, index=index
        )
    )


def launcher_argv(argv: list[str]) -> list[str]:
    """ft_launcher's arguments: this wrapper's own flags dropped, and `-m training` (the trainer as a
    module, a fresh interpreter each) replaced by `--run-path <training/__main__.py>` (the trainer as a
    callable in a forked worker)."""
    argv = [a for a in argv if not a.startswith(tuple(f"{flag}=" for flag in OWN_FLAGS))]
    try:
        at = next(i for i in range(len(argv) - 1) if argv[i] == "-m" and argv[i + 1] == "training")
    except StopIteration:
        raise SystemExit("training.launch: the command line must end in `-m training ARGS`") from None
    start = [] if any(a.startswith("--start-method") for a in argv[:at]) else ["--start-method=forkserver"]
    return [*argv[:at], *start, "--run-path", trainer_script(), *argv[at + 2 :]]


def main() -> None:
    # Defence in depth for GPU nodes: should anything in the forkserver ask torch for the device count,
    # PyTorch answers from NVML instead of initialising the CUDA driver, which a fork cannot inherit
    # (tests/training/test_training_launch.py checks that nothing asks).
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    argv = sys.argv[1:]
    ft_argv = launcher_argv(argv)
    if "--start-method=forkserver" in ft_argv:
        multiprocessing.set_forkserver_preload(list(WARM_MODULES))
        # Started now, not at the first worker: its imports overlap this process's and the rendezvous.
        multiprocessing.forkserver.ensure_running()
    handover = handover_of(argv)
    if handover is not None:
        hand_over(handover, ft_argv)
    mend_multiprocess_workers()  # NVRx 0.4.1's launcher with multiprocessing workers (see there)
    poll = _flag(argv, RDZV_POLL_FLAG)
    if poll is not None:
        set_rendezvous_poll(float(poll))
    stand_by_first(argv, ft_argv)
    from nvidia_resiliency_ext.fault_tolerance.launcher import main as ft_launcher  # noqa: PLC0415

    ft_launcher(ft_argv)


if __name__ == "__main__":
    main()
