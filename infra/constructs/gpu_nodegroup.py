"""A managed node group of GPU instances with EFA, ready for multi-node training.

Everything instance-specific (EFA interfaces, NVMe RAID0) is derived from the profile table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from aws_cdk import Tags
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from nvrx_eks.infra.constructs import launch_template as lt
from nvrx_eks.k8s import names

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from aws_cdk import aws_iam as iam

    from nvrx_eks.kitcore.profiles import InstanceProfile

CapacityKind = Literal["on_demand", "capacity_reservation", "capacity_block"]

NODEGROUP_LABEL = "nvrx-eks/nodegroup"

_CAPACITY_TYPES = {
    "on_demand": eks.CapacityType.ON_DEMAND,
    # An On-Demand Capacity Reservation is consumed by on-demand launches that target it.
    "capacity_reservation": eks.CapacityType.ON_DEMAND,
    "capacity_block": eks.CapacityType.CAPACITY_BLOCK,
}
_EFFECTS = {
    "NoSchedule": eks.TaintEffect.NO_SCHEDULE,
    "PreferNoSchedule": eks.TaintEffect.PREFER_NO_SCHEDULE,
    "NoExecute": eks.TaintEffect.NO_EXECUTE,
}


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class EfaSecurityGroup(ec2.SecurityGroup):
    """EFA traffic is allowed only between members: all traffic in and out, to and from itself.

    https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-start.html#efa-start-security
    """

    def __init__(self, scope: Construct, id: str, *, vpc: ec2.IVpc) -> None:  # noqa: A002
        super().__init__(
            scope, id, vpc=vpc, allow_all_outbound=False, description="EFA: all traffic between members only"
        )
        self.add_ingress_rule(self, ec2.Port.all_traffic(), "EFA: all traffic from members")
        self.add_egress_rule(self, ec2.Port.all_traffic(), "EFA: all traffic to members")


class GpuNodeGroup(Construct):
    """Launch template (EFA layout, IMDSv2, RAID0 NVMe, capacity targeting) + managed node group."""

    def __init__(
        self,
        scope: Construct,
        id: str,  # noqa: A002
        *,
        cluster: eks.ICluster,
        nodegroup_name: str,
        profile: InstanceProfile,
        vpc: ec2.IVpc,
        subnets: Sequence[ec2.ISubnet],
        node_role: iam.IRole,
        cluster_security_group_id: str,
        min_size: int,
        desired_size: int,
        max_size: int,
        capacity: CapacityKind = "on_demand",
        reservation_id: str | None = None,
        placement_group: bool = False,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Taint] = (),
        root_volume_gib: int = 200,
        extra_security_group_ids: Sequence[str] = (),
    ) -> None:
        super().__init__(scope, id)
        if capacity != "on_demand" and reservation_id is None:
            raise ValueError(f"capacity {capacity} needs a reservation_id")
        if placement_group and capacity != "on_demand":
            raise ValueError("a placement group cannot be combined with a reservation or Capacity Block")
        self.profile = profile
        self.nodegroup_name = nodegroup_name

        security_groups = [cluster_security_group_id, *extra_security_group_ids]
        self.efa_security_group: ec2.SecurityGroup | None = None
        if profile.efa_devices:
            self.efa_security_group = EfaSecurityGroup(self, "EfaSecurityGroup", vpc=vpc)
            security_groups.append(self.efa_security_group.security_group_id)

        self.placement_group: ec2.PlacementGroup | None = None
        if placement_group:
            self.placement_group = ec2.PlacementGroup(
                self, "PlacementGroup", strategy=ec2.PlacementGroupStrategy.CLUSTER
            )

        # Capacity Block node groups carry the instance type in the launch template, not in the node
        # group (the EKS guide lists it as required there). Updating such a group (a new launch
        # template version, an AMI release) replaces nodes: set its desired size to 0 first, or
        # the update waits on capacity the block is already using.
        # https://docs.aws.amazon.com/eks/latest/userguide/capacity-blocks-mng.html
        is_block = capacity == "capacity_block"
        data = ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
            instance_type=profile.name if is_block else None,
            block_device_mappings=[lt.root_volume(root_volume_gib)],
            metadata_options=lt.imds_options(),
            network_interfaces=lt.network_interfaces(profile, security_group_ids=security_groups),
            user_data=lt.user_data_base64(lt.nodeadm_user_data(profile)),
            placement=(
                ec2.CfnLaunchTemplate.PlacementProperty(group_name=self.placement_group.placement_group_name)
                if self.placement_group
                else None
            ),
            capacity_reservation_specification=(
                ec2.CfnLaunchTemplate.CapacityReservationSpecificationProperty(
                    capacity_reservation_target=ec2.CfnLaunchTemplate.CapacityReservationTargetProperty(
                        capacity_reservation_id=reservation_id
                    )
                )
                if reservation_id
                else None
            ),
            # Capacity Blocks are a market of their own: the launch must say so and target the block.
            # https://docs.aws.amazon.com/eks/latest/userguide/capacity-blocks-mng.html
            instance_market_options=(
                ec2.CfnLaunchTemplate.InstanceMarketOptionsProperty(market_type="capacity-block")
                if capacity == "capacity_block"
                else None
            ),
        )
        self.launch_template = ec2.CfnLaunchTemplate(self, "LaunchTemplate", launch_template_data=data)

        node_labels = {
            names.GPU_NODE_LABEL: "true",
            names.EFA_NODE_LABEL: "true" if profile.efa_devices else "false",
            NODEGROUP_LABEL: nodegroup_name,
            **(labels or {}),
        }
        node_taints = [Taint(names.GPU_TAINT_KEY, names.GPU_TAINT_VALUE, names.GPU_TAINT_EFFECT), *taints]
        self.nodegroup = eks.Nodegroup(
            self,
            "Nodegroup",
            cluster=cluster,
            nodegroup_name=nodegroup_name,
            ami_type=eks.NodegroupAmiType.AL2023_X86_64_NVIDIA,
            capacity_type=_CAPACITY_TYPES[capacity],
            min_size=min_size,
            desired_size=desired_size,
            max_size=max_size,
            node_role=node_role,
            subnets=ec2.SubnetSelection(subnets=list(subnets)),
            launch_template_spec=eks.LaunchTemplateSpec(
                id=self.launch_template.ref, version=self.launch_template.attr_latest_version_number
            ),
            labels=node_labels,
            taints=[eks.TaintSpec(key=t.key, value=t.value, effect=_EFFECTS[t.effect]) for t in node_taints],
            # Replace nodes whose GPUs or network the node monitoring agent reports unhealthy.
            # https://docs.aws.amazon.com/eks/latest/userguide/node-health.html
            enable_node_auto_repair=True,
            # A training job spans the whole group: update one node at a time.
            max_unavailable=1,
            # An update drains each node through the Eviction API, which honours PodDisruptionBudgets
            # (the job's, Kueue's); the CDK default (force) terminates a node whose pods a budget
            # still protects. Without force, an update that cannot drain fails and the node stays.
            # https://docs.aws.amazon.com/eks/latest/userguide/managed-node-update-behavior.html
            force_update=False,
        )
        # The L2 refuses AL2023_X86_64_NVIDIA for instance types its own GPU list lacks (p5, g6),
        # so the instance type goes onto the L1 directly.
        cfn_nodegroup = self.nodegroup.node.default_child
        assert isinstance(cfn_nodegroup, eks.CfnNodegroup)  # noqa: S101 - narrows the type for the override
        if not is_block:
            cfn_nodegroup.instance_types = [profile.name]
        Tags.of(self).add("nvrx-eks/nodegroup", nodegroup_name)
