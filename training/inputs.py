"""The trainer's runtime input, checked before any process, thread or socket exists.

The config's own checks (training/config.py) run wherever the config is parsed, the job renderer
included, so they cannot look at files or variables that exist only in the pod: the token file on FSx,
the run folder, the launcher's environment. These are checked here, first thing in each rank. Every
rank checks the same inputs and exits 2 with the same message, so no rank is left waiting in a
collective for a peer that failed, and the Job's podFailurePolicy fails the job on exit code 2.

Why first: once the checkpointer's persistent workers run, an exception before the loop's teardown
used to leave NVRx's PersistentAsyncCaller to join a worker that never started at interpreter exit,
and the process never exited (training/run.py now closes what it built on every path as well).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from kitcore.configio import UserError

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from training.config import TrainConfig

MAX_PORT = 65535
TOKEN_BYTES = 2  # uint16 token ids (training/data.py TokenFile)


def check_runtime_inputs(cfg: TrainConfig, env: Mapping[str, str] | None = None) -> None:
    """Raise one UserError naming every bad runtime input (file, folder, variable) and its fix."""
    env = os.environ if env is None else env
    problems = [*_environment(cfg, env), *_run_dir(cfg.run_dir)]
    if cfg.data.token_file is not None:
        problems += _token_file(cfg.data.token_file, seq_len=_seq_len(cfg))
    if problems:
        raise UserError("trainer runtime input:\n" + "\n".join(f"  - {p}" for p in problems))


def _seq_len(cfg: TrainConfig) -> int:
    from training.shapes import PRESETS  # noqa: PLC0415

    return PRESETS[cfg.model].seq_len


def _int_var(
    env: Mapping[str, str], name: str, *, low: int, high: int | None, problems: list[str]
) -> int | None:
    raw = env.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        problems.append(f"{name}={raw!r} is not an integer (the launcher sets it; unset it to run alone)")
        return None
    if value < low or (high is not None and value > high):
        span = f"{low}..{high}" if high is not None else f">= {low}"
        problems.append(f"{name}={value} is out of range ({span})")
        return None
    return value


def _environment(cfg: TrainConfig, env: Mapping[str, str]) -> list[str]:
    """The variables torchrun/ft_launcher set (training/parallel.py reads them)."""
    problems: list[str] = []
    _int_var(env, "MASTER_PORT", low=1, high=MAX_PORT, problems=problems)
    if "MASTER_ADDR" in env and not env["MASTER_ADDR"].strip():
        problems.append("MASTER_ADDR is empty; set the host of rank 0 (or unset it to run alone)")
    world = _int_var(env, "WORLD_SIZE", low=1, high=None, problems=problems)
    rank = _int_var(env, "RANK", low=0, high=None, problems=problems)
    local_rank = _int_var(env, "LOCAL_RANK", low=0, high=None, problems=problems)
    if world is not None and rank is not None and rank >= world:
        problems.append(f"RANK={rank} is not below WORLD_SIZE={world}")
    port = cfg.metrics.prometheus_port
    if port and port + (local_rank or 0) > MAX_PORT:
        problems.append(
            f"metrics.prometheus_port ({port}) + LOCAL_RANK ({local_rank or 0}) is past port {MAX_PORT}: "
            f"each local rank serves on port + local rank; pick a port at most {MAX_PORT} minus the ranks "
            "per node"
        )
    return problems


def _run_dir(run_dir: Path) -> list[str]:
    for folder in (run_dir, *run_dir.parents):
        if folder.exists():
            if not folder.is_dir():
                where = "is a file" if folder == run_dir else f"is below {folder}, which is a file"
                return [f"run_dir {run_dir} {where}; pass a folder for the run's events and metrics"]
            if not os.access(folder, os.W_OK | os.X_OK):
                return [f"run_dir {run_dir}: {folder} is not writable; pass a folder this user can write"]
            return []
    return []


def _token_file(path: Path, *, seq_len: int) -> list[str]:
    field = f"data.token_file {path}"
    if not path.exists():
        return [f"{field}: no such file; pass an existing uint16 token file (unset: synthetic data)"]
    if not path.is_file():
        return [f"{field}: not a regular file; pass a flat file of uint16 token ids"]
    if not os.access(path, os.R_OK):
        return [f"{field}: not readable by this user; fix its permissions"]
    size = path.stat().st_size
    if size % TOKEN_BYTES:
        return [f"{field}: {size} bytes is not a whole number of uint16 tokens; is it a token file?"]
    if size // TOKEN_BYTES <= seq_len + 1:
        tokens = size // TOKEN_BYTES
        return [f"{field}: {tokens} tokens; the model's seq_len ({seq_len}) needs more than {seq_len + 1}"]
    return []
