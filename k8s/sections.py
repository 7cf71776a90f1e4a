"""The job values' sections (budgets, timeouts, storage, an entrypoint) and the checks of single values
that Kubernetes and AWS would otherwise make at deploy time: names, labels, image references, Regions,
buckets, host paths.

k8s/values.py assembles them into `JobValues`; k8s/rank_config.py turns the values' `trainer` section
into what each rank is given.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nvrx_eks.k8s import names
from nvrx_eks.kitcore import naming

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


def check_env_name(key: str) -> str:
    if not _ENV_NAME.match(key):
        raise ValueError(
            f"{key!r} is not an environment variable name: letters, digits, '_', '-' and '.', "
            "not starting with a digit"
        )
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


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Budgets(Section):
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


class Timeouts(Section):
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


class Shrink(Section):
    """Train on with fewer nodes when a lost node's replacement cannot be scheduled, instead of waiting
    for it, and grow back when it comes. Off unless `min_nodes` is set.

    On fixed p5 capacity (a Capacity Block, an ODCR) a lost node's replacement pod can stay Pending for
    the hours AWS takes to replace the hardware; without this every other node waits with it. With it,
    once the replacement has not joined the restart round for `pending_limit_s`, the round closes with
    the nodes present (at the largest size the parallel layout runs at, at least `min_nodes`), the
    ranks restore the newest durable step resharded to the smaller world, and training goes on; when
    the replacement (or a spare) starts, the job restarts at its full size. Each shrink and each grow is
    one launcher restart round."""

    min_nodes: int | None = Field(None, ge=1)
    """The fewest nodes the job trains on; unset: the job never shrinks (it waits for replacements)."""
    pending_limit_s: float = Field(600.0, gt=0)
    """How long a restart round waits for a lost node's replacement before the job shrinks: above the
    time a replacement takes when capacity exists (an image pull, a node's start), below
    `timeouts.rdzv_join_s`."""
    grow_wait_s: float = Field(1800.0, gt=0)
    """Once the replacement has started, how long the shrunk job keeps training for its next durable
    checkpoint before it grows back: the grown job restores that step, so growing loses only the steps
    since it (a few). Above `trainer.checkpoint.durable_every` steps' time; past it the job grows at
    once and retrains the steps since the newest durable step."""


class Storage(Section):
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


class SecretRef(Section):
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

REFERENCE_TRAINER_MODULE = "nvrx_eks.training"
"""The entry point of values that name none: the reference trainer (`python -m nvrx_eks.training`,
training/__main__.py), a client of the kit like any other script."""


class Entrypoint(Section):
    """The training script the launcher runs in every rank: the reference trainer unless the values name
    another module or script.

    Every script uses the kit through training/api.py (`Job().run(train)`): the values' `trainer:`
    section holds the kit's fields (training/resilience/config.py `ResilienceConfig`), which the chart
    hands to every rank as `NVRX_EKS_CONFIG`; the script's own settings are its `args`.
    docs/your-script.md walks through it."""

    module: str | None = None
    """A module on the image's Python path, run as `python -m MODULE ARGS` (e.g. mytrain.main); the
    reference trainer's when neither module nor script is given."""
    script: str | None = None
    """Or a script, run as `python SCRIPT ARGS`: its path in the image (relative: to the working folder
    or the Python path)."""
    args: list[str] = Field(default_factory=list)
    """The script's own arguments (the reference trainer's: `python -m nvrx_eks.training --help`, e.g.
    [--model, 8b, --steps, "20000"])."""
    preload: list[str] = Field(default_factory=list)
    """Modules the script imports before its first step (e.g. transformers): each pod imports them once,
    into the warm process every restarted rank is forked from, instead of every rank at every restart."""
    preload_imports: bool = True
    """Also make the module's or script's own top-level `import` statements there, once per pod (no
    other code of it runs there: training/resilience/warm_entry.py). Turn off for a script whose imports
    must not run before the rank starts (one that initialises CUDA at import)."""

    state_gib_per_rank: float | None = Field(None, gt=0)
    """The checkpointed state one rank holds, GiB: its shard of the parameters, the optimizer state and
    whatever else it saves (what its ranks report as `state_bytes`). `job render` checks from it that the
    memory tier holds the node's snapshots and its partners' copies; without it that check is left to
    the ranks."""

    @model_validator(mode="before")
    @classmethod
    def _reference_trainer_by_default(cls, data: Any) -> Any:  # noqa: ANN401
        if isinstance(data, dict) and data.get("module") is None and data.get("script") is None:
            return {**data, "module": REFERENCE_TRAINER_MODULE}
        return data

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
        if self.module is not None and self.script is not None:
            raise ValueError("give one of module (python -m MODULE) or script (python SCRIPT), not both")
        return self

    def command(self) -> list[str]:
        """What follows the launcher's own flags: `-m MODULE ARGS` or `SCRIPT ARGS`."""
        head = ["-m", self.module] if self.module is not None else [str(self.script)]
        return [*head, *self.args]
