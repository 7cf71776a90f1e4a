"""VPC for the cluster: private nodes behind NAT, VPC endpoints for the AWS APIs nodes call, flow logs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from aws_cdk import RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct

from nvrx_eks.infra import nag
from nvrx_eks.infra.config import PRIVATE_SUBNET_MASK, PUBLIC_SUBNET_MASK

if TYPE_CHECKING:
    from collections.abc import Sequence

# Interface endpoints keep image pulls (ECR api + dkr), credential exchange (STS, EKS Auth for Pod
# Identity), logs and EC2 calls (VPC CNI, EFA attachment) off the NAT gateway and inside the VPC.
INTERFACE_ENDPOINTS: dict[str, ec2.InterfaceVpcEndpointAwsService] = {
    "EcrApi": ec2.InterfaceVpcEndpointAwsService.ECR,
    "EcrDocker": ec2.InterfaceVpcEndpointAwsService.ECR_DOCKER,
    "Sts": ec2.InterfaceVpcEndpointAwsService.STS,
    "Logs": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_LOGS,
    "EksAuth": ec2.InterfaceVpcEndpointAwsService.EKS_AUTH,
    "Ec2": ec2.InterfaceVpcEndpointAwsService.EC2,
}


class Network(Construct):
    """Public subnets for NAT only; private subnets (one per AZ) for the control plane ENIs and nodes."""

    def __init__(
        self,
        scope: Construct,
        id: str,  # noqa: A002
        *,
        cidr: str,
        availability_zones: Sequence[str],
        gpu_availability_zone: str,
        nat: Literal["gpu_zone", "per_zone"] = "gpu_zone",
        log_key: kms.IKey | None = None,
        flow_log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH,
    ) -> None:
        super().__init__(scope, id)
        if gpu_availability_zone not in availability_zones:
            raise ValueError(f"{gpu_availability_zone} is not one of {list(availability_zones)}")
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(cidr),
            availability_zones=list(availability_zones),
            # gpu_zone: the one NAT gateway sits in the GPU zone, so GPU nodes' egress (image pulls
            # from outside ECR, Helm repositories) neither crosses zones nor fails with another zone;
            # the other zones' private subnets route to it. per_zone: one NAT gateway per zone.
            nat_gateways=1 if nat == "gpu_zone" else len(availability_zones),
            nat_gateway_subnets=(
                ec2.SubnetSelection(subnet_group_name="public", availability_zones=[gpu_availability_zone])
                if nat == "gpu_zone"
                else None
            ),
            subnet_configuration=[
                ec2.SubnetConfiguration(
                    name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=PUBLIC_SUBNET_MASK
                ),
                # /19 per AZ: the VPC CNI gives every pod a VPC address.
                ec2.SubnetConfiguration(
                    name="private",
                    subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS,
                    cidr_mask=PRIVATE_SUBNET_MASK,
                ),
            ],
        )
        self.private_subnets = self.vpc.select_subnets(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS).subnets
        self.gpu_subnets = self.vpc.select_subnets(
            subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, availability_zones=[gpu_availability_zone]
        ).subnets

        # Flow logs name every peer the nodes talk to: encrypted with the stack's log key (whose
        # policy lets CloudWatch Logs in this region use it), not only CloudWatch's default encryption.
        flow_logs = logs.LogGroup(
            self,
            "FlowLogs",
            retention=flow_log_retention,
            encryption_key=log_key,
            removal_policy=RemovalPolicy.DESTROY,
        )
        self.vpc.add_flow_log(
            "FlowLog",
            destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_logs),
            traffic_type=ec2.FlowLogTrafficType.ALL,
        )
        self.vpc.add_gateway_endpoint("S3", service=ec2.GatewayVpcEndpointAwsService.S3)
        private = ec2.SubnetSelection(subnets=self.private_subnets)
        for name, service in INTERFACE_ENDPOINTS.items():
            endpoint = self.vpc.add_interface_endpoint(
                name, service=service, subnets=private, private_dns_enabled=True
            )
            nag.acknowledge(endpoint, "EC23", nag.VPC_CIDR_REASON)
