"""The cluster configuration: one typed, validated model loaded at the app entry (infra/app.py).

Stacks and constructs never read this file, the CDK context or the environment: the app validates a
`ClusterConfig` and hands typed values down. Every check here produces one message naming the field
and the fix (kitcore/configio.py turns them into exit code 2 without a traceback).
"""

from __future__ import annotations

import functools
import ipaddress
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nvrx_eks.infra import cluster_pins
from nvrx_eks.infra import service_rules as rules
from nvrx_eks.k8s import names
from nvrx_eks.kitcore import naming
from nvrx_eks.kitcore.profiles import InstanceProfile, get_profile, profile_for_field

# FSx for Lustre PERSISTENT_2 (SSD): 1.2 TiB, 2.4 TiB, then steps of 2.4 TiB; throughput tiers in
# MB/s per TiB. https://docs.aws.amazon.com/fsx/latest/LustreGuide/managing-storage-capacity.html
# https://docs.aws.amazon.com/fsx/latest/LustreGuide/performance.html#fsx-aggregate-perf
FSX_MIN_CAPACITY_GIB = 1200
FSX_CAPACITY_STEP_GIB = 2400
FSX_THROUGHPUT_TIERS = (125, 250, 500, 1000)

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,62}$")
_NODEGROUP_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,38}$")
_RESERVATION_ID = re.compile(r"^cr-[0-9a-f]{8,17}$")
_ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]+$")
_PRINCIPAL_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:(role|user)/[\w+=,.@/-]+$")
_SECURITY_GROUP_ID = re.compile(r"^sg-[0-9a-f]{8}([0-9a-f]{9})?$")
# Subnets per AZ that infra/constructs/network.py creates (it reads these): NAT-only public
# subnets and /19 private ones, because the VPC CNI gives every pod a VPC address.
PUBLIC_SUBNET_MASK = 24
PRIVATE_SUBNET_MASK = 19
# Labels and the taint key the kit sets on every GPU node (k8s/names.py); a config may not redefine
# them (EKS would keep one of two values silently, or refuse the group).
RESERVED_LABEL_PREFIX = "nvrx-eks/"
# The managed node group infra/constructs/cluster.py creates for add-ons (tests/infra check the
# synthesized template names it so). EKS node group names are unique per cluster: a GPU group of
# the same name fails CreateNodegroup with ResourceInUseException halfway through the deploy.
SYSTEM_NODEGROUP_NAME = names.SYSTEM_NODEGROUP
# "The allowed block size is between a /16 netmask (65,536 IP addresses) and /28 netmask (16 IP
# addresses)." https://docs.aws.amazon.com/vpc/latest/userguide/vpc-cidr-blocks.html
VPC_PREFIX_RANGE = (16, 28)


@functools.cache
def ec2_instance_types() -> frozenset[str]:
    """Every instance type the EC2 API accepts, from the API model botocore ships (its InstanceType
    enum): offline, and as current as the installed boto3."""
    import botocore.session  # noqa: PLC0415 - half a second; only when a config names a type

    model = botocore.session.get_session().get_service_model("ec2")
    return frozenset(model.shape_for("InstanceType").enum)


def instance_type_known(value: str) -> str | None:
    """None when EC2 knows the type, else the message with the nearest names."""
    import difflib  # noqa: PLC0415

    import botocore  # noqa: PLC0415

    known = ec2_instance_types()
    if value in known:
        return None
    near = difflib.get_close_matches(value, sorted(known), n=3)
    hint = f"did you mean {' or '.join(near)}? " if near else ""
    return (
        f"{value!r} is not an EC2 instance type ({hint}checked against the {len(known)} types of "
        f"botocore {botocore.__version__}; a type newer than that needs a newer boto3)"
    )


def _problem(message: str | None) -> None:
    if message is not None:
        raise ValueError(message)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CapacityConfig(_Model):
    """Where GPU instances come from."""

    type: Literal["on_demand", "capacity_reservation", "capacity_block"] = "on_demand"
    """on_demand; capacity_reservation (an On-Demand Capacity Reservation, ODCR); capacity_block
    (EC2 Capacity Block for ML)."""
    reservation_id: str | None = None
    """cr-... id of the reservation or Capacity Block (required unless on_demand)."""

    @model_validator(mode="after")
    def _reservation(self) -> CapacityConfig:
        if self.type == "on_demand":
            if self.reservation_id is not None:
                raise ValueError(
                    "reservation_id is only used with type capacity_reservation or capacity_block"
                )
        elif self.reservation_id is None or not _RESERVATION_ID.match(self.reservation_id):
            raise ValueError(
                f"type {self.type} needs reservation_id: the cr-... id of the reservation "
                f"(got {self.reservation_id!r})"
            )
        return self


class TaintConfig(_Model):
    key: str
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"

    @field_validator("key")
    @classmethod
    def _key(cls, value: str) -> str:
        _problem(naming.qualified_name_problem(value, kind="taint key"))
        if value == names.GPU_TAINT_KEY:
            taint = f"{value}={names.GPU_TAINT_VALUE}:{names.GPU_TAINT_EFFECT}"
            raise ValueError(f"every GPU node already has the taint {taint}; remove it here")
        return value

    @field_validator("value")
    @classmethod
    def _value(cls, value: str) -> str:
        _problem(naming.label_value_problem(value))
        return value


def scale_command(nodegroup: str, nodes: int, *, cluster: str = "CLUSTER", region: str = "REGION") -> str:
    """The AWS CLI call that sets a GPU node group's size (there is no autoscaler in the kit)."""
    return (
        f"aws eks update-nodegroup-config --region {region} --cluster-name {cluster} "
        f"--nodegroup-name {nodegroup} --scaling-config minSize=0,maxSize={nodes},desiredSize={nodes}"
    )


class GpuNodeGroupConfig(_Model):
    """One managed node group of GPU instances (all in the GPU availability zone)."""

    name: str
    """Node group name, unique in the cluster (lowercase letters, digits, '-')."""
    instance_type: str
    """A GPU instance type from kitcore/profiles.py."""
    min_size: int = Field(0, ge=0)
    desired_size: int = Field(0, ge=0)
    max_size: int = Field(1, ge=1, le=1000)
    capacity: CapacityConfig = CapacityConfig()
    placement_group: bool = False
    """A cluster placement group for this group. Refused together with a reservation or Capacity
    Block: their capacity is allocated before launch and a launch into a placement group the
    reservation was not created in fails with InsufficientInstanceCapacity; Capacity Blocks are
    already co-located in one EC2 UltraCluster."""
    labels: dict[str, str] = {}
    taints: list[TaintConfig] = []
    """Extra taints; every GPU node also gets nvidia.com/gpu=true:NoSchedule."""
    root_volume_gib: int = Field(200, ge=50, le=16384)
    """Encrypted gp3 root volume (container images of GPU stacks are tens of GB)."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NODEGROUP_NAME.match(value):
            raise ValueError(f"{value!r} is not a node group name; use lowercase letters, digits and '-'")
        if value == SYSTEM_NODEGROUP_NAME:
            raise ValueError(
                f"{value!r} is the name of the kit's own node group for add-ons (EKS refuses a second "
                "node group of that name); use another, e.g. gpu-system"
            )
        return value

    @field_validator("instance_type")
    @classmethod
    def _instance_type(cls, value: str) -> str:
        profile = profile_for_field(value, ec2_only=True)
        if profile.gpus == 0:
            raise ValueError(f"{value} has no GPU; use a GPU type from kitcore/profiles.py")
        return value

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key, label in value.items():
            _problem(naming.qualified_name_problem(key))
            _problem(naming.label_value_problem(label))
            if key.startswith(RESERVED_LABEL_PREFIX) and key != f"{RESERVED_LABEL_PREFIX}pool":
                raise ValueError(
                    f"label {key} is set by the kit on every GPU node; use another key (e.g. nvrx-eks/pool)"
                )
        return value

    @model_validator(mode="after")
    def _sizes_and_placement(self) -> GpuNodeGroupConfig:
        if not self.min_size <= self.desired_size <= self.max_size:
            raise ValueError(
                f"sizes must satisfy min_size <= desired_size <= max_size "
                f"(got {self.min_size} / {self.desired_size} / {self.max_size})"
            )
        if self.capacity.type == "capacity_block" and (self.desired_size or self.min_size):
            # A Capacity Block launches nothing before its start time: a group created at N > 0 waits
            # for instances that cannot exist yet, the create fails and the stack rolls back. AWS's
            # guide creates the group at 0 and scales it once the block is active.
            # https://docs.aws.amazon.com/eks/latest/userguide/capacity-blocks-mng.html
            raise ValueError(
                f"a capacity_block group is created with min_size 0 and desired_size 0 (got "
                f"{self.min_size} / {self.desired_size}); when the block is active, scale it: "
                f"{scale_command(self.name, self.max_size)}"
            )
        if self.placement_group and self.capacity.type != "on_demand":
            raise ValueError(
                f"placement_group: true cannot be combined with capacity type {self.capacity.type}; "
                "set placement_group: false (the reservation already fixes where instances land; "
                "Capacity Blocks are co-located in an EC2 UltraCluster)"
            )
        return self

    @property
    def profile(self) -> InstanceProfile:
        return get_profile(self.instance_type, ec2_only=True)


class SystemNodeGroupConfig(_Model):
    """A small on-demand node group for add-ons (coredns, controllers, Kueue) and the jobs' stores."""

    instance_type: str = "m7i.xlarge"
    min_size: int = Field(2, ge=1)
    desired_size: int = Field(2, ge=1)
    max_size: int = Field(4, ge=1)
    root_volume_gib: int = Field(150, ge=100, le=16384)
    """Encrypted gp3 root volume: the add-ons' images (the CSI driver, the monitoring agents, Kueue) and
    each job's rendezvous store image (images/store.Dockerfile: Python, torch's CPU build and NVRx,
    not the ~20 GB training image), every revision a node pulled kept by containerd until the kubelet
    collects it. The kubelet evicts pods below 10-15% free disk; the margin also covers the node
    image's own growth across AMI updates."""

    @field_validator("instance_type")
    @classmethod
    def _instance_type(cls, value: str) -> str:
        _problem(rules.instance_type_problem(value, x86_only=True))
        _problem(instance_type_known(value))
        return value

    @model_validator(mode="after")
    def _sizes(self) -> SystemNodeGroupConfig:
        if not self.min_size <= self.desired_size <= self.max_size:
            raise ValueError(
                f"sizes must satisfy min_size <= desired_size <= max_size "
                f"(got {self.min_size} / {self.desired_size} / {self.max_size})"
            )
        return self


class FsxConfig(_Model):
    """FSx for Lustre PERSISTENT_2, linked to S3 by a data repository association."""

    storage_capacity_gib: int = FSX_MIN_CAPACITY_GIB
    throughput_per_tib: int = 250
    """MB/s per TiB of storage: 125, 250, 500 or 1000."""
    data_repository_path: str | None = None
    """s3://bucket/prefix/ to link; default: the checkpoint bucket's checkpoint prefix."""
    file_system_path: str = "/durable"
    """Where the linked S3 prefix appears inside the file system."""

    @field_validator("storage_capacity_gib")
    @classmethod
    def _capacity(cls, value: int) -> int:
        if value != FSX_MIN_CAPACITY_GIB and (value <= 0 or value % FSX_CAPACITY_STEP_GIB):
            raise ValueError(
                f"{value} GiB is not a valid PERSISTENT_2 size; use 1200 or a multiple of 2400 "
                "(2400, 4800, 7200, ...)"
            )
        return value

    @field_validator("throughput_per_tib")
    @classmethod
    def _throughput(cls, value: int) -> int:
        if value not in FSX_THROUGHPUT_TIERS:
            tiers = ", ".join(map(str, FSX_THROUGHPUT_TIERS))
            raise ValueError(
                f"{value} is not a PERSISTENT_2 throughput tier; use one of {tiers} (MB/s per TiB)"
            )
        return value

    @field_validator("data_repository_path")
    @classmethod
    def _s3_path(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if not value.startswith("s3://"):
            raise ValueError(f"{value!r} is not an S3 path; use s3://bucket/prefix/")
        _problem(naming.s3_bucket_problem(value.removeprefix("s3://").split("/", 1)[0]))
        return value

    @field_validator("file_system_path")
    @classmethod
    def _fs_path(cls, value: str) -> str:
        if not re.match(r"^/[A-Za-z0-9._/-]+$", value) or value == "/":
            raise ValueError(f"{value!r} must be an absolute directory below the root, e.g. /durable")
        return value


class CheckpointBucketConfig(_Model):
    prefix: str = "checkpoints/"
    """Key prefix for checkpoints; the training service account may touch nothing else."""
    noncurrent_version_days: int = Field(30, ge=1)
    """Days an overwritten or deleted checkpoint object version is kept."""
    expire_days: int | None = Field(None, ge=1)
    """Days after which current checkpoint objects expire (None: never)."""
    retain_on_delete: bool = True
    """Keep the bucket (and its checkpoints) when the stack is deleted."""

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not re.match(r"^[A-Za-z0-9!_.*'()-]+(/[A-Za-z0-9!_.*'()-]+)*/$", value):
            raise ValueError(
                f"{value!r} must be a key prefix like checkpoints/ (no leading '/', ends with '/')"
            )
        return value


class EcrConfig(_Model):
    repository_name: str | None = None
    """None (the default): CloudFormation names the repository after the stack (the job tooling reads
    its URI from the stack output ImageRepositoryUri). The repository outlives the stack (it holds
    the images), so a fixed name blocks the next create of a stack of that name until the old
    repository is deleted by hand."""
    keep_images: int | None = Field(None, ge=1)
    """None (the default): every tagged image is kept; untagged ones expire after a day. A count
    expires the oldest tags beyond it, including ones a running job or the deployed node check still
    pulls (a replacement node could then not start them): set one only with that in mind."""

    @field_validator("repository_name")
    @classmethod
    def _repository_name(cls, value: str | None) -> str | None:
        if value is not None:
            _problem(rules.ecr_repository_problem(value))
        return value


class ApiAccessConfig(_Model):
    """Who may call the cluster's private API endpoint (HTTPS, port 443), beside the nodes and the
    stack's kubectl handler: each entry becomes an ingress rule of the cluster security group. Being
    inside the VPC is not enough: EKS admits a bastion, a VPN or a connected network only through such
    a rule (https://docs.aws.amazon.com/eks/latest/userguide/cluster-endpoint.html). Empty (the
    default): only the nodes, which sit in that group; a workstation then reaches the API through an
    SSM port-forwarding session to a system node (docs/aws.md)."""

    cidrs: list[str] = []
    """IPv4 blocks that call the API: a VPN's client range, a connected VPC or office network, a
    bastion's address as a /32."""
    security_group_ids: list[str] = []
    """Security groups (sg-...) of hosts in the VPC that call the API: a bastion, a CI runner, an
    instance reached with SSM Session Manager."""

    @field_validator("cidrs")
    @classmethod
    def _cidrs(cls, value: list[str]) -> list[str]:
        for block in value:
            network = rules.parse_ipv4_block(block)
            if isinstance(network, str):
                raise ValueError(network)  # noqa: TRY004 - pydantic reports only ValueError
            if network.prefixlen == 0:
                raise ValueError(
                    f"{block} admits every network routed into the VPC; list the ranges that call the "
                    "API (your VPN's client range, a bastion's address as a /32)"
                )
        if len(set(value)) != len(value):
            raise ValueError(f"lists a block twice ({', '.join(value)})")
        return value

    @field_validator("security_group_ids")
    @classmethod
    def _groups(cls, value: list[str]) -> list[str]:
        for group in value:
            if not _SECURITY_GROUP_ID.match(group):
                raise ValueError(f"{group!r} is not a security group id (sg- and 8 or 17 hex digits)")
        if len(set(value)) != len(value):
            raise ValueError(f"lists a group twice ({', '.join(value)})")
        return value


class AddonsConfig(_Model):
    cloudwatch_observability: bool = False
    kueue: bool = False
    prometheus_pod_monitors: bool = False
    """PodMonitors for the trainer and the DCGM exporter (needs the Prometheus Operator's CRDs)."""


NODE_CHECK_DIGEST_FIX = (
    "after `nvrx-eks image push`, deploy with -c node_check.image_tag=TAG "
    "-c node_check.image_digest=sha256:... (the tag and digest of the first line it prints)"
)
"""What synth's warning and preflight's warning say of the node check pulled by tag."""


class NodeCheckConfig(_Model):
    """The node-check DaemonSet on every GPU node (k8s/node_verification.py, training/node/nodecheck.py)."""

    image_tag: str | None = None
    """Tag of the training image in the stack's ECR repository. None: the tag `nvrx-eks image push`
    gives the images built from this checkout (a hash of their inputs, infra/revision.py), so the check
    is deployed with the cluster and starts once that image is pushed (the kubelet retries the pull); no
    second deploy, and a later commit that leaves the images' inputs alone names the same image."""
    image_digest: str | None = None
    """sha256:... of `image_tag` as `nvrx-eks image push` printed it: the DaemonSet then pulls
    REPOSITORY:TAG@DIGEST. None: by tag, which the repository's immutable tags keep on one image (synth
    and preflight warn). Needs `image_tag`: a digest is of one tag, not of whatever checkout deploys."""
    interval_s: int = Field(600, ge=60)
    """Seconds between checks of a node (DCGM diagnostics level 1 takes about a minute)."""
    dcgm_host: str | None = None
    """nv-hostengine address for `dcgmi diag` (None: dcgmi's default)."""

    @field_validator("image_tag")
    @classmethod
    def _tag(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$", value):
            raise ValueError(f"{value!r} is not an image tag (letters, digits, '_', '.', '-'; <= 128)")
        return value

    @field_validator("image_digest")
    @classmethod
    def _digest(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"sha256:[0-9a-f]{64}", value):
            raise ValueError(
                f"{value!r} is not an image digest: sha256:<64 hex>, as `nvrx-eks image push` prints it"
            )
        return value

    @model_validator(mode="after")
    def _digest_of_a_tag(self) -> NodeCheckConfig:
        if self.image_digest is not None and self.image_tag is None:
            raise ValueError(
                "image_digest needs image_tag: set node_check.image_tag to the tag the digest was pushed as"
            )
        return self


class TrainingConfig(_Model):
    """Cluster-level objects the job tooling uses (k8s/cluster_chart.py renders them)."""

    namespace: str = names.TRAINING_NAMESPACE
    service_account: str = names.TRAINING_SERVICE_ACCOUNT
    """The job values' default service_account too: change both, or set it in the job values."""
    pvc_name: str = names.CHECKPOINT_PVC

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        _problem(naming.dns_label_problem(value))
        return value

    @field_validator("service_account", "pvc_name")
    @classmethod
    def _object_name(cls, value: str) -> str:
        _problem(naming.dns_subdomain_problem(value))
        return value


class ClusterConfig(_Model):
    """Everything `cdk deploy` stands up, in one validated tree."""

    name: str
    """Stack and cluster name."""
    account: str | None = None
    """12-digit AWS account; None: CDK_DEFAULT_ACCOUNT, else a placeholder (synth stays offline)."""
    region: str
    kubernetes_version: str = cluster_pins.DEFAULT_KUBERNETES_VERSION
    support_after_standard: Literal["upgrade", "extended"] = "upgrade"
    """What EKS does when the version's standard support ends (the cluster's upgrade policy).
    upgrade (default): EKS upgrades the control plane to the next version (nodes keep theirs until
    their group is updated); extended: the cluster stays on its version for up to 12 more months at
    EKS's extended-support price. Unset, EKS chooses extended, and its pricing starts unannounced."""
    availability_zones: list[str] = Field(min_length=2, max_length=6)
    """AZs of the VPC (EKS needs subnets in at least two)."""
    gpu_availability_zone: str | None = None
    """The AZ of the GPU capacity (of the reservation / Capacity Block when one is used)."""
    vpc_cidr: str = "10.0.0.0/16"
    service_cidr: str = "172.20.0.0/16"
    """Kubernetes Service addresses (RFC 1918, /12 to /24, outside vpc_cidr)."""
    nat: Literal["gpu_zone", "per_zone"] = "gpu_zone"
    """gpu_zone: one NAT gateway, in the GPU availability zone (GPU nodes' egress stays in their
    zone and does not fail with another zone); per_zone: one per zone (no cross-zone egress at all)."""
    endpoint_access: Literal["public", "private", "public_and_private"] = "private"
    """private (default): the API has no public endpoint; its private one admits the nodes, the
    kubectl handler and what api_access lists; public_and_private: also from public_access_cidrs."""
    api_access: ApiAccessConfig = ApiAccessConfig()
    """Networks and security groups that may call the private endpoint (port 443)."""
    public_access_cidrs: list[str] = []
    """Who may reach the public API endpoint (with public_and_private): your office/VPN ranges."""
    allow_public_api_from_anywhere: bool = False
    """Set true to accept 0.0.0.0/0 in public_access_cidrs (the API then faces the whole internet)."""
    admin_role_arn: str | None = None
    """IAM role given cluster-admin by an access entry; None: the stack creates one for the account."""
    admin_principal_arns: list[str] = []
    """Roles/users that may assume the created admin role (empty: any principal of the account whose
    own IAM policy allows sts:AssumeRole on it)."""
    system_nodes: SystemNodeGroupConfig = SystemNodeGroupConfig()
    gpu_node_groups: list[GpuNodeGroupConfig] = Field(min_length=1)
    fsx: FsxConfig = FsxConfig()
    checkpoint_bucket: CheckpointBucketConfig = CheckpointBucketConfig()
    node_check: NodeCheckConfig = NodeCheckConfig()
    ecr: EcrConfig = EcrConfig()
    addons: AddonsConfig = AddonsConfig()
    training: TrainingConfig = TrainingConfig()

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: object) -> object:
        if isinstance(data, dict) and "nat_gateways" in data:
            raise ValueError(
                "nat_gateways was replaced by nat: gpu_zone (one NAT gateway, in the GPU zone) or "
                "nat: per_zone (one per zone)"
            )
        return data

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"{value!r} is not a stack/cluster name; use letters, digits and '-' (max 63)")
        return value

    @field_validator("account")
    @classmethod
    def _account(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^\d{12}$", value):
            raise ValueError(f"{value!r} is not a 12-digit AWS account id")
        return value

    @field_validator("region")
    @classmethod
    def _region(cls, value: str) -> str:
        if not re.match(r"^[a-z]{2}(-[a-z]+)+-\d$", value):
            raise ValueError(f"{value!r} is not an AWS region name such as us-east-1")
        return value

    @field_validator("kubernetes_version", mode="before")
    @classmethod
    def _kubernetes_version(cls, value: object) -> str:
        if isinstance(value, float):
            # ValueError, not TypeError: pydantic turns only ValueError into a field message.
            raise ValueError(  # noqa: TRY004
                f'write the version as a quoted string such as "{cluster_pins.DEFAULT_KUBERNETES_VERSION}" '
                f"(YAML read it as the number {value})"
            )
        text = str(value)
        if text not in cluster_pins.SUPPORTED_KUBERNETES_VERSIONS:
            supported = ", ".join(cluster_pins.SUPPORTED_KUBERNETES_VERSIONS)
            raise ValueError(
                f"{text} is not supported by the add-on pins in infra/cluster_pins.py; use one of {supported}"
            )
        return text

    @field_validator("vpc_cidr", "service_cidr")
    @classmethod
    def _cidr(cls, value: str) -> str:
        network = rules.parse_ipv4_block(value)
        if isinstance(network, str):
            raise ValueError(network)  # noqa: TRY004 - pydantic reports only ValueError as a field message
        return value

    @field_validator("public_access_cidrs")
    @classmethod
    def _public_cidrs(cls, value: list[str]) -> list[str]:
        for block in value:
            network = rules.parse_ipv4_block(block)
            if isinstance(network, str):
                raise ValueError(network)  # noqa: TRY004 - pydantic reports only ValueError
        return value

    @field_validator("admin_role_arn")
    @classmethod
    def _role(cls, value: str | None) -> str | None:
        if value is not None and not _ROLE_ARN.match(value):
            raise ValueError(f"{value!r} is not an IAM role ARN (arn:aws:iam::123456789012:role/NAME)")
        return value

    @field_validator("admin_principal_arns")
    @classmethod
    def _principals(cls, value: list[str]) -> list[str]:
        for arn in value:
            if not _PRINCIPAL_ARN.match(arn):
                raise ValueError(
                    f"{arn!r} is not an IAM role or user ARN (arn:aws:iam::123456789012:role/NAME)"
                )
        return value

    @model_validator(mode="after")
    def _zones_and_groups(self) -> ClusterConfig:
        for zone in self.availability_zones:
            problem = rules.zone_problem(zone, region=self.region)
            if problem:
                raise ValueError(f"availability_zones: {problem}")
        if len(set(self.availability_zones)) != len(self.availability_zones):
            raise ValueError(f"availability_zones lists a zone twice ({', '.join(self.availability_zones)})")
        if self.gpu_availability_zone is None:
            raise ValueError(
                "gpu_availability_zone is missing; set it to the AZ of your GPU capacity "
                f"(one of {', '.join(self.availability_zones)})"
            )
        problem = rules.zone_problem(self.gpu_availability_zone, region=self.region)
        if problem:
            raise ValueError(f"gpu_availability_zone: {problem}")
        if self.gpu_availability_zone not in self.availability_zones:
            raise ValueError(
                f"gpu_availability_zone {self.gpu_availability_zone} is not one of availability_zones "
                f"({', '.join(self.availability_zones)}); add it there or pick one of them"
            )
        if self.admin_role_arn and self.admin_principal_arns:
            raise ValueError(
                "admin_principal_arns applies to the role the stack creates; with admin_role_arn, set "
                "that role's trust policy instead and remove admin_principal_arns"
            )
        names = [group.name for group in self.gpu_node_groups]
        if len(set(names)) != len(names):
            raise ValueError(f"gpu_node_groups names must be unique (got {names})")
        self._check_network()
        self._check_endpoint()
        return self

    def _check_network(self) -> None:
        vpc = ipaddress.IPv4Network(self.vpc_cidr)
        low, high = VPC_PREFIX_RANGE
        if not low <= vpc.prefixlen <= high:
            raise ValueError(
                f"vpc_cidr: {vpc} is a /{vpc.prefixlen}; a VPC block is a /{low} to a /{high} (EC2 refuses "
                f"CreateVpc otherwise); use e.g. 10.0.0.0/{low}"
            )
        problem = rules.vpc_block_problem(
            vpc,
            zones=len(self.availability_zones),
            public_mask=PUBLIC_SUBNET_MASK,
            private_mask=PRIVATE_SUBNET_MASK,
        )
        if problem:
            raise ValueError(f"vpc_cidr: {problem}")
        problem = rules.service_block_problem(ipaddress.IPv4Network(self.service_cidr), vpc=vpc)
        if problem:
            raise ValueError(f"service_cidr: {problem}")

    def _check_endpoint(self) -> None:
        if self.endpoint_access == "private":
            if self.public_access_cidrs:
                raise ValueError(
                    "public_access_cidrs has no effect with endpoint_access: private; remove it, or set "
                    "endpoint_access: public_and_private"
                )
            return
        if self.endpoint_access == "public":
            # A public-only endpoint is reached from the VPC through the NAT gateway's address, which
            # public_access_cidrs would have to contain: the in-VPC kubectl handler needs the private one.
            raise ValueError(
                "endpoint_access: public leaves the in-VPC kubectl handler (Helm charts, manifests) "
                "without a private endpoint; use private or public_and_private"
            )
        if not self.public_access_cidrs:
            raise ValueError(
                "endpoint_access: public_and_private needs public_access_cidrs: your office/VPN ranges "
                "(e.g. [203.0.113.0/24]); or use endpoint_access: private"
            )
        anywhere = [c for c in self.public_access_cidrs if ipaddress.IPv4Network(c).prefixlen == 0]
        if anywhere and not self.allow_public_api_from_anywhere:
            raise ValueError(
                "public_access_cidrs 0.0.0.0/0 opens the Kubernetes API to the whole internet; list your "
                "own ranges, or set allow_public_api_from_anywhere: true to accept that"
            )

    @property
    def checkpoint_prefix(self) -> str:
        return self.checkpoint_bucket.prefix
