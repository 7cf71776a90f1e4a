"""The trainer's runtime input, checked before any process, thread or socket exists.

The config's own checks (training/resilience/config.py) run wherever the config is parsed, the job renderer
included, so they cannot look at files or variables that exist only in the pod: the token file on FSx,
the run folder, the launcher's environment. These are checked here, first thing in each rank. Every
rank checks the same inputs and exits 2 with the same message, so no rank is left waiting in a
collective for a peer that failed, and the Job's podFailurePolicy fails the job on exit code 2.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.kitcore.paths import name_problem, path_problem
from nvrx_eks.training.resilience.modes import layers

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from nvrx_eks.training.resilience.config import ResilienceConfig

MAX_PORT = 65535


def check_runtime_inputs(
    cfg: ResilienceConfig, env: Mapping[str, str] | None = None, *, more: Sequence[str] = ()
) -> None:
    """Raise one UserError naming every bad runtime input (file, folder, variable) and its fix; `more`
    are the training script's own problems (from `Job(input_checks=...)`), reported in the same message."""
    env = os.environ if env is None else env
    long_name = name_problem(cfg.run_dir)
    if long_name:  # every later check (and the default checkpoint folders) resolves below it
        raise UserError(f"trainer runtime input:\n  - run_dir {long_name}")
    problems = [*_environment(cfg, env), *_run_dir(cfg.run_dir), *more]
    problems += [*_checkpoint_tiers(cfg), *_s3_credentials(cfg), *_peer_nodes(cfg, env)]
    problems += [*_device(cfg), *_launcher(cfg, env)]
    if problems:
        raise UserError("trainer runtime input:\n" + "\n".join(f"  - {p}" for p in problems))


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


def _environment(cfg: ResilienceConfig, env: Mapping[str, str]) -> list[str]:
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


def _tier_folders(cfg: ResilienceConfig) -> dict[str, Path]:
    """The folders the checkpoint tiers in use write (an s3:// durable tier has none)."""
    ckpt = cfg.effective_checkpoint()
    folders = {"checkpoint.memory_dir": Path(ckpt.memory_dir)} if ckpt.memory_every else {}
    if ckpt.local_dir is not None and ckpt.local_every:
        folders["checkpoint.local_dir"] = Path(ckpt.local_dir)
    if ckpt.durable_dir and ckpt.durable_every and not ckpt.durable_dir.startswith("s3://"):
        folders["checkpoint.durable_dir"] = Path(ckpt.durable_dir)
    return folders


def _checkpoint_tiers(cfg: ResilienceConfig) -> list[str]:
    """Each tier's folder can be created and written, and no two tiers share one: every tier keeps
    its own newest steps and deletes older ones, so a shared folder loses the other tier's."""
    folders = _tier_folders(cfg)
    problems = []
    for field, folder in folders.items():
        tier = field.split(".")[1].removesuffix("_dir")
        problem = path_problem(folder, "write_folder", what=f"{tier} tier")
        if problem:
            problems.append(f"{field} {folder} {problem}")
    if problems:
        return problems
    resolved = {field: folder.resolve() for field, folder in folders.items()}
    fields = list(resolved)
    for i, first in enumerate(fields):
        for second in fields[i + 1 :]:
            a, b = resolved[first], resolved[second]
            if a == b or a.is_relative_to(b) or b.is_relative_to(a):
                where = f"both {a}" if a == b else f"{a} and {b}, one inside the other"
                problems.append(
                    f"{first} and {second} are {where}: each tier prunes its own old steps there and "
                    "would delete the other's; give each tier its own folder"
                )
    return problems


def _s3_credentials(cfg: ResilienceConfig) -> list[str]:
    """An s3:// durable tier needs credentials before the first persist, not at it."""
    ckpt = cfg.effective_checkpoint()
    if not (ckpt.durable_dir and ckpt.durable_every and ckpt.durable_dir.startswith("s3://")):
        return []
    import boto3  # noqa: PLC0415 - only for an S3 durable tier

    if boto3.Session().get_credentials() is not None:
        return []
    return [
        (
            f"checkpoint.durable_dir {ckpt.durable_dir}: no AWS credentials in this process (none from the "
            "environment, a profile, EKS Pod Identity or instance metadata); run the pod with the stack's "
            "training service account, set AWS_PROFILE, or use a file-system durable_dir"
        )
    ]


def _peer_nodes(cfg: ResilienceConfig, env: Mapping[str, str]) -> list[str]:
    """Peer replicas against this run's nodes (the launcher's WORLD_SIZE over LOCAL_WORLD_SIZE; one node
    without a launcher). With too few the tier would not run at all."""
    if not cfg.checkpoint.peer_replicas:
        return []
    try:
        world = int(env.get("WORLD_SIZE", "1"))
        per_node = max(1, int(env.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return []  # reported by _environment
    problem = cfg.checkpoint.peer_nodes_problem(max(1, world // per_node))
    if problem is None:
        return []
    return [f"checkpoint.{problem} (WORLD_SIZE {world} / LOCAL_WORLD_SIZE {per_node})"]


def _device(cfg: ResilienceConfig) -> list[str]:
    if cfg.dist.device != "cuda":
        return []
    import torch  # noqa: PLC0415 - imported by the run right after; only for an explicit cuda

    if torch.cuda.is_available():
        return []
    why = "a CPU-only build" if torch.version.cuda is None else "no GPU visible to this process"
    return [
        (
            f"dist.device is cuda, but torch {torch.__version__} finds no CUDA device ({why}); use "
            "dist.device auto (CPU + gloo here) or run on a GPU node"
        )
    ]


def _launcher(cfg: ResilienceConfig, env: Mapping[str, str]) -> list[str]:
    """A mode with heartbeats beats to ft_launcher's rank monitor, whose socket the launcher passes each
    worker; without it NVRx fails at the first heartbeat with a RuntimeError."""
    problems = []
    spec = layers(cfg.mode)
    if spec.inprocess and "WORLD_SIZE" not in env:
        # NVRx's in-process store reads RANK and WORLD_SIZE from the environment (a KeyError without).
        problems.append(
            f"mode {cfg.mode} needs a launcher's RANK and WORLD_SIZE (NVRx's in-process restart reads "
            "them); start it with torchrun or `python -m nvrx_eks.training.resilience.launch`, or for "
            "one rank set RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500; "
            "or use mode baseline to run alone"
        )
    if not spec.heartbeats:
        return problems
    from nvidia_resiliency_ext.fault_tolerance.data import FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR  # noqa: PLC0415

    if env.get(FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR):
        return problems
    return [
        *problems,
        (
            f"mode {cfg.mode} runs under ft_launcher, and this process was not started by it "
            f"({FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR} is unset); start it with `python -m "
            f"nvrx_eks.training.resilience.launch` "
            "(k8s/launcher.py renders the command), or use mode inprocess or baseline to run alone"
        ),
    ]
