"""What each rank is given: the job values' `trainer` section, as the trainer's own typed configuration.

The reference trainer: the section is its `TrainConfig` (training/config.py), handed to the ranks as
the flags its parser reads back (`to_args`). A script of your own (`entrypoint`): the section is the
kit's `ResilienceConfig` (training/resilience/config.py), handed over whole as one JSON variable
(`NVRX_EKS_CONFIG`, `config_env_value`), since its command line is its own. Either way the
chart owns some fields (mode, run folder, checkpoint folders per tier, peer replicas, the in-process
restart budget): `rank_config` refuses them in the section, sets them from the rest of the values, and
validates the whole once, so the job values hold exactly what the ranks will run with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import TypeAdapter, ValidationError

from nvrx_eks.kitcore.configio import merge
from nvrx_eks.training.checkpoint.config import CheckpointConfig
from nvrx_eks.training.config import TrainConfig, to_args
from nvrx_eks.training.resilience.config import (
    CONFIG_ENV,
    REFERENCE_TRAINER,
    ResilienceConfig,
    config_env_value,
)
from nvrx_eks.training.resilience.warm_entry import PRELOAD_IMPORTS_ENV
from nvrx_eks.training.shapes import PRESETS

if TYPE_CHECKING:
    from collections.abc import Mapping

    from nvrx_eks.k8s.sections import Budgets, Entrypoint, Storage
    from nvrx_eks.kitcore.profiles import InstanceProfile
    from nvrx_eks.training.resilience.config import Mode

CHART_OWNED_FIELDS = {
    ("mode",): "mode",
    ("run_dir",): "storage.fsx_mount_path",
    ("checkpoint", "memory_dir"): "storage.memory_mount_path",
    ("checkpoint", "local_dir"): "storage.local_nvme_path",
    ("checkpoint", "durable_dir"): "storage.fsx_export_dir",
    ("checkpoint", "peer_replicas"): "storage.peer_replicas",
    ("inprocess", "max_iterations"): "budgets.inprocess_max_iterations",
}
"""Trainer fields the chart sets, and the value each is set from."""


def _chart_owned(name: str, mode: Mode, storage: Storage, budgets: Budgets) -> dict[str, Any]:
    checkpoint: dict[str, Any] = {
        # The pod's memory-backed emptyDir (k8s/job_chart.py): dies with the pod, as host RAM does.
        "memory_dir": storage.memory_mount_path,
        # Below the FSx folder linked to S3: FSx exports each committed checkpoint on its own.
        "durable_dir": f"{storage.fsx_mount_path}/{storage.fsx_export_dir.strip('/')}/{name}",
    }
    if storage.local_nvme_path:
        # The node's NVMe hostPath, mounted at local_mount_path.
        checkpoint["local_dir"] = f"{storage.local_mount_path}/checkpoints/{name}"
    if storage.peer_replicas is not None:
        checkpoint["peer_replicas"] = storage.peer_replicas
    owned: dict[str, Any] = {
        "mode": mode,
        "run_dir": f"{storage.fsx_mount_path}/runs/{name}",
        "checkpoint": checkpoint,
    }
    if mode in {"inprocess", "both"}:
        owned["inprocess"] = {"max_iterations": budgets.inprocess_max_iterations}
    return owned


def rank_config(
    section: Mapping[str, Any],
    *,
    script: bool,
    name: str,
    mode: Mode,
    storage: Storage,
    budgets: Budgets,
    num_nodes: int,
) -> ResilienceConfig:
    """The values' `trainer` section with the chart's fields set, validated once as the trainer's own
    configuration: `TrainConfig` for the reference trainer, `ResilienceConfig` for a script.

    Raises pydantic's ValidationError, each field's path kept (trainer.checkpoint.memory_every...); a
    chart-owned field set in the section is one of its errors, naming the value that sets it."""
    owned_here = []
    for path, owner in CHART_OWNED_FIELDS.items():
        node: Any = section
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            why = f"set by the chart (from {owner}); remove it from trainer"
            owned_here.append({"type": "value_error", "loc": path, "input": node, "ctx": {"error": why}})
    if script:
        # The reference trainer's own fields (model, steps, ...) are the script's business: its args.
        kit = sorted(f for f in ResilienceConfig.model_fields if (f,) not in CHART_OWNED_FIELDS)
        owned_here += [
            {
                "type": "value_error",
                "loc": (key,),
                "input": section[key],
                "ctx": {
                    "error": f"with an entrypoint, trainer: holds only the kit's fields ({', '.join(kit)}); "
                    f"your script's own settings go in entrypoint.args (e.g. [--{key}, VALUE])"
                },
            }
            for key in section
            if key not in ResilienceConfig.model_fields
        ]
    if owned_here:
        raise ValidationError.from_exception_data("trainer", owned_here)
    model: type[ResilienceConfig] = ResilienceConfig if script else TrainConfig
    owned = _chart_owned(name, mode, storage, budgets)
    if storage.peer_replicas is None and num_nodes > 1 and _takes_memory_snapshots(section.get("checkpoint")):
        owned["checkpoint"]["peer_replicas"] = 1
    return model.model_validate(merge(dict(section), owned))


def _takes_memory_snapshots(checkpoint: object) -> bool:
    """Whether the section's checkpointer takes memory snapshots, which a peer replica copies: the
    chart's default of one replica depends on it, and the replica changes what the section must hold
    (staging slots), so it is read before the section is validated, each field with its own type. A bad
    value reads as the default here; the section's validation reports it."""
    given = checkpoint if isinstance(checkpoint, dict) else {}
    values = {}
    for name in ("implementation", "memory_every"):
        field = CheckpointConfig.model_fields[name]
        try:
            values[name] = TypeAdapter(Annotated[field.annotation, field]).validate_python(
                given.get(name, field.default)
            )
        except ValidationError:
            values[name] = field.default
    return CheckpointConfig.model_construct(**values).snapshots_in_memory


def entry_command(entrypoint: Entrypoint | None, config: ResilienceConfig) -> list[str]:
    """What the launcher runs in every rank: `-m nvrx_eks.training ARGS`, or the entrypoint's module or
    script."""
    if entrypoint is None:
        return ["-m", REFERENCE_TRAINER, *to_args(config)]
    return entrypoint.command()


def resilience_env(entrypoint: Entrypoint | None, config: ResilienceConfig) -> dict[str, str]:
    """The variables a script's ranks read the kit's settings from (none for the reference trainer,
    whose settings are its flags)."""
    from nvrx_eks.training.resilience.launch import PRELOAD_ENV  # noqa: PLC0415 - imports NVRx

    if entrypoint is None:
        return {}
    env = {CONFIG_ENV: config_env_value(config)}
    if entrypoint.preload:
        env[PRELOAD_ENV] = ",".join(entrypoint.preload)
    if not entrypoint.preload_imports:
        env[PRELOAD_IMPORTS_ENV] = "0"
    return env


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


def memory_budget(config: ResilienceConfig, profile: InstanceProfile, num_nodes: int) -> MemoryBudget | None:
    """Per node: ranks x state per rank x (staging slots + 2 kept copies per partner node served); None
    for a script of your own, whose state size only its ranks know (they report it as `state_bytes`).

    State per rank: the whole model on CPU (replicated data parallel); a 1/world share on GPU (FSDP2)."""
    if not isinstance(config, TrainConfig):
        return None
    world_size = num_nodes * profile.workers_per_node
    state = PRESETS[config.model].state_bytes
    per_rank = state if profile.gpus == 0 else state / world_size
    per_node = per_rank * profile.workers_per_node
    gib = 1024**3
    return MemoryBudget(
        own_gib=per_node * config.checkpoint.staging_slots / gib,
        partners_gib=per_node * 2 * config.checkpoint.peer_replicas / gib,
    )
