"""Checks, before `cdk deploy`, that the account and region can hold the configured GPU node groups.

For each GPU node group: the instance type is offered in the configured Availability Zone, it supports
EFA, its capacity reservation or Capacity Block exists, is active or scheduled and matches type, AZ and
count, and the account's On-Demand vCPU quota for the instance family covers every node group at its
maximum size. Every EKS add-on pinned in infra/cluster_pins.py is offered at its pinned version for the
cluster's Kubernetes version (CreateAddon refuses any other), else the row lists the versions EKS
offers; and that version is in EKS standard support on the day (DescribeClusterVersions). Offline, every
image the stack deploys is pulled by digest: a pinned chart image whose digest infra/cluster_pins.py does not
hold yet fails (`nvrx-eks image pin` records it), the node check by tag warns. Each check yields a row
(pass / warn / fail) with the fix when it does not pass. A run where every check passes is
recorded (infra/deploy_gate.py): `cdk deploy` refuses to start without a recent one.
"""

from __future__ import annotations

import enum
import json
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from nvrx_eks.infra import cluster_pins
from nvrx_eks.infra.addon_values import MANAGED_ADDON_CONFIGURATION
from nvrx_eks.infra.config import NODE_CHECK_DIGEST_FIX
from nvrx_eks.infra.ops import charts
from nvrx_eks.infra.ops.aws import ServiceError, aws_errors, error_code
from nvrx_eks.kitcore import pins
from nvrx_eks.kitcore.configio import UserError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from nvrx_eks.infra.config import ClusterConfig
    from nvrx_eks.infra.ops.aws import AwsSession
    from nvrx_eks.k8s.values import JobValues

CapacityKind = Literal["on_demand", "capacity_reservation", "capacity_block"]
"""As in infra/config.py CapacityConfig.type."""

# Service Quotas codes for "Running On-Demand <family> instances" (vCPUs, per Region), by the first
# letters of the instance type. Codes as listed by `aws service-quotas list-service-quotas
# --service-code ec2`; see https://docs.aws.amazon.com/ec2/latest/instancetypes/ec2-instance-quotas.html
ON_DEMAND_QUOTAS: dict[str, tuple[str, str]] = {
    "p": ("L-417A185B", "Running On-Demand P instances"),
    "g": ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    "vt": ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    "trn": ("L-2C3B7624", "Running On-Demand Trn instances"),
    "inf": ("L-1945791B", "Running On-Demand Inf instances"),
    "x": ("L-7295265B", "Running On-Demand X instances"),
    "f": ("L-74FC7D96", "Running On-Demand F instances"),
    "dl": ("L-6E869C2A", "Running On-Demand DL instances"),
    "hpc": ("L-F7808C92", "Running On-Demand HPC instances"),
    "u": ("L-43DA4232", "Running On-Demand High Memory instances"),
}
STANDARD_QUOTA = ("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances")

# Reservation states a node group can launch into now (active) or once the block starts (scheduled).
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-view.html
USABLE_STATES = frozenset({"active", "scheduled"})
# Before a Capacity Block starts, its counts read 0; this tag holds the size that will be delivered.
BLOCK_SIZE_TAG = "aws:ec2capacityreservation:incrementalRequestedQuantity"


class Status(enum.StrEnum):
    PASS = "pass"  # noqa: S105 - a check result, not a password
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True, kw_only=True)
class NodeGroupTarget:
    """What preflight needs from one GPU node group of the cluster config."""

    name: str
    instance_type: str
    max_nodes: int
    capacity: CapacityKind = "on_demand"
    reservation_id: str | None = None
    min_nodes: int = 0
    desired_nodes: int = 0
    """The sizes the template gives the group (a deploy that changes its scaling writes all three)."""


@dataclass(frozen=True, kw_only=True)
class AddonTarget:
    """One EKS managed add-on at the version the stack will ask CreateAddon for."""

    name: str
    version: str
    configuration: dict[str, Any] | None = None
    """The configuration values the stack gives it (infra/addon_values.py), checked against the
    add-on version's published schema."""


@dataclass(frozen=True, kw_only=True)
class ImageTarget:
    """One container image the stack deploys, and whether it is pulled by digest."""

    subject: str
    reference: str
    """REPOSITORY:TAG[@DIGEST] as the stack passes it."""
    by_digest: bool
    required: bool
    """True: pulled by tag fails the check, so `cdk deploy` refuses (infra/deploy_gate.py); False: it
    warns."""
    fix: str


@dataclass(frozen=True, kw_only=True)
class PreflightTarget:
    region: str
    availability_zone: str
    node_groups: tuple[NodeGroupTarget, ...]
    cluster_name: str | None = None
    """The EKS cluster the stack creates (the config's `name`): a deployed one's groups are compared."""
    stack_name: str | None = None
    """The stack (the config's `name`): its deployed template's node group sizes are compared."""
    kubernetes_version: str | None = None
    addons: tuple[AddonTarget, ...] = ()
    images: tuple[ImageTarget, ...] = ()
    charts: tuple[cluster_pins.ChartPin, ...] = ()
    """Helm charts whose pinned version must be published in their repository."""


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    check: str
    subject: str
    status: Status
    detail: str
    fix: str = ""


def quota_for(instance_type: str) -> tuple[str, str]:
    """(quota code, quota name) of the On-Demand vCPU quota that counts `instance_type`."""
    family = instance_type.split(".", 1)[0]
    letters = "".join(ch for ch in family if ch.isalpha())
    for prefix in sorted(ON_DEMAND_QUOTAS, key=len, reverse=True):
        if letters.startswith(prefix):
            return ON_DEMAND_QUOTAS[prefix]
    return STANDARD_QUOTA


class Preflight:
    """Runs every check against one region with one session; `run()` returns the rows in order."""

    def __init__(self, *, session: AwsSession, target: PreflightTarget) -> None:
        self._session = session
        self._target = target
        self._vcpus: dict[str, int] = {}
        self.account: str | None = None
        """The account the credentials belong to (set by the first check)."""

    def run(self) -> list[CheckResult]:
        return self.run_online() + offline_checks(self._target)

    def run_online(self) -> list[CheckResult]:
        """The checks that ask AWS (the first one, the caller's identity, needs credentials)."""
        results = [self._identity()]
        if self._target.kubernetes_version is not None:
            results.append(self._guarded_kubernetes(self._target.kubernetes_version))
        for group in self._target.node_groups:
            results.append(self._guarded("instance type offered", group, self._offered))
            results.append(self._guarded("EFA supported", group, self._efa))
            if group.capacity != "on_demand":
                results.append(self._guarded("capacity reservation", group, self._reservation))
            if self._target.stack_name is not None:
                results.append(self._guarded(LIVE_SIZE_CHECK, group, self._live_size))
        results.extend(self._quotas())
        results.extend(self._guarded_addon(addon) for addon in self._target.addons)
        results.extend(chart_version(chart) for chart in self._target.charts)
        return results

    # -- checks ---------------------------------------------------------------------------------

    def _identity(self) -> CheckResult:
        # Fails fast (UserError) when there are no usable credentials: every other check would too.
        with aws_errors("sts:GetCallerIdentity"):
            who = self._session.client("sts").get_caller_identity()
        self.account = str(who["Account"])
        return CheckResult(
            check="credentials",
            subject=self._target.region,
            status=Status.PASS,
            detail=f"account {who['Account']} as {who['Arn']}",
        )

    def _guarded(
        self, check: str, group: NodeGroupTarget, fn: Callable[[NodeGroupTarget], CheckResult]
    ) -> CheckResult:
        """Run one check; a denied or throttled call becomes that check's failure, not a crash."""
        try:
            return fn(group)
        except (UserError, ServiceError) as exc:
            # The message already says what to grant, refresh or retry.
            return CheckResult(check=check, subject=group.name, status=Status.FAIL, detail=str(exc))

    def _offered(self, group: NodeGroupTarget) -> CheckResult:
        ec2 = self._session.client("ec2")
        az = self._target.availability_zone
        with aws_errors("ec2:DescribeInstanceTypeOfferings"):
            here = ec2.describe_instance_type_offerings(
                LocationType="availability-zone",
                Filters=[
                    {"Name": "instance-type", "Values": [group.instance_type]},
                    {"Name": "location", "Values": [az]},
                ],
            )["InstanceTypeOfferings"]
        if here:
            return CheckResult(
                check="instance type offered",
                subject=group.name,
                status=Status.PASS,
                detail=f"{group.instance_type} is offered in {az}",
            )
        # Not here: list the zones that do offer it, for the fix.
        with aws_errors("ec2:DescribeInstanceTypeOfferings"):
            offered_azs = sorted(
                offering["Location"]
                for page in ec2.get_paginator("describe_instance_type_offerings").paginate(
                    LocationType="availability-zone",
                    Filters=[{"Name": "instance-type", "Values": [group.instance_type]}],
                )
                for offering in page["InstanceTypeOfferings"]
            )
        elsewhere = ", ".join(offered_azs) or f"no Availability Zone of {self._target.region}"
        return CheckResult(
            check="instance type offered",
            subject=group.name,
            status=Status.FAIL,
            detail=f"{group.instance_type} is not offered in {az} (offered in: {elsewhere})",
            fix=(
                f"set gpu_availability_zone to one of: {elsewhere}"
                if offered_azs
                else f"choose a region that offers {group.instance_type}"
            ),
        )

    def _instance_info(self, instance_type: str) -> dict[str, Any]:
        ec2 = self._session.client("ec2")
        with aws_errors("ec2:DescribeInstanceTypes"):
            try:
                info = ec2.describe_instance_types(InstanceTypes=[instance_type])["InstanceTypes"]
            except Exception as exc:
                if error_code(exc).startswith("InvalidInstanceType"):
                    raise UserError(
                        f"{instance_type} is not an instance type in {self._target.region}; "
                        "fix the node group's instance type"
                    ) from None
                raise
        self._vcpus[instance_type] = int(info[0]["VCpuInfo"]["DefaultVCpus"])
        first: dict[str, Any] = info[0]
        return first

    def _efa(self, group: NodeGroupTarget) -> CheckResult:
        info = self._instance_info(group.instance_type)
        network = info.get("NetworkInfo", {})
        if network.get("EfaSupported"):
            max_cards = network.get("EfaInfo", {}).get("MaximumEfaInterfaces", "?")
            return CheckResult(
                check="EFA supported",
                subject=group.name,
                status=Status.PASS,
                detail=f"{group.instance_type}: EFA, up to {max_cards} EFA interfaces",
            )
        return CheckResult(
            check="EFA supported",
            subject=group.name,
            status=Status.FAIL,
            detail=f"{group.instance_type} does not support EFA",
            fix="pick an EFA-capable type (EC2 user guide: efa-acc-inst-types), e.g. p5.48xlarge",
        )

    def _live_size(self, group: NodeGroupTarget) -> CheckResult:
        """A deploy that changes a group's scaling in the template writes all three sizes, the desired
        one included: when that is below the nodes the group runs (scaled by hand for a job), the
        deploy removes nodes under the job. CloudFormation compares the new template with the one it
        deployed, not with the group as it runs: an unchanged ScalingConfig is left alone, whatever a
        hand set since, and a changed one is written whole."""
        deployed = self._deployed_scaling(group.name)
        if deployed is None:
            return CheckResult(
                check=LIVE_SIZE_CHECK, subject=group.name, status=Status.PASS, detail="not deployed yet"
            )
        new = (group.min_nodes, group.max_nodes, group.desired_nodes)
        if deployed == new:
            return CheckResult(
                check=LIVE_SIZE_CHECK,
                subject=group.name,
                status=Status.PASS,
                detail="the deployed template's scaling is unchanged: the deploy leaves the group's size",
            )
        eks = self._session.client("eks")
        with aws_errors("eks:DescribeNodegroup"):
            try:
                live = eks.describe_nodegroup(clusterName=self._target.cluster_name, nodegroupName=group.name)
            except Exception as exc:
                if error_code(exc) == "ResourceNotFoundException":
                    return CheckResult(
                        check=LIVE_SIZE_CHECK,
                        subject=group.name,
                        status=Status.PASS,
                        detail="in the deployed template, not running: the deploy creates it",
                    )
                raise
        running = int(live["nodegroup"].get("scalingConfig", {}).get("desiredSize", 0))
        change = "/".join(map(str, deployed)) + " -> " + "/".join(map(str, new))
        if running <= group.desired_nodes:
            return CheckResult(
                check=LIVE_SIZE_CHECK,
                subject=group.name,
                status=Status.PASS,
                detail=f"runs {running}; the deploy writes min/max/desired {change}, keeping them",
            )
        return CheckResult(
            check=LIVE_SIZE_CHECK,
            subject=group.name,
            status=Status.FAIL,
            detail=(
                f"runs {running} nodes; the deploy changes the template's min/max/desired ({change}) and "
                f"so writes desired size {group.desired_nodes}, removing {running - group.desired_nodes}"
            ),
            fix=(
                "deploy when no job needs the nodes (scale the group down first), or keep the group's "
                "min_size/desired_size/max_size as the deployed template has them "
                f"({'/'.join(map(str, deployed))}) for now"
            ),
        )

    def _deployed_scaling(self, nodegroup: str) -> tuple[int, int, int] | None:
        """(min, max, desired) of `nodegroup` in the stack's deployed template; None when the stack or
        the group is not in it yet."""
        cfn = self._session.client("cloudformation")
        with aws_errors("cloudformation:GetTemplate"):
            try:
                body = cfn.get_template(StackName=self._target.stack_name, TemplateStage="Original")[
                    "TemplateBody"
                ]
            except Exception as exc:
                if error_code(exc) == "ValidationError" and "does not exist" in str(exc):
                    return None
                raise
        template = json.loads(body) if isinstance(body, str) else body
        for resource in template.get("Resources", {}).values():
            props = resource.get("Properties", {})
            if resource.get("Type") == "AWS::EKS::Nodegroup" and props.get("NodegroupName") == nodegroup:
                scaling = props.get("ScalingConfig", {})
                return (
                    int(scaling.get("MinSize", 0)),
                    int(scaling.get("MaxSize", 1)),
                    int(scaling.get("DesiredSize", scaling.get("MinSize", 0))),
                )
        return None

    def _reservation(self, group: NodeGroupTarget) -> CheckResult:
        return check_reservation(
            self._session.client("ec2"),
            group,
            availability_zone=self._target.availability_zone,
            region=self._target.region,
        )

    def _quotas(self) -> list[CheckResult]:
        """One row per quota: the sum over node groups counted by it of max nodes x vCPUs."""
        needed: dict[tuple[str, str], list[NodeGroupTarget]] = defaultdict(list)
        for group in self._target.node_groups:
            needed[quota_for(group.instance_type)].append(group)
        return [self._quota(code, name, groups) for (code, name), groups in needed.items()]

    def _quota(self, code: str, name: str, groups: list[NodeGroupTarget]) -> CheckResult:
        check = "On-Demand vCPU quota"
        try:
            vcpus = {g.instance_type: self._vcpus_of(g.instance_type) for g in groups}
            with aws_errors("servicequotas:GetServiceQuota"):
                try:
                    quota = self._session.client("service-quotas").get_service_quota(
                        ServiceCode="ec2", QuotaCode=code
                    )
                except Exception as exc:
                    if error_code(exc) == "NoSuchResourceException":
                        raise UserError(
                            f"quota {code} does not exist in {self._target.region}; the instance family "
                            "is not sold there: pick another region"
                        ) from None
                    raise
        except (UserError, ServiceError) as exc:
            return CheckResult(check=check, subject=name, status=Status.FAIL, detail=str(exc))
        limit = int(quota["Quota"]["Value"])
        required = sum(g.max_nodes * vcpus[g.instance_type] for g in groups)
        parts = " + ".join(f"{g.max_nodes} x {vcpus[g.instance_type]} ({g.name})" for g in groups)
        detail = f"{code}: need {parts} = {required} vCPUs, quota is {limit}"
        if required <= limit:
            return CheckResult(check=check, subject=name, status=Status.PASS, detail=detail)
        # Capacity Blocks are prepaid capacity; whether their instances count against this quota is
        # not something we could confirm, so a shortfall there is a warning rather than a failure.
        blocks_only = all(g.capacity == "capacity_block" for g in groups)
        return CheckResult(
            check=check,
            subject=name,
            status=Status.WARN if blocks_only else Status.FAIL,
            detail=detail,
            fix=(
                f"request {required} vCPUs: `aws service-quotas request-service-quota-increase "
                f"--service-code ec2 --quota-code {code} --desired-value {required} "
                f"--region {self._target.region}`, or lower the node groups' max_size"
            ),
        )

    def _guarded_kubernetes(self, version: str) -> CheckResult:
        try:
            return kubernetes_support(self._session.client("eks"), version=version)
        except (UserError, ServiceError) as exc:
            return CheckResult(check=KUBERNETES_CHECK, subject=version, status=Status.FAIL, detail=str(exc))

    def _guarded_addon(self, addon: AddonTarget) -> CheckResult:
        try:
            return self._addon(addon)
        except (UserError, ServiceError) as exc:
            return CheckResult(check=ADDON_CHECK, subject=addon.name, status=Status.FAIL, detail=str(exc))

    def _addon(self, addon: AddonTarget) -> CheckResult:
        kubernetes = str(self._target.kubernetes_version)
        eks = self._session.client("eks")
        offered = addon_versions(eks, name=addon.name, kubernetes_version=kubernetes)
        if addon.version in offered:
            if addon.configuration is not None:
                problem = configuration_problem(eks, addon)
                if problem is not None:
                    return CheckResult(
                        check=ADDON_CHECK,
                        subject=addon.name,
                        status=Status.FAIL,
                        detail=f"{addon.version} refuses the kit's configuration values: {problem}",
                        fix=f"change {addon.name}'s configuration in infra/addon_values.py to fit the schema "
                        f"(aws eks describe-addon-configuration --addon-name {addon.name} "
                        f"--addon-version {addon.version})",
                    )
            return CheckResult(
                check=ADDON_CHECK,
                subject=addon.name,
                status=Status.PASS,
                detail=f"{addon.version} is offered for Kubernetes {kubernetes}",
            )
        if not offered:
            return CheckResult(
                check=ADDON_CHECK,
                subject=addon.name,
                status=Status.FAIL,
                detail=(
                    f"EKS offers no {addon.name} version for Kubernetes {kubernetes} in {self._target.region}"
                ),
                fix="pick a kubernetes_version the add-on supports, or drop the add-on",
            )
        shown = ", ".join(offered[:ADDON_VERSIONS_SHOWN]) + (
            " ..." if len(offered) > ADDON_VERSIONS_SHOWN else ""
        )
        return CheckResult(
            check=ADDON_CHECK,
            subject=addon.name,
            status=Status.FAIL,
            detail=f"{addon.version} is not offered for Kubernetes {kubernetes}; valid: {shown}",
            fix=f"set {addon.name} for {kubernetes} in infra/cluster_pins.py EKS_ADDONS to one of: {shown}",
        )

    def _vcpus_of(self, instance_type: str) -> int:
        if instance_type not in self._vcpus:
            self._instance_info(instance_type)
        return self._vcpus[instance_type]


ADDON_CHECK = "add-on version"
KUBERNETES_CHECK = "Kubernetes standard support"
STANDARD_SUPPORT = "STANDARD_SUPPORT"


def kubernetes_support(
    eks: Any,  # noqa: ANN401 - a boto3 EKS client
    *,
    version: str,
) -> CheckResult:
    """EKS's own answer: is `version` in standard support today (extended support costs more per
    cluster-hour; an unsupported version cannot be created)?
    https://docs.aws.amazon.com/eks/latest/APIReference/API_DescribeClusterVersions.html"""
    with aws_errors("eks:DescribeClusterVersions"):
        found = eks.describe_cluster_versions(clusterVersions=[version], includeAll=True)["clusterVersions"]
    entry = next((v for v in found if v.get("clusterVersion") == version), None)
    offered = ", ".join(cluster_pins.SUPPORTED_KUBERNETES_VERSIONS)
    fix = (
        f"use a version in standard support that infra/cluster_pins.py covers ({offered}), or raise the pins"
    )
    if entry is None:
        return CheckResult(
            check=KUBERNETES_CHECK,
            subject=version,
            status=Status.FAIL,
            detail=f"EKS lists no Kubernetes {version}",
            fix=fix,
        )
    status = str(entry.get("versionStatus", "?"))
    end = entry.get("endOfStandardSupportDate")
    until = f" (standard support ends {end:%Y-%m-%d})" if end else ""
    if status == STANDARD_SUPPORT:
        return CheckResult(
            check=KUBERNETES_CHECK, subject=version, status=Status.PASS, detail=f"{status}{until}"
        )
    return CheckResult(
        check=KUBERNETES_CHECK,
        subject=version,
        status=Status.FAIL,
        detail=f"Kubernetes {version} is {status}{until}",
        fix=fix,
    )


ADDON_VERSIONS_SHOWN = 8


def configuration_problem(
    eks: Any,  # noqa: ANN401 - a boto3 EKS client
    addon: AddonTarget,
) -> str | None:
    """Why EKS would refuse `addon.configuration` for `addon.version` (its published JSON schema), or
    None. CreateAddon validates configuration values against this schema.
    https://docs.aws.amazon.com/eks/latest/APIReference/API_DescribeAddonConfiguration.html"""
    import json  # noqa: PLC0415

    import jsonschema  # noqa: PLC0415

    with aws_errors("eks:DescribeAddonConfiguration"):
        answer = eks.describe_addon_configuration(addonName=addon.name, addonVersion=addon.version)
    schema = json.loads(answer.get("configurationSchema") or "{}")
    error = jsonschema.exceptions.best_match(
        jsonschema.Draft7Validator(schema).iter_errors(addon.configuration)
    )
    if error is None:
        return None
    where = ".".join(str(part) for part in error.absolute_path) or "(top level)"
    return f"{where}: {error.message}"


def addon_versions(
    eks: Any,  # noqa: ANN401 - a boto3 EKS client
    *,
    name: str,
    kubernetes_version: str,
) -> list[str]:
    """The versions of add-on `name` EKS offers for `kubernetes_version`, newest first (the API's order)."""
    versions: list[str] = []
    with aws_errors("eks:DescribeAddonVersions"):
        pages = eks.get_paginator("describe_addon_versions").paginate(
            kubernetesVersion=kubernetes_version, addonName=name
        )
        for page in pages:
            for found in page.get("addons", []):
                for entry in found.get("addonVersions", []):
                    version = entry["addonVersion"]
                    if found.get("addonName") == name and version not in versions:
                        versions.append(version)
    return versions


def check_reservation(
    ec2: Any,  # noqa: ANN401 - a boto3 EC2 client
    group: NodeGroupTarget,
    *,
    availability_zone: str,
    region: str,
) -> CheckResult:
    """The node group's reservation or Capacity Block exists, is usable, and matches type, AZ and count."""
    kind = "Capacity Block" if group.capacity == "capacity_block" else "capacity reservation"
    check = "capacity reservation"
    if not group.reservation_id:
        return CheckResult(
            check=check,
            subject=group.name,
            status=Status.FAIL,
            detail=f"capacity type {group.capacity} needs a reservation id",
            fix=f"set the node group's capacity.reservation_id to the {kind} id (cr-...)",
        )
    with aws_errors("ec2:DescribeCapacityReservations"):
        try:
            found = ec2.describe_capacity_reservations(CapacityReservationIds=[group.reservation_id])
        except Exception as exc:
            if error_code(exc).startswith("InvalidCapacityReservationId"):
                return CheckResult(
                    check=check,
                    subject=group.name,
                    status=Status.FAIL,
                    detail=f"{kind} {group.reservation_id} not found in {region}",
                    fix="check the id and region (`aws ec2 describe-capacity-reservations`)",
                )
            raise
    reservation = found["CapacityReservations"][0]
    return _match_reservation(group, reservation, kind=kind, az=availability_zone)


def _match_reservation(
    group: NodeGroupTarget, reservation: dict[str, Any], *, kind: str, az: str
) -> CheckResult:
    """Compare one DescribeCapacityReservations entry with the node group it should serve."""
    rid = reservation["CapacityReservationId"]
    state = reservation.get("State", "?")
    problems: list[tuple[str, str]] = []
    if state not in USABLE_STATES:
        problems.append((f"state is {state}", f"use an active or scheduled {kind}"))
    if reservation.get("InstanceType") != group.instance_type:
        problems.append(
            (
                f"holds {reservation.get('InstanceType')}, node group uses {group.instance_type}",
                f"set the node group's instance type to {reservation.get('InstanceType')}",
            )
        )
    if reservation.get("AvailabilityZone") != az:
        problems.append(
            (
                f"is in {reservation.get('AvailabilityZone')}, cluster uses {az}",
                f"set gpu_availability_zone to {reservation.get('AvailabilityZone')}",
            )
        )
    # The API says "capacity-block" / "default"; the config says capacity_block / capacity_reservation.
    is_block = reservation.get("ReservationType") == "capacity-block"
    if is_block != (group.capacity == "capacity_block"):
        actual = "capacity_block" if is_block else "capacity_reservation"
        problems.append((f"is a {actual}, node group says {group.capacity}", f"set capacity.type {actual}"))
    size = _reserved_count(reservation)
    if size < group.max_nodes:
        problems.append(
            (
                f"holds {size} instance(s), node group max is {group.max_nodes}",
                f"lower the node group's max_size to {size} or reserve more",
            )
        )
    end = reservation.get("EndDate")
    until = f", ends {end:%Y-%m-%d %H:%M %Z}" if end else ""
    if problems:
        return CheckResult(
            check="capacity reservation",
            subject=group.name,
            status=Status.FAIL,
            detail=f"{rid} " + "; ".join(p for p, _ in problems),
            fix="; ".join(f for _, f in problems),
        )
    return CheckResult(
        check="capacity reservation",
        subject=group.name,
        status=Status.PASS,
        detail=f"{rid} {state}: {size} x {group.instance_type} in {az}{until}",
    )


def _reserved_count(reservation: dict[str, Any]) -> int:
    total = int(reservation.get("TotalInstanceCount", 0))
    if total:
        return total
    tags = {t["Key"]: t["Value"] for t in reservation.get("Tags", [])}
    return int(tags.get(BLOCK_SIZE_TAG, 0))


def target_from_config(config: ClusterConfig) -> PreflightTarget:
    """The parts of a validated cluster config that preflight checks."""
    if config.gpu_availability_zone is None:  # the model refuses this; kept for type checkers
        raise UserError("gpu_availability_zone is missing in the cluster config")
    return PreflightTarget(
        region=config.region,
        availability_zone=config.gpu_availability_zone,
        cluster_name=config.name,
        stack_name=config.name,
        kubernetes_version=config.kubernetes_version,
        # Every pinned add-on, deployed by this config or not: a pin EKS does not offer is wrong either way.
        addons=tuple(
            AddonTarget(
                name=pin.name,
                version=pin.version_for(config.kubernetes_version),
                configuration=MANAGED_ADDON_CONFIGURATION.get(pin.name),
            )
            for pin in cluster_pins.EKS_ADDONS.values()
        ),
        node_groups=tuple(
            NodeGroupTarget(
                name=group.name,
                instance_type=group.instance_type,
                max_nodes=group.max_size,
                capacity=group.capacity.type,
                reservation_id=group.capacity.reservation_id,
                min_nodes=group.min_size,
                desired_nodes=group.desired_size,
            )
            for group in config.gpu_node_groups
        ),
        images=image_targets(config),
        # Every pinned chart, installed by this config or not, as for the add-on pins.
        charts=tuple(cluster_pins.HELM_CHARTS.values()),
    )


CHART_CHECK = "Helm chart version"
LIVE_SIZE_CHECK = "live node group size"


def chart_version(pin: cluster_pins.ChartPin) -> CheckResult:
    """Pass when the chart's repository publishes the pinned version (the stack installs it at deploy)."""
    subject = f"{pin.chart} {pin.version}"
    try:
        found, versions = charts.published(pin, charts.http_get)
    except charts.ChartLookupError as exc:
        return CheckResult(
            check=CHART_CHECK,
            subject=subject,
            status=Status.FAIL,
            detail=str(exc),
            fix="run preflight where the chart repository is reachable (the deploy's handler pulls it too)",
        )
    if found:
        return CheckResult(
            check=CHART_CHECK, subject=subject, status=Status.PASS, detail=f"published in {pin.repository}"
        )
    seen = f"; it publishes {', '.join(versions)}" if versions else ""
    return CheckResult(
        check=CHART_CHECK,
        subject=subject,
        status=Status.FAIL,
        detail=f"{pin.repository} does not publish {pin.chart} {pin.version}{seen}",
        fix="pin a published version in infra/cluster_pins.py HELM_CHARTS (with its images), then run "
        "`nvrx-eks image pin`",
    )


IMAGE_CHECK = "image by digest"


def image_digest(image: ImageTarget) -> CheckResult:
    """Pass when the stack pulls `image` by digest; else fail (a required one) or warn, with the fix."""
    if image.by_digest:
        return CheckResult(
            check=IMAGE_CHECK, subject=image.subject, status=Status.PASS, detail=image.reference
        )
    return CheckResult(
        check=IMAGE_CHECK,
        subject=image.subject,
        status=Status.FAIL if image.required else Status.WARN,
        detail=f"{image.reference} is pulled by tag",
        fix=image.fix,
    )


def image_targets(config: ClusterConfig) -> tuple[ImageTarget, ...]:
    """Every pinned chart's images, deployed by this config or not (an unpublished digest is a gap
    either way), and the node check's image.

    A chart image by tag is refused: its tag lives in a registry the kit does not own. The node check's
    tag is in the stack's own ECR repository, whose tags are immutable (infra/constructs/storage.py), and
    its image is pushed only after the first deploy, so its digest can be given from the second deploy on:
    by tag it warns.
    """
    charts = tuple(
        ImageTarget(
            subject=f"{name}: {image.values_key}",
            reference=image.reference,
            by_digest=image.digest != pins.UNPUBLISHED_SHA256,
            required=True,
            fix=cluster_pins.IMAGE_PIN_FIX,
        )
        for name, chart in cluster_pins.HELM_CHARTS.items()
        for image in chart.images
    )
    check = config.node_check
    node_check = ImageTarget(
        subject="node check",
        reference=f"<ImageRepositoryUri>:{check.image_tag or '<this checkout>'}"
        + (f"@{check.image_digest}" if check.image_digest else ""),
        by_digest=check.image_digest is not None,
        required=False,
        fix=NODE_CHECK_DIGEST_FIX,
    )
    return (*charts, node_check)


def offline_checks(
    target: PreflightTarget, *, config: ClusterConfig | None = None, job: JobValues | None = None
) -> list[CheckResult]:
    """The checks that need no AWS call: every deployed image by digest, and the job's nodes + spares
    against the node groups (with `job`). They run first, so they work without credentials."""
    results = [image_digest(image) for image in target.images]
    if config is not None and job is not None:
        results.append(job_capacity(config, job))
    return results


def failed(results: Iterable[CheckResult]) -> list[CheckResult]:
    return [r for r in results if r.status is Status.FAIL]


def render_table(results: list[CheckResult]) -> object:
    """A rich Table of the results (returned, so callers choose the console)."""
    from rich.table import Table  # noqa: PLC0415

    style = {Status.PASS: "green", Status.WARN: "yellow", Status.FAIL: "bold red"}
    table = Table(title="nvrx-eks preflight", show_lines=False)
    for column in ("check", "subject", "result", "detail", "fix"):
        table.add_column(column, overflow="fold")
    for r in results:
        table.add_row(r.check, r.subject, f"[{style[r.status]}]{r.status.value}[/]", r.detail, r.fix)
    return table


def job_capacity(config: ClusterConfig, values: JobValues) -> CheckResult:
    """The job's nodes + warm spares fit the GPU node groups of its instance type at their max size.

    Spares are real capacity: a spare pod is scheduled on a node of its own before
    any fault, so a node group sized for `num_nodes` alone would leave spares Pending and the lost
    node's place empty. Checked offline from the two configs, beside the account checks.
    """
    needed = values.num_nodes + values.spares
    groups = [g for g in config.gpu_node_groups if g.instance_type == values.instance_profile]
    subject = f"{values.name}: {values.num_nodes} nodes + {values.spares} spares"
    if not groups:
        return CheckResult(
            check="job capacity",
            subject=subject,
            status=Status.FAIL,
            detail=f"no GPU node group of {values.instance_profile} in the cluster config",
            fix="set the job's instance_profile to a node group's instance_type, or add a node group",
        )
    room = sum(g.max_size for g in groups)
    names = ", ".join(g.name for g in groups)
    if needed > room:
        return CheckResult(
            check="job capacity",
            subject=subject,
            status=Status.FAIL,
            detail=f"needs {needed} {values.instance_profile} nodes; node group(s) {names} max {room}",
            fix=f"raise max_size of {names} to {needed}, or lower spares / num_nodes in the job values",
        )
    return CheckResult(
        check="job capacity",
        subject=subject,
        status=Status.PASS,
        detail=f"{needed} of max {room} nodes in {names}",
    )
