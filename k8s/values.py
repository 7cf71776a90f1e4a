"""Typed job values: the one template a platform team parameterizes (YAML file + `key=value` overrides).

Loaded with `k8s.load.load_values(path, overrides)`; every bad value ends as one
message naming the field and the fix. Cross-field rules (restart budgets that agree across layers,
timeouts in order, an NVRx release the kit does not support) are checked here, before anything is
rendered.

`image: local` means "no container image: the local executor runs the command with this machine's
virtualenv", whose NVRx is the image's pin (`make setup`); `nvrx_version` names another one (a custom
image), refused below the pin's minor release (k8s/nvrx_versions.py).
"""

from __future__ import annotations

import posixpath
import re
from functools import cached_property
from pathlib import PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nvrx_eks.k8s import names
from nvrx_eks.k8s.durable_cost import PlanHints  # noqa: TC001 - used at runtime by pydantic
from nvrx_eks.k8s.nvrx_versions import LOCAL_IMAGE, resolve_nvrx_version
from nvrx_eks.kitcore import naming
from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.kitcore.profiles import InstanceProfile, get_profile
from nvrx_eks.training.checkpoint.config import CheckpointConfig
from nvrx_eks.training.resilience.config import REFERENCE_TRAINER, Mode

_SECRET_NAME = re.compile(r"(SECRET|PASSWORD|TOKEN|CREDENTIAL|PRIVATE_KEY|ACCESS_KEY)", re.IGNORECASE)
# Kubernetes rules beyond the names (kitcore/naming.py has those): an environment variable name and a
# Secret's key (k8s.io/apimachinery/pkg/util/validation).
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
# OCI image reference, the grammar of github.com/distribution/reference (reference.go):
#   reference := name [ ":" tag ] [ "@" digest ];  name := [domain "/"] path-component ["/" path-component]*
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:.]+\])(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_REFERENCE = re.compile(
    rf"^(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
    r"(?::[\w][\w.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)
_MAX_IMAGE_NAME = 255  # the name part (reference.go NameTotalLengthMax)
# An AWS Region code: partition prefix, optional qualifier, direction, number (us-east-1, eu-central-2,
# us-gov-west-1, cn-northwest-1, us-isob-east-1).
# https://docs.aws.amazon.com/global-infrastructure/latest/regions/aws-regions.html
_AWS_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d{1,2}$")
REGION_ENV = ("AWS_REGION", "AWS_DEFAULT_REGION")
"""Where the AWS SDKs look for the region (boto3 reads AWS_DEFAULT_REGION, the other SDKs and the CLI
AWS_REGION): the chart sets both from `aws_region`."""


def _raise(problem: str | None) -> None:
    if problem:
        raise ValueError(problem)


def check_dns_subdomain(value: str) -> str:
    _raise(naming.dns_subdomain_problem(value))
    return value


def check_label_value(value: str) -> str:
    _raise(naming.label_value_problem(value))
    return value


def check_label_key(key: str) -> str:
    _raise(naming.qualified_name_problem(key))
    return key


def check_image_reference(value: str) -> str:
    name = value.partition("@")[0]
    head, _, last = name.rpartition("/")
    name = f"{head}/{last.partition(':')[0]}" if head else last.partition(":")[0]
    if not _IMAGE_REFERENCE.match(value) or len(name) > _MAX_IMAGE_NAME:
        raise ValueError(
            f"{value!r} is not an image reference: [REGISTRY/]REPOSITORY[:TAG][@sha256:DIGEST] with a "
            "lowercase repository, e.g. 123456789012.dkr.ecr.us-east-1.amazonaws.com/nvrx-eks-training:v1 "
            "(`nvrx-eks values --stack NAME -o VALUES` sets it from the stack)"
        )
    return value


_DIGEST_SUFFIX = re.compile(r"@sha256:[0-9a-f]{64}$")


def check_image_digest(value: str) -> str:
    """A container image by digest: a tag can be moved to other contents after the job was rendered,
    so every node (and every replacement pod) would not be certain to run the same trainer."""
    if not _DIGEST_SUFFIX.search(value):
        raise ValueError(
            f"{value!r} has no digest: pin the image as REPOSITORY:TAG@sha256:DIGEST, the reference "
            "`nvrx-eks image push` prints (for an image already pushed: `aws ecr describe-images "
            "--repository-name NAME --image-ids imageTag=TAG --query 'imageDetails[0].imageDigest'`)"
        )
    return value


def check_aws_region(value: str) -> str:
    if not _AWS_REGION.match(value):
        raise ValueError(
            f"{value!r} is not an AWS Region code (e.g. us-east-1); use the Region the cluster stack is in "
            "(its output Region; `nvrx-eks values --stack NAME -o VALUES` sets it)"
        )
    return value


def check_s3_bucket(value: str) -> str:
    problem = naming.s3_bucket_problem(value)
    if problem:
        raise ValueError(f"{problem} (the stack output CheckpointBucketName is one)")
    return value


# The NVMe RAID0 array holds the kubelet's and containerd's state and the pod logs (k8s/names.py), so
# only a folder of our own below it may be mounted into pods.
NVME_RAID_ROOT = names.NVME_RAID_ROOT
_NODE_STATE_PATHS = tuple(
    PurePosixPath(p)
    for p in (
        NVME_RAID_ROOT,
        f"{NVME_RAID_ROOT}/kubelet",
        f"{NVME_RAID_ROOT}/containerd",
        f"{NVME_RAID_ROOT}/pods",
        "/var/lib/kubelet",
        "/var/lib/containerd",
        "/var/log",
        "/etc",
        "/run",
        "/proc",
        "/sys",
        "/dev",
    )
)
# Shared memory for NCCL and data loaders: an eighth of host memory; the memory checkpoint tier: a
# quarter. Both are memory-backed emptyDirs and count against the pod's memory limit.
SHM_FRACTION = 8
MEMORY_TIER_FRACTION = 4
# Requests leave room for the node's daemons (kubelet, device plugins, DCGM, node monitoring agent).
ALLOCATABLE_FRACTION = 0.9
# Job name + "-<index>" is the pod hostname (63 chars); "-rdzv" and "-nodes" are suffixed to Services.
_MAX_NAME = 40


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Budgets(_Section):
    """Restart budgets per layer. They must nest: in-process < launcher < Job, so each layer gives up
    only after the one below it did."""

    inprocess_max_iterations: int = Field(3, ge=1)
    """In-process restarts of the wrapped training function per process (modes inprocess/both). NVRx
    counts every in-process restart of the process's life, not a window: size it for all soft faults a
    process may see before a launcher restart gives it a fresh count."""
    launcher_max_restarts: int = Field(6, ge=0)
    """Worker-group restart rounds of the job (`--max-restarts`). ft_launcher counts them by rendezvous
    round, job-wide: every restart of any node's workers (a SIGKILL, a deadlock, a node loss) is one
    round for all, and a replacement pod's launcher starts with what is left. Once spent, every launcher
    leaves and closes the rendezvous; the Job's budget replaces the pods, which start a fresh one."""
    job_backoff_limit_per_index: int = Field(8, ge=0)
    """Failed pods tolerated per Job index (a node loss is a DisruptionTarget and costs none)."""
    expected_node_losses: int = Field(2, ge=0)
    """Node losses the job should survive over its life; launcher_max_restarts must cover them."""


class Timeouts(_Section):
    """Seconds. Launcher heartbeat <= initial heartbeat; pod reschedule < rendezvous join.

    In-process timeouts are the trainer's (`trainer.inprocess.*`, checked by its parser)."""

    launcher_heartbeat_s: float = Field(60.0, gt=0)
    """ft_launcher rank heartbeat timeout: a rank silent this long is killed (deadlock below Python)."""
    launcher_initial_heartbeat_s: float = Field(300.0, gt=0)
    """The same before a rank's first heartbeat (imports, model build, checkpoint load)."""
    pod_reschedule_s: float = Field(600.0, gt=0)
    """How long a replacement pod may take to be scheduled and started (new node included)."""
    # The three rendezvous timeouts reach NVRx as `--rdzv-conf` integers (`get_as_int`), and it refuses
    # a zero last call only once the agent starts ("must be positive"): every pod then failed in turn
    # until the Job's budget was gone. Whole seconds, at least 1, are checked here instead.
    rdzv_join_s: int = Field(900, ge=1)
    """Rendezvous join timeout: survivors wait this long for a replacement node."""
    rdzv_last_call_s: int = Field(15, ge=1)
    """With hot spares (`spares` >= 1): how long a restart round waits for a missing previous active node
    once enough nodes are present, before a spare takes its place. Longer than an agent's rejoin after a
    worker restart (a SIGKILL, a deadlock), so such a round never takes a spare: with spares it must be at
    least `workers_stop_s`, the time a node may take to stop its workers before it rejoins. A previous
    active node whose launcher stopped beating (lost with its node) is not waited for at all
    (training/resilience/nvrx_compat.py `wait_only_for_live_previous_actives`); unused without spares."""
    rdzv_close_s: int = Field(60, ge=1)
    workers_stop_s: float = Field(15.0, gt=0)
    term_s: float = Field(30.0, gt=0)
    monitor_interval_s: float = Field(0.5, gt=0)
    heartbeat_check_s: float = Field(1.0, gt=0)
    """How often ft_launcher's rank monitors compare each rank's last heartbeat with its timeout
    (`--ft-workload-check-interval`): a deadlock is detected within heartbeat timeout + this. NVRx's
    default, 5 s, added up to 5 s to every deadlock's detection; a check is one clock comparison."""


class Storage(_Section):
    """Checkpoint locations per tier."""

    memory_mount_path: str = "/checkpoint-memory"
    """Where the pod's memory-backed emptyDir (tier 1, host RAM) is mounted; the trainer's
    checkpoint.memory_dir. It lives and dies with the pod: launcher restarts inside the pod restore
    from it, a replacement pod (node loss) starts with an empty one."""
    memory_tier_gib: int | None = Field(None, ge=1)
    """sizeLimit of that emptyDir (counts against the pod's memory limit); default: a quarter of the
    instance profile's memory. Size it above ranks per node x staging slots (derived from the tiers,
    training/checkpoint/config.py `slots_needed`) x state bytes per rank; `job render` checks it."""

    fsx_pvc: str = names.CHECKPOINT_PVC
    """PVC of the FSx for Lustre file system: run folder (events, metrics) and durable tier."""
    fsx_mount_path: str = "/fsx"
    fsx_export_dir: str = "durable"
    """Folder of the FSx file system linked to S3 (the cluster config's `fsx.file_system_path`): the
    durable tier writes below it, so FSx exports each committed checkpoint to
    s3://<s3_bucket>/<s3_prefix><name> on its own."""
    local_nvme_path: str | None = f"{NVME_RAID_ROOT}/nvrx-checkpoints"
    """Host folder of the local tier on the node's NVMe RAID0 (created if missing); None: no local
    tier. A dedicated folder below the array, never the array's root: with AL2023 `localStorage:
    RAID0` the root also holds the kubelet's and containerd's state and the pod logs, and a pod that
    mounts it read-write can read other pods' tokens and rewrite other containers' files."""
    local_mount_path: str = "/local"
    s3_bucket: str | None = None
    s3_prefix: str = "checkpoints/"
    peer_replicas: int | None = Field(None, ge=0)
    """Copies of each node's memory snapshots kept in the RAM of other nodes (the trainer's
    checkpoint.peer_replicas): a lost node's shards come back from its partners' memory. Default: 1
    when the job has more than one node and memory snapshots (the tiered checkpointer). Costs R x the
    node's snapshot in each node's memory tier."""

    @field_validator("local_nvme_path")
    @classmethod
    def _not_node_state(cls, value: str | None) -> str | None:
        if value is None or not value.startswith("/"):
            return value  # None, or a relative path the absolute-path check reports
        path = PurePosixPath(posixpath.normpath(value))
        for guarded in _NODE_STATE_PATHS:
            # The array's root and its ancestors are refused; below the root, only its state folders.
            below = guarded != PurePosixPath(NVME_RAID_ROOT) and path.is_relative_to(guarded)
            if guarded.is_relative_to(path) or below:
                raise ValueError(
                    f"{value!r} would mount {guarded} (the node's own state) into the pod; use a dedicated "
                    f"folder below the NVMe array, e.g. {NVME_RAID_ROOT}/nvrx-checkpoints"
                )
        if path.parent == PurePosixPath("/") or path == PurePosixPath(NVME_RAID_ROOT).parent:
            raise ValueError(f"{value!r} is a top-level host folder; use {NVME_RAID_ROOT}/nvrx-checkpoints")
        return str(path)

    @field_validator("s3_bucket")
    @classmethod
    def _bucket(cls, value: str | None) -> str | None:
        return check_s3_bucket(value) if value is not None else None

    @field_validator("fsx_pvc")
    @classmethod
    def _pvc(cls, value: str) -> str:
        return check_dns_subdomain(value)

    @field_validator("fsx_mount_path", "local_mount_path", "local_nvme_path", "memory_mount_path")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"{value!r} must be an absolute path (start with /)")
        return value


# Trainer fields the chart derives from the values above; setting them under `trainer` is an error.
CHART_OWNED_TRAINER_FIELDS = (
    "mode",
    "run_dir",
    "checkpoint.memory_dir",
    "checkpoint.local_dir",
    "checkpoint.durable_dir",
    "checkpoint.s3_uri",
    "checkpoint.peer_replicas",
    "inprocess.max_iterations",
)


class SecretRef(_Section):
    secret: str
    key: str

    @field_validator("secret")
    @classmethod
    def _secret_name(cls, value: str) -> str:
        return check_dns_subdomain(value)

    @field_validator("key")
    @classmethod
    def _secret_key(cls, value: str) -> str:
        if len(value) > naming.DNS_SUBDOMAIN_MAX or not _SECRET_KEY.match(value):
            raise ValueError(f"{value!r} is not a Secret key: letters, digits, '-', '_' and '.'")
        return value


_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class Entrypoint(_Section):
    """Your own training script, run by the launcher in every rank in place of the reference trainer.

    It uses the kit through training/api.py (`Job().run(train)`); the values' `trainer:` section then
    holds only the kit's resilience fields (training/resilience/config.py `ResilienceConfig`), which the
    chart hands to it as `NVRX_EKS_CONFIG`. docs/your-script.md walks through it."""

    module: str | None = None
    """A module on the image's Python path, run as `python -m MODULE ARGS` (e.g. mytrain.main)."""
    script: str | None = None
    """Or a script, run as `python SCRIPT ARGS`: its path in the image (relative: to the working folder
    or the Python path)."""
    args: list[str] = Field(default_factory=list)
    """The script's own arguments."""
    preload: list[str] = Field(default_factory=list)
    """Modules the script imports before its first step (e.g. transformers): each pod imports them once,
    into the warm process every restarted rank is forked from, instead of every rank at every restart."""

    @field_validator("args", mode="before")
    @classmethod
    def _args_as_text(cls, value: Any) -> Any:  # noqa: ANN401
        # `--steps: 80` style numbers in YAML lists are the arguments' text.
        if isinstance(value, list):
            return [str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v for v in value]
        return value

    @field_validator("module")
    @classmethod
    def _module_name(cls, value: str | None) -> str | None:
        if value is not None and not _MODULE_NAME.match(value):
            raise ValueError(f"{value!r} is not a module name: dotted identifiers, e.g. mytrain.main")
        if value == REFERENCE_TRAINER:
            raise ValueError(f"{REFERENCE_TRAINER} is the reference trainer: remove entrypoint to run it")
        return value

    @field_validator("preload")
    @classmethod
    def _preload_names(cls, value: list[str]) -> list[str]:
        bad = [name for name in value if not _MODULE_NAME.match(name)]
        if bad:
            raise ValueError(f"{', '.join(map(repr, bad))}: not module names (dotted identifiers)")
        return value

    @model_validator(mode="after")
    def _one_of(self) -> Entrypoint:
        if (self.module is None) == (self.script is None):
            raise ValueError("give exactly one of module (python -m MODULE) or script (python SCRIPT)")
        return self

    def command(self) -> list[str]:
        """What follows the launcher's own flags: `-m MODULE ARGS` or `SCRIPT ARGS`."""
        head = ["-m", self.module] if self.module is not None else [str(self.script)]
        return [*head, *self.args]


class JobValues(_Section):
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
    entrypoint: Entrypoint | None = None
    """Your own training script instead of the reference trainer (`python -m nvrx_eks.training`)."""
    trainer: dict[str, Any] = Field(default_factory=lambda: {"model": "tiny", "steps": 200})
    """The reference trainer's fields as a tree (`python -m nvrx_eks.training --help`): model, steps, seed,
    checkpoint cadences, fault schedule, in-process timeouts... checked by the trainer's own parser at
    render time. With an `entrypoint`, only the kit's resilience fields (checkpoint, inprocess, ft,
    dist, faults, metrics, seed; default: none set), checked the same way."""

    @model_validator(mode="before")
    @classmethod
    def _no_reference_defaults_for_a_script(cls, data: Any) -> Any:  # noqa: ANN401
        if isinstance(data, dict) and data.get("entrypoint") is not None and "trainer" not in data:
            return {**data, "trainer": {}}
        return data

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
        _raise(naming.dns_label_problem(value, max_length=_MAX_NAME))
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
            if not _ENV_NAME.match(key):
                raise ValueError(
                    f"{key!r} is not an environment variable name: letters, digits, '_', '-' and '.', "
                    "not starting with a digit"
                )
        return value

    @field_validator("instance_profile")
    @classmethod
    def _known_profile(cls, value: str) -> str:
        try:
            get_profile(value)
        except UserError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("trainer")
    @classmethod
    def _trainer_fields_not_chart_owned(cls, value: dict[str, Any]) -> dict[str, Any]:
        for dotted in CHART_OWNED_TRAINER_FIELDS:
            node: Any = value
            for part in dotted.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            if node is not None:
                raise ValueError(
                    f"{dotted} is set by the chart (from mode, storage and budgets); remove it from trainer"
                )
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
        uses_inprocess = self.mode in {"inprocess", "both"}
        if uses_inprocess and b.inprocess_max_iterations >= b.launcher_max_restarts:
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
        replicas = self.storage.peer_replicas
        if replicas is not None and replicas >= self.num_nodes and replicas:
            raise ValueError(
                f"storage.peer_replicas ({replicas}) must be below num_nodes ({self.num_nodes}): each copy "
                f"lives on another node; use at most {self.num_nodes - 1}"
            )
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
        try:
            _ = self.resolved_nvrx_version
        except UserError as exc:
            raise ValueError(str(exc)) from None
        return self

    def _check_devices(self) -> None:
        """Devices the instance profile cannot give the pod (the scheduler would never place it, or
        the ranks would fail on the node)."""
        p = self.profile
        dist = self.trainer.get("dist")
        device = dist.get("device") if isinstance(dist, dict) else None
        if device == "cuda" and not p.gpus:
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
        """Copies of each node's snapshots on other nodes (storage.peer_replicas, default 1 if > 1 node)."""
        if self.storage.peer_replicas is not None:
            return self.storage.peer_replicas
        # The replica copies memory snapshots: none with the synchronous checkpointer or no RAM tier.
        checkpoint = self.trainer.get("checkpoint") or {}
        defaults = CheckpointConfig.model_fields
        tiered = checkpoint.get("implementation", defaults["implementation"].default) == "tiered"
        snapshots = tiered and checkpoint.get("memory_every", defaults["memory_every"].default) != 0
        return 1 if self.num_nodes > 1 and snapshots else 0

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.profile.workers_per_node
