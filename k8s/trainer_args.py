"""What each rank runs, rendered from job values and checked with the trainer's own parser.

The reference trainer: the values' `trainer` tree uses its field names (training/config.py
`TrainConfig`); each leaf becomes `--a-b VALUE`, the same flags `python -m nvrx_eks.training --help` lists.
A script of your own (`entrypoint`): the same tree holds only the kit's resilience fields
(training/resilience/config.py `ResilienceConfig`), handed to it whole as one JSON variable
(`NVRX_EKS_CONFIG`), since its command line is its own. Either way the chart adds the fields it owns
(mode, run folder, checkpoint folders per tier, the in-process restart budget).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import yaml

from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.training.resilience.config import (
    CONFIG_ENV,
    PLAN_ITEM,
    REFERENCE_TRAINER,
    config_leaves,
    resilience_config,
)

if TYPE_CHECKING:
    from nvrx_eks.k8s.values import JobValues
    from nvrx_eks.training.resilience.config import ResilienceConfig


def _scalar(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ",".join(value)  # e.g. faults.plan: CLASS@STEP[:RANK],...
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()


def _trainer_has(section: str, name: str) -> bool:
    from nvrx_eks.training.config import TrainConfig  # noqa: PLC0415 - imports torch (model presets)

    sub = TrainConfig.model_fields[section].annotation
    return name in getattr(sub, "model_fields", {})


def durable_dir(values: JobValues) -> str:
    """The durable tier: below the FSx folder linked to S3."""
    s = values.storage
    return f"{s.fsx_mount_path}/{s.fsx_export_dir.strip('/')}/{values.name}"


def local_dir(values: JobValues) -> str | None:
    """The node-local tier on the NVMe hostPath, or None without one."""
    s = values.storage
    return f"{s.local_mount_path}/checkpoints/{values.name}" if s.local_nvme_path else None


def chart_owned_fields(values: JobValues) -> dict[str, Any]:
    s = values.storage
    owned: dict[str, Any] = {
        "mode": values.mode,
        "run_dir": f"{s.fsx_mount_path}/runs/{values.name}",
        "checkpoint": {
            # The pod's memory-backed emptyDir (k8s/job_chart.py): dies with the pod, as host RAM does.
            "memory_dir": s.memory_mount_path,
            "durable_dir": durable_dir(values),
        },
    }
    if s.local_nvme_path:
        owned["checkpoint"]["local_dir"] = local_dir(values)
    if s.s3_bucket and _trainer_has("checkpoint", "s3_uri"):
        owned["checkpoint"]["s3_uri"] = f"s3://{s.s3_bucket}/{s.s3_prefix.strip('/')}/{values.name}"
    if values.peer_replicas:
        owned["checkpoint"]["peer_replicas"] = values.peer_replicas
    if values.mode in {"inprocess", "both"}:
        owned["inprocess"] = {"max_iterations": values.budgets.inprocess_max_iterations}
    return owned


def trainer_args(values: JobValues) -> list[str]:
    """`--flag value` pairs for `python -m nvrx_eks.training`, chart-owned fields first."""
    args: list[str] = []
    for tree in (chart_owned_fields(values), values.trainer):
        for path, value in config_leaves(tree):
            args += ["--" + "-".join(path).replace("_", "-"), _scalar(value)]
    return args


def entry_command(values: JobValues) -> list[str]:
    """What the launcher runs in every rank: `-m nvrx_eks.training ARGS`, or the entrypoint's module or
    script."""
    if values.entrypoint is None:
        return ["-m", REFERENCE_TRAINER, *trainer_args(values)]
    return values.entrypoint.command()


def resilience_document(values: JobValues) -> dict[str, Any]:
    """A script's `NVRX_EKS_CONFIG`: the values' `trainer` tree over the chart-owned fields."""

    def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
        merged = dict(base)
        for key, value in over.items():
            both = isinstance(value, dict) and isinstance(merged.get(key), dict) and key != "weights"
            merged[key] = merge(merged[key], value) if both else value
        return merged

    return merge(chart_owned_fields(values), values.trainer)


def resilience_env(values: JobValues) -> dict[str, str]:
    """The variables a script's ranks read the kit's settings from (none for the reference trainer,
    whose settings are its flags)."""
    from nvrx_eks.training.resilience.launch import PRELOAD_ENV  # noqa: PLC0415

    if values.entrypoint is None:
        return {}
    env = {CONFIG_ENV: json.dumps(resilience_document(values), sort_keys=True, separators=(",", ":"))}
    if values.entrypoint.preload:
        env[PRELOAD_ENV] = ",".join(values.entrypoint.preload)
    return env


def check_trainer_args(values: JobValues) -> ResilienceConfig:
    """Parse the rendered arguments with the trainer's parser (a script's: its resilience config); a bad
    one is a `trainer` field error."""
    from nvrx_eks.training.config import parse_args  # noqa: PLC0415 - imports torch (model presets)

    config: ResilienceConfig
    try:
        if values.entrypoint:
            config = resilience_config(resilience_document(values), source="trainer (entrypoint)")
        else:
            config = parse_args(trainer_args(values))
    except UserError as exc:
        raise UserError(f"trainer: {exc}") from None
    from nvrx_eks.training.faults import build_schedule  # noqa: PLC0415

    # A script's loop length is its own (its `Attempt.steps` checks the plan against it): the ranks are
    # checked here over the plan's own span.
    plan_steps = [int(PLAN_ITEM.match(item)["step"]) for item in config.faults.plan]  # type: ignore[index]
    steps = getattr(config, "steps", max(plan_steps, default=0) + 1)
    try:
        # The ranks a fault plan targets exist only once the world size is known: here it is.
        if not (values.entrypoint and config.faults.count):
            build_schedule(config.faults, steps=steps, world_size=values.world_size, seed=config.seed)
    except UserError as exc:
        raise UserError(
            f"trainer: {exc} ({values.num_nodes} nodes x {values.profile.workers_per_node})"
        ) from None
    t = values.timeouts
    if values.mode in {"inprocess", "both"}:
        silence = config.inprocess_recovery_silence_s
        if t.launcher_heartbeat_s <= silence:
            raise UserError(
                f"timeouts.launcher_heartbeat_s ({t.launcher_heartbeat_s:g}) must exceed the longest "
                "silence of a rank recovering in process (trainer max(inprocess.soft_timeout_s, "
                f"dist.timeout_s) + inprocess.interval_s = {silence:g}): the launcher must not kill a "
                "rank the in-process layer is still restarting"
            )
    budget = memory_budget(values, config)
    if budget is not None and budget.needed_gib > values.memory_tier_gib:
        raise UserError(
            f"storage.memory_tier_gib: the node's checkpoints in RAM need {budget.describe()}, more than "
            f"the memory tier's {values.memory_tier_gib} GiB: raise storage.memory_tier_gib (the "
            f"{values.instance_profile} profile has {values.profile.memory_gib} GiB), lower "
            "storage.peer_replicas or trainer.checkpoint.num_staging_slots"
        )
    return config


@dataclass(frozen=True)
class MemoryBudget:
    """Host memory the memory tier holds per node: the node's own snapshots and its partners' copies."""

    own_gib: float
    partners_gib: float

    @property
    def needed_gib(self) -> float:
        return self.own_gib + self.partners_gib

    def describe(self) -> str:
        return (
            f"{self.needed_gib:.2f} GiB ({self.own_gib:.2f} GiB of own snapshots + "
            f"{self.partners_gib:.2f} GiB of partners' copies)"
        )


def memory_budget(values: JobValues, config: ResilienceConfig) -> MemoryBudget | None:
    """Per node: ranks x state per rank x (staging slots + 2 kept copies per partner node served); None
    for a script of your own, whose state size only its ranks know (they report it as `state_bytes`).

    State per rank: the whole model on CPU (replicated data parallel); a 1/world share on GPU (FSDP2)."""
    from nvrx_eks.training.config import TrainConfig  # noqa: PLC0415
    from nvrx_eks.training.shapes import PRESETS  # noqa: PLC0415

    if not isinstance(config, TrainConfig):
        return None
    state = PRESETS[config.model].state_bytes
    per_rank = state if values.profile.gpus == 0 else state / values.world_size
    per_node = per_rank * values.profile.workers_per_node
    gib = 1024**3
    return MemoryBudget(
        own_gib=per_node * config.checkpoint.staging_slots / gib,
        partners_gib=per_node * 2 * values.peer_replicas / gib,
    )
