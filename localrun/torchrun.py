"""`python -m nvrx_eks.localrun.torchrun TORCHRUN_FLAGS -- (-m MODULE | SCRIPT) [ARGS...]`: torch's own
torchrun, without NVRx or the kit's launcher, each worker forked from one forkserver that has imported
torch and the script's top-level imports.

The local references that prove a script trains under the kit as it does without it (a shrunk job's
fault-free segments, localrun/shrink.py; the tests' plain runs) start the script under plain torchrun.
By default torchrun starts every worker as a fresh interpreter, which imports torch and the script's
imports again: seconds of CPU per rank, most of a short reference on a small machine. Here the agent,
its rendezvous and what each worker is given (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
TORCHELASTIC_*) are torchrun's, unchanged: torchrun's own `--run-path` and `--start-method forkserver`
make the worker a function torch forks, and training/entry.py, which that function runs, hands the
process to the module or script as `python -m` or `python SCRIPT` would (the kit's launcher starts its
workers the same way: training/resilience/launch.py). The forkserver imports `PRELOAD` and the script's
top-level imports (training/resilience/warm_entry.py) once.

What a worker sees differently from torchrun's default: its standard streams are the agent's, line
buffered (torchrun's default passes `-u`), and modules the forkserver imported are in `sys.modules`
before the script starts.
"""

from __future__ import annotations

import os
import shutil
import sys

from nvrx_eks.training.resilience.launch import launcher_argv, start_forkserver

PRELOAD = (
    "torch",
    "torch.distributed.run",
    "torch.distributed.elastic.multiprocessing.api",
    "nvrx_eks.training.entry",
)
"""What every worker imports before the script's first line: torch, the worker wrapper torch unpickles
to start it, and the entry point that runs the script."""


def standalone(*, ranks: int, entry: list[str]) -> list[str]:
    """The command line of a one-node plain run of `ranks` workers: `entry` is `-m MODULE ARGS...` or
    `SCRIPT ARGS...`."""
    return [sys.executable, "-m", __name__, "--standalone", f"--nproc-per-node={ranks}", "--", *entry]


def main(argv: list[str] | None = None) -> None:
    from torch.distributed import run as torchrun  # noqa: PLC0415 - the command's, not `standalone`'s

    run_argv = launcher_argv(sys.argv[1:] if argv is None else argv)
    # torchrun's own default for more than one worker per node, set here because the forkserver, forked
    # before torchrun reads its flags, sizes torch's thread pool from it.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Forked from this process, which has imported torch already (the launcher's own forkserver start).
    written = start_forkserver(run_argv, list(PRELOAD), fork=True)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    try:
        torchrun.main(run_argv)
    finally:
        if written is not None:  # the entry point's imports' module: the forkserver has imported it
            shutil.rmtree(written, ignore_errors=True)


if __name__ == "__main__":
    main()
