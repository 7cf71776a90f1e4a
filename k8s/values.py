"""Typed job values: the one template a platform team parameterizes (YAML file + `key=value` overrides).

Loaded with `k8s.load.load_values(path, overrides)`; every bad value ends as one message naming the
field and the fix. The `trainer` section is the trainer's own typed configuration with the chart's
fields set (k8s/rank_config.py), so it is validated once, with the rest. Cross-field rules (restart
budgets that agree across layers, timeouts in order, what the memory tier must hold, an NVRx release
the kit does not support) are checked here, before anything is rendered.

`image: local` means "no container image: the local executor runs the command with this machine's
virtualenv", whose NVRx is the image's pin (`make setup`); `nvrx_version` names another one (a custom
image), refused below the pin's minor release (k8s/nvrx_versions.py).
"""

from __future__ import annotations

import re
from functools import cached_property
from pathlib import PurePosixPath
from typing import Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from nvrx_eks.k8s import names
from nvrx_eks.k8s.durable_cost import PlanHints  # noqa: TC001 - used at runtime by pydantic
from nvrx_eks.k8s.nvrx_versions import LOCAL_IMAGE, resolve_nvrx_version
from nvrx_eks.k8s.rank_config import MemoryBudget, memory_budget, rank_config
from nvrx_eks.k8s.sections import (
    NVME_RAID_ROOT,
    REGION_ENV,
    Budgets,
    Entrypoint,
    SecretRef,
    Section,
    Shrink,
    Storage,
    Timeouts,
    check_aws_region,
    check_dns_subdomain,
    check_env_name,
    check_image_digest,
    check_image_reference,
    check_label_key,
    check_label_value,
)
from nvrx_eks.kitcore import naming
from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.kitcore.profiles import InstanceProfile, get_profile, profile_for_field
from nvrx_eks.training.resilience.config import ResilienceConfig
from nvrx_eks.training.resilience.modes import Mode, layers

_SECRET_NAME = re.compile(r"(SECRET|PASSWORD|TOKEN|CREDENTIAL|PRIVATE_KEY|ACCESS_KEY)", re.IGNORECASE)
# Shared memory for NCCL and data loaders: an eighth of host memory; the memory checkpoint tier: a
# quarter. Both are memory-backed emptyDirs and count against the pod's memory limit.
SHM_FRACTION = 8
MEMORY_TIER_FRACTION = 4
# Requests leave room for the node's daemons (kubelet, device plugins, DCGM, node monitoring agent).
ALLOCATABLE_FRACTION = 0.9
# Job name + "-<index>" is the pod hostname (63 chars); "-rdzv" and "-nodes" are suffixed to Services.
_MAX_NAME = 40


class JobValues(Section):
    """One training job. Top-level names are a contract with the ops and demo tooling."""

    name: str
    namespace: str = names.TRAINING_NAMESPACE
    image: str = LOCAL_IMAGE
    """Container image, or `local` for the local executor (this virtualenv)."""
    store_image: str | None = None
    """The rendezvous store's image by digest (images/store.Dockerfile: Python, torch's CPU build, NVRx
    and the store's module; the training image would put ~20 GB on the system nodes). `nvrx-eks image
    push` prints it as REPOSITORY:TAG-store@sha256:DIGEST and `nvrx-eks values --stack` sets it. Required
    with a container `image`; with `image: local` the store runs on this machine too (leave it unset)."""
    nvrx_version: str | None = None
    """NVRx in the image; default: kitcore/pins.py IMAGE.nvrx_version, or the installed one for `local`."""
    service_account: str = names.TRAINING_SERVICE_ACCOUNT
    """Bound to the checkpoint-prefix IAM role by EKS Pod Identity (the cluster stack)."""
    num_nodes: int = Field(ge=1)
    spares: int = Field(0, ge=0)
    """Hot spare pods beyond num_nodes: scheduled, self-checked, their launcher started and its agent
    waiting in NVRx's rendezvous (`--nnodes=N:N+S`: 0.7's barrier rendezvous selects N active nodes per
    round, previous actives first, and keeps the rest standing by). A restart round (a SIGKILL, a
    deadlock) waits `timeouts.rdzv_last_call_s` for every previous active node before it takes a spare, so
    a spare takes only a lost node's place; the Job's replacement pod becomes the next spare. The GPU
    node group must have room for num_nodes + spares nodes (`nvrx-eks preflight` checks it)."""
    instance_profile: str = "local-cpu"
    mode: Mode = "both"
    budgets: Budgets = Budgets()
    timeouts: Timeouts = Timeouts()
    storage: Storage = Storage()
    shrink: Shrink = Shrink()
    entrypoint: Entrypoint = Entrypoint()
    """The training script every rank runs and its own arguments: the reference trainer (`python -m
    nvrx_eks.training`) unless it names your module or script."""
    trainer: ResilienceConfig = Field(None, validate_default=True)
    """The kit's settings every rank runs with, as a tree, whatever the script: checkpoint cadences,
    inprocess, ft, dist, faults, metrics, seed (training/resilience/config.py; default: none set).
    Validated with the fields the chart owns set from mode, storage and budgets (k8s/rank_config.py),
    so it reads as the ranks will: values.trainer.checkpoint.memory_every. Handed to every rank as
    NVRX_EKS_CONFIG."""

    @field_validator("entrypoint", mode="before")
    @classmethod
    def _default_entrypoint(cls, value: Any) -> Any:  # noqa: ANN401
        # `entrypoint:` with nothing under it (YAML's null) is the default entry point.
        return {} if value is None else value

    @field_validator("trainer", mode="before")
    @classmethod
    def _the_ranks_config(cls, section: Any, info: ValidationInfo) -> ResilienceConfig:  # noqa: ANN401
        given = info.data
        needed = ("name", "num_nodes", "mode", "budgets", "storage", "shrink", "instance_profile")
        if any(field not in given for field in needed):
            # One of them is invalid and reported, so these values fail anyway: the section is checked
            # once they are right.
            return ResilienceConfig()
        if section is None:
            section = {}
        if not isinstance(section, dict):
            # A ValueError: pydantic reports it as this field's error (a TypeError would escape).
            raise ValueError(  # noqa: TRY004
                "a mapping of the kit's fields (training/resilience/config.py ResilienceConfig)"
            )
        return rank_config(
            section,
            name=given["name"],
            mode=given["mode"],
            storage=given["storage"],
            budgets=given["budgets"],
            num_nodes=given["num_nodes"],
            shrink=given["shrink"],
            ranks_per_node=get_profile(given["instance_profile"]).workers_per_node,
        )

    kueue_queue: str | None = None
    """Kueue LocalQueue to submit to (the Job is created suspended; Kueue admits it)."""
    priority_class: str | None = "nvrx-training"
    store_priority_class: str | None = "nvrx-rendezvous-store"
    system_node_selector: dict[str, str] = Field(default_factory=dict)
    """Where the rendezvous store runs (the cluster's system node group label)."""
    gpu_node_selector: dict[str, str] = Field(default_factory=dict)
    """Extra labels the training nodes must carry (e.g. the node-health label)."""
    require_verified_nodes: bool | None = None
    """Schedule only on nodes the node check verified (label nvrx-eks/verified=true; the cluster stack's
    node_check). Default: on for EC2 profiles, off for local runs."""
    aws_region: str | None = None
    """The Region of the job's AWS resources (the checkpoint bucket), set as AWS_REGION and
    AWS_DEFAULT_REGION in the trainer's environment. The pods cannot ask the node's instance metadata,
    where an SDK would otherwise look it up (hop limit 1, and the job's NetworkPolicy), so a job that
    writes to S3 needs it; `nvrx-eks values --stack NAME` sets it from the stack's Region output."""
    env: dict[str, str] = Field(default_factory=dict)
    secret_env: dict[str, SecretRef] = Field(default_factory=dict)
    """Environment variables read from Kubernetes Secrets (never plain values)."""
    active_deadline_s: int | None = Field(None, ge=1)
    ttl_after_finished_s: int | None = Field(86400, ge=0)
    plan: PlanHints | None = None
    """Written by `nvrx-eks plan --write`: the step and durable write time its cadences assume
    (`job render` warns when trainer.checkpoint.durable_every undercuts the write). Not rendered."""

    @field_validator("name", "namespace")
    @classmethod
    def _dns_label(cls, value: str) -> str:
        problem = naming.dns_label_problem(value, max_length=_MAX_NAME)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("image")
    @classmethod
    def _image(cls, value: str) -> str:
        return value if value == LOCAL_IMAGE else check_image_digest(check_image_reference(value))

    @field_validator("store_image")
    @classmethod
    def _store_image(cls, value: str | None) -> str | None:
        if value is None or value == LOCAL_IMAGE:
            return value
        return check_image_digest(check_image_reference(value))

    @model_validator(mode="after")
    def _store_image_matches_image(self) -> JobValues:
        local_store = self.store_image in {None, LOCAL_IMAGE}
        if self.image == LOCAL_IMAGE and not local_store:
            raise ValueError(
                "store_image: image: local runs the whole job on this machine, the store included; remove "
                "store_image (or set image to the training image)"
            )
        if self.image != LOCAL_IMAGE and local_store:
            raise ValueError(
                "store_image is missing: the rendezvous store runs its own small image, by digest, "
                "REPOSITORY:TAG-store@sha256:DIGEST, the second line `nvrx-eks image push` prints "
                "(`nvrx-eks values --stack NAME -o VALUES` sets it)"
            )
        return self

    @field_validator("service_account", "priority_class", "store_priority_class")
    @classmethod
    def _object_name(cls, value: str | None) -> str | None:
        return check_dns_subdomain(value) if value is not None else None

    @field_validator("kueue_queue")
    @classmethod
    def _queue(cls, value: str | None) -> str | None:
        # The queue name is a label value (kueue.x-k8s.io/queue-name) and a LocalQueue name.
        return check_dns_subdomain(check_label_value(value)) if value is not None else None

    @field_validator("system_node_selector", "gpu_node_selector")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key, label in value.items():
            check_label_key(key)
            try:
                check_label_value(label)
            except ValueError as exc:
                raise ValueError(f"{key}: {exc}") from None
        return value

    @field_validator("env", mode="before")
    @classmethod
    def _numbers_as_text(cls, value: Any) -> Any:  # noqa: ANN401
        # `OMP_NUM_THREADS: 4` in YAML is a number; an environment value is its text.
        if isinstance(value, dict):
            return {
                k: str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v
                for k, v in value.items()
            }
        return value

    @field_validator("env", "secret_env")
    @classmethod
    def _env_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            check_env_name(key)
        return value

    @field_validator("instance_profile")
    @classmethod
    def _known_profile(cls, value: str) -> str:
        profile_for_field(value)
        return value

    @field_validator("aws_region")
    @classmethod
    def _region(cls, value: str | None) -> str | None:
        return check_aws_region(value) if value is not None else None

    @field_validator("env")
    @classmethod
    def _region_has_its_own_field(cls, value: dict[str, str]) -> dict[str, str]:
        for key in REGION_ENV:
            if key in value:
                raise ValueError(
                    f"{key} is set by the chart from aws_region (both AWS_REGION and AWS_DEFAULT_REGION); "
                    f"move it there: aws_region: {value[key]}"
                )
        return value

    @field_validator("env")
    @classmethod
    def _no_plain_secrets(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if _SECRET_NAME.search(key):
                raise ValueError(
                    f"{key} looks like a secret; put it in a Kubernetes Secret and reference it under "
                    "secret_env (AWS access comes from Pod Identity, never from keys)"
                )
        return value

    @model_validator(mode="after")
    def _spares_wait_for_restarting_nodes(self) -> JobValues:
        t = self.timeouts
        if self.spares and t.rdzv_last_call_s < t.workers_stop_s:
            raise ValueError(
                f"timeouts: rdzv_last_call_s ({t.rdzv_last_call_s}) must be at least workers_stop_s "
                f"({t.workers_stop_s:g}) with spares: a restart round waits that long for every node that "
                "is only restarting its workers, else a spare takes its place"
            )
        return self

    @model_validator(mode="after")
    def _shrink_can_run(self) -> JobValues:
        shrink, minimum = self.shrink, self.shrink.min_nodes
        if minimum is None:
            return self
        if minimum >= self.num_nodes:
            raise ValueError(
                f"shrink.min_nodes ({minimum}) must be below num_nodes ({self.num_nodes}): it is the fewest "
                "nodes the job trains on after a loss; lower it, or unset it to wait for replacements"
            )
        if layers(self.mode).launcher != "ft_launcher":
            raise ValueError(
                f"shrink.min_nodes is set with mode {self.mode}, which has no ft_launcher to restart the "
                "job at another size: use mode ft_launcher or both, or unset shrink.min_nodes"
            )
        problem = self.trainer.parallel.shrink_problem(
            "trainer.parallel.mesh",
            min_nodes=minimum,
            nodes=self.num_nodes,
            ranks_per_node=self.profile.workers_per_node,
        )
        if problem is not None:
            raise ValueError(problem)
        if not self.trainer.checkpoint.durable_every:
            raise ValueError(
                "shrink.min_nodes is set with trainer.checkpoint.durable_every 0: a job that shrinks or "
                "grows restores the durable tier resharded (the RAM and node-local copies serve only the "
                "layout they were written at), so without it the job would start over; set durable_every"
            )
        t, b = self.timeouts, self.budgets
        if shrink.pending_limit_s >= t.rdzv_join_s:
            raise ValueError(
                f"shrink.pending_limit_s ({shrink.pending_limit_s:g}) must be below timeouts.rdzv_join_s "
                f"({t.rdzv_join_s}): the restart round would time out before the job shrinks"
            )
        if b.launcher_max_restarts < 2 * b.expected_node_losses:
            raise ValueError(
                f"budgets: launcher_max_restarts ({b.launcher_max_restarts}) must cover two restart rounds "
                f"per expected node loss ({b.expected_node_losses}) with shrink.min_nodes set: one to "
                "shrink, one to grow back"
            )
        return self

    @model_validator(mode="after")
    def _s3_needs_a_region(self) -> JobValues:
        if self.storage.s3_bucket is not None and self.aws_region is None:
            raise ValueError(
                f"aws_region is missing: the durable tier writes to s3://{self.storage.s3_bucket}, and the "
                "trainer's AWS SDK has no other way to learn the Region (the node's instance metadata is out "
                "of the pod's reach); set aws_region: to the bucket's Region (the stack output Region; "
                "`nvrx-eks values --stack NAME -o VALUES` sets it), or remove storage.s3_bucket"
            )
        return self

    @model_validator(mode="after")
    def _consistent(self) -> JobValues:
        b, t = self.budgets, self.timeouts
        if layers(self.mode).inprocess and b.inprocess_max_iterations >= b.launcher_max_restarts:
            raise ValueError(
                f"budgets: inprocess_max_iterations ({b.inprocess_max_iterations}) must be below "
                f"launcher_max_restarts ({b.launcher_max_restarts}): restart budgets nest in-process < "
                "launcher < Job"
            )
        if b.launcher_max_restarts >= b.job_backoff_limit_per_index:
            raise ValueError(
                f"budgets: launcher_max_restarts ({b.launcher_max_restarts}) must be below "
                f"job_backoff_limit_per_index ({b.job_backoff_limit_per_index})"
            )
        if b.launcher_max_restarts < b.expected_node_losses:
            raise ValueError(
                f"budgets: launcher_max_restarts ({b.launcher_max_restarts}) must cover "
                f"expected_node_losses ({b.expected_node_losses}): each node loss costs every survivor "
                "one launcher restart"
            )
        if t.launcher_initial_heartbeat_s < t.launcher_heartbeat_s:
            raise ValueError(
                f"timeouts: launcher_initial_heartbeat_s ({t.launcher_initial_heartbeat_s:g}) must be at "
                f"least launcher_heartbeat_s ({t.launcher_heartbeat_s:g})"
            )
        if t.rdzv_join_s <= t.pod_reschedule_s:
            raise ValueError(
                f"timeouts: rdzv_join_s ({t.rdzv_join_s:g}) must exceed pod_reschedule_s "
                f"({t.pod_reschedule_s:g}): survivors must wait longer than a replacement takes to start"
            )
        peers = self.trainer.checkpoint.peer_nodes_problem(self.num_nodes)
        if peers:
            raise ValueError(f"storage.{peers} (num_nodes)")
        in_ram = self.shm_gib + self.memory_tier_gib
        if in_ram > self.pod_memory_gib:
            raise ValueError(
                f"storage.memory_tier_gib: /dev/shm ({self.shm_gib} GiB) + memory tier "
                f"({self.memory_tier_gib} GiB) exceed the pod's memory ({self.pod_memory_gib} GiB of "
                f"{self.instance_profile}); lower memory_tier_gib"
            )
        if self.image == LOCAL_IMAGE and self.profile.is_ec2:
            raise ValueError(
                f"image: local runs on this machine's CPUs; instance_profile {self.instance_profile} needs "
                "a container image (set image to the ECR URI)"
            )
        self._check_devices()
        self._check_the_ranks_config()
        try:
            _ = self.resolved_nvrx_version
        except UserError as exc:
            raise ValueError(str(exc)) from None
        return self

    def _check_the_ranks_config(self) -> None:
        """Rules between the trainer's configuration and the rest of the job."""
        config = self.trainer
        ranks = config.faults.ranks_problem(self.world_size)
        if ranks:
            raise ValueError(f"trainer.{ranks} ({self.num_nodes} nodes x {self.profile.workers_per_node})")
        t = self.timeouts
        silence = config.inprocess_recovery_silence_s
        if layers(self.mode).inprocess and t.launcher_heartbeat_s <= silence:
            raise ValueError(
                f"timeouts.launcher_heartbeat_s ({t.launcher_heartbeat_s:g}) must exceed the longest "
                "silence of a rank recovering in process (trainer inprocess.soft_timeout_s + "
                f"inprocess.interval_s = {silence:g}): the launcher must not kill a "
                "rank the in-process layer is still restarting"
            )
        budget = self.memory_budget
        if budget is not None and budget.needed_gib > self.memory_tier_gib:
            raise ValueError(
                f"storage.memory_tier_gib: the node's checkpoints in RAM need {budget.describe()}, more "
                f"than the memory tier's {self.memory_tier_gib} GiB: raise storage.memory_tier_gib (the "
                f"{self.instance_profile} profile has {self.profile.memory_gib} GiB), lower "
                "storage.peer_replicas or trainer.checkpoint.num_staging_slots (the state per rank is "
                "entrypoint.state_gib_per_rank)"
            )

    def _check_devices(self) -> None:
        """Devices the instance profile cannot give the pod (the scheduler would never place it, or
        the ranks would fail on the node)."""
        p = self.profile
        if self.trainer.dist.device == "cuda" and not p.gpus:
            raise ValueError(
                f"trainer.dist.device is cuda, but instance_profile {p.name} has no GPUs; use a GPU "
                "profile (e.g. p5.48xlarge) or device cpu/auto"
            )
        efa_vars = sorted(k for k in self.env if k.startswith("FI_EFA_") or k == "FI_PROVIDER")
        if not p.efa_devices and (
            self.env.get("FI_PROVIDER") == "efa" or any(k.startswith("FI_EFA_") for k in self.env)
        ):
            raise ValueError(
                f"env: {', '.join(efa_vars)} ask for EFA, but instance_profile {p.name} has 0 EFA devices; "
                "remove them or use an EFA profile (the chart sets the EFA variables for those itself)"
            )
        nvme = self.storage.local_nvme_path
        if p.is_ec2 and nvme is not None and not PurePosixPath(nvme).is_relative_to(NVME_RAID_ROOT):
            # Off the array, the hostPath lands on the node's root EBS volume (200 GiB by default,
            # shared with the images): the local tier fills it, and the kubelet evicts pods under
            # disk pressure.
            raise ValueError(
                f"storage.local_nvme_path {nvme} is not on the NVMe array of {p.name} "
                f"({p.nvme_count} x {p.nvme_gib_each} GiB RAID0 at {NVME_RAID_ROOT}); use a folder below "
                f"it, e.g. {NVME_RAID_ROOT}/nvrx-checkpoints, or null for no local tier"
            )

    @cached_property
    def profile(self) -> InstanceProfile:
        return get_profile(self.instance_profile)

    @cached_property
    def resolved_nvrx_version(self) -> str:
        return resolve_nvrx_version(image=self.image, nvrx_version=self.nvrx_version)

    @property
    def verified_nodes_required(self) -> bool:
        if self.require_verified_nodes is None:
            return self.profile.is_ec2
        return self.require_verified_nodes

    @property
    def pod_memory_gib(self) -> int:
        """The training container's memory request = limit (no overcommit)."""
        return max(1, int(self.profile.memory_gib * ALLOCATABLE_FRACTION))

    @property
    def shm_gib(self) -> int:
        return max(1, self.profile.memory_gib // SHM_FRACTION)

    @property
    def memory_tier_gib(self) -> int:
        """sizeLimit of the memory checkpoint tier's emptyDir."""
        return self.storage.memory_tier_gib or max(1, self.profile.memory_gib // MEMORY_TIER_FRACTION)

    @property
    def peer_replicas(self) -> int:
        """Copies of each node's snapshots on other nodes (storage.peer_replicas; default 1 with more than
        one node and memory snapshots): the ranks' checkpoint.peer_replicas."""
        return self.trainer.checkpoint.peer_replicas

    @property
    def memory_budget(self) -> MemoryBudget | None:
        """What the memory tier holds per node; None without the values' hint of the state per rank."""
        return memory_budget(self.trainer, self.entrypoint, self.profile)

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.profile.workers_per_node
