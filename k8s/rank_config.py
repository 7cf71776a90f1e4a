"""What each rank is given: the job values' `trainer` section, as the kit's typed configuration.

Whatever the script (the reference trainer or your own, the values' `entrypoint`), the section is the
kit's `ResilienceConfig` (training/resilience/config.py), handed to every rank whole as one JSON
variable (`NVRX_EKS_CONFIG`, `config_env_value`), which `kit.Job()` reads; the script's own settings
are its command line (`entrypoint.args`). The chart owns some fields (mode, run folder, checkpoint
folders per tier, peer replicas, the in-process restart budget): `rank_config` refuses them in the
section, sets them from the rest of the values, and validates the whole once, so the job values hold
exactly what the ranks will run with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import TypeAdapter, ValidationError

from nvrx_eks.kitcore.configio import merge
from nvrx_eks.training.checkpoint.config import CheckpointConfig
from nvrx_eks.training.resilience.config import CONFIG_ENV, ResilienceConfig, config_env_value
from nvrx_eks.training.resilience.modes import layers
from nvrx_eks.training.resilience.shrink import ShrinkConfig
from nvrx_eks.training.resilience.warm_entry import PRELOAD_IMPORTS_ENV

if TYPE_CHECKING:
    from collections.abc import Mapping

    from nvrx_eks.k8s.sections import Budgets, Entrypoint, Shrink, Storage
    from nvrx_eks.kitcore.profiles import InstanceProfile
    from nvrx_eks.training.resilience.modes import Mode

CHART_OWNED_FIELDS = {
    ("mode",): "mode",
    ("run_dir",): "storage.fsx_mount_path",
    ("checkpoint", "memory_dir"): "storage.memory_mount_path",
    ("checkpoint", "local_dir"): "storage.local_nvme_path",
    ("checkpoint", "durable_dir"): "storage.fsx_export_dir",
    ("checkpoint", "peer_replicas"): "storage.peer_replicas",
    ("inprocess", "max_iterations"): "budgets.inprocess_max_iterations",
    ("shrink",): "shrink and num_nodes",
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
    if layers(mode).inprocess:
        owned["inprocess"] = {"max_iterations": budgets.inprocess_max_iterations}
    return owned


def rank_config(
    section: Mapping[str, Any],
    *,
    name: str,
    mode: Mode,
    storage: Storage,
    budgets: Budgets,
    num_nodes: int,
    shrink: Shrink | None = None,
    ranks_per_node: int = 1,
) -> ResilienceConfig:
    """The values' `trainer` section with the chart's fields set, validated once as the ranks'
    `ResilienceConfig`.

    Raises pydantic's ValidationError, each field's path kept (trainer.checkpoint.memory_every...); a
    chart-owned field set in the section is one of its errors, naming the value that sets it, and so is
    a script's own setting (trainer.steps), naming where it goes."""
    problems = [*_chart_owned_in(section), *_script_settings_in(section)]
    owned = _chart_owned(name, mode, storage, budgets)
    if storage.peer_replicas is None and num_nodes > 1 and _takes_memory_snapshots(section.get("checkpoint")):
        owned["checkpoint"]["peer_replicas"] = 1
    kits = {key: value for key, value in section.items() if key in ResilienceConfig.model_fields}
    try:
        config = ResilienceConfig.model_validate(merge(kits, owned))
    except ValidationError as exc:
        # One message for all: the section's own errors beside the fields it must not hold.
        problems += [
            {k: v for k, v in e.items() if k in ("type", "loc", "input", "ctx")} for e in exc.errors()
        ]
    if problems:
        raise ValidationError.from_exception_data("trainer", problems)
    if shrink is not None and shrink.min_nodes is not None:
        # The node counts the layout runs at, from the validated mesh; JobValues refuses a min_nodes that
        # is not among them, naming both.
        counts = config.parallel.node_counts(num_nodes, ranks_per_node, down_to=shrink.min_nodes)
        owned_shrink = ShrinkConfig(
            nodes=num_nodes,
            node_counts=counts,
            after_s=shrink.pending_limit_s,
            grow_wait_s=shrink.grow_wait_s,
        )
        config = config.model_copy(update={"shrink": owned_shrink})
    return config


def _chart_owned_in(section: Mapping[str, Any]) -> list[Any]:
    """An error for each field of the section the chart sets itself."""
    owned_here: list[Any] = []
    for path, owner in CHART_OWNED_FIELDS.items():
        node: Any = section
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            why = f"set by the chart (from {owner}); remove it from trainer"
            owned_here.append({"type": "value_error", "loc": path, "input": node, "ctx": {"error": why}})
    return owned_here


def _script_settings_in(section: Mapping[str, Any]) -> list[Any]:
    """An error for each top-level key that is none of the kit's fields: a script's own setting (the
    reference trainer's model or steps), which is the script's argument, not the kit's."""
    kit = ", ".join(ResilienceConfig.model_fields)
    return [
        {
            "type": "value_error",
            "loc": (key,),
            "input": value,
            "ctx": {
                "error": f"not one of the kit's fields ({kit}); a script's own setting is its argument: "
                f"entrypoint.args, e.g. [--{str(key).replace('_', '-')}, {value}]"
            },
        }
        for key, value in section.items()
        if key not in ResilienceConfig.model_fields
    ]


def _takes_memory_snapshots(checkpoint: object) -> bool:
    """Whether the section's checkpointer takes memory snapshots, which a peer replica copies: the
    chart's default of one replica depends on it, and the replica changes what the section must hold
    (staging slots), so it is read before the section is validated, each field with its own type. A bad
    value reads as the default here; the section's validation reports it."""
    given = checkpoint if isinstance(checkpoint, dict) else {}
    values: dict[str, Any] = {}
    for name in ("implementation", "memory_every"):
        field = CheckpointConfig.model_fields[name]
        adapter: TypeAdapter[Any] = TypeAdapter(Annotated[field.annotation, field])  # type: ignore[arg-type]
        try:
            values[name] = adapter.validate_python(given.get(name, field.default))
        except ValidationError:
            values[name] = field.default
    return CheckpointConfig.model_construct(**values).snapshots_in_memory


def resilience_env(entrypoint: Entrypoint, config: ResilienceConfig) -> dict[str, str]:
    """The variables every rank reads the kit's settings from, and the modules its pod preloads."""
    from nvrx_eks.training.resilience.launch import PRELOAD_ENV  # noqa: PLC0415 - imports NVRx

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


def memory_budget(
    config: ResilienceConfig, entrypoint: Entrypoint, profile: InstanceProfile
) -> MemoryBudget | None:
    """Per node: ranks x state per rank x (staging slots + 2 kept copies per partner node served), from
    the values' hint of the state per rank (`entrypoint.state_gib_per_rank`); None without the hint,
    when only the ranks know the state's size (they report it as `state_bytes`)."""
    if entrypoint.state_gib_per_rank is None:
        return None
    per_node_gib = entrypoint.state_gib_per_rank * profile.workers_per_node
    return MemoryBudget(
        own_gib=per_node_gib * config.checkpoint.staging_slots,
        partners_gib=per_node_gib * 2 * config.checkpoint.peer_replicas,
    )
