"""The EKS control plane (aws_eks_v2: native AWS::EKS::Cluster, access entries) and its system nodes."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Literal, cast

from aws_cdk import Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk.lambda_layer_kubectl_v36 import KubectlV36Layer
from constructs import Construct

from nvrx_eks.infra import nag
from nvrx_eks.infra.constructs import launch_template as lt
from nvrx_eks.infra.constructs.retention import kept_key
from nvrx_eks.k8s import names

if TYPE_CHECKING:
    from collections.abc import Sequence

    from constructs import IConstruct

EndpointKind = Literal["public", "private", "public_and_private"]

_ENDPOINTS = {
    "public": eks.EndpointAccess.PUBLIC,
    "private": eks.EndpointAccess.PRIVATE,
    "public_and_private": eks.EndpointAccess.PUBLIC_AND_PRIVATE,
}
# https://docs.aws.amazon.com/eks/latest/userguide/create-node-role.html
NODE_MANAGED_POLICIES = (
    "AmazonEKSWorkerNodePolicy",
    "AmazonEC2ContainerRegistryPullOnly",
    "AmazonEKS_CNI_Policy",
    "AmazonSSMManagedInstanceCore",
)
SYSTEM_LABEL = "nvrx-eks/pool"


class TrainingCluster(Construct):
    """EKS with KMS-encrypted secrets, all control-plane logs, access entries and a system node group."""

    def __init__(
        self,
        scope: Construct,
        id: str,  # noqa: A002
        *,
        cluster_name: str,
        kubernetes_version: str,
        support_after_standard: str = "upgrade",
        vpc: ec2.IVpc,
        subnets: Sequence[ec2.ISubnet],
        endpoint_access: EndpointKind,
        public_access_cidrs: Sequence[str],
        api_client_cidrs: Sequence[str] = (),
        api_client_security_groups: Sequence[str] = (),
        admin_role_arn: str | None,
        admin_principal_arns: Sequence[str] = (),
        service_cidr: str | None = None,
        log_group: IConstruct | None = None,
        system_instance_type: str,
        system_min_size: int,
        system_desired_size: int,
        system_max_size: int,
        system_root_volume_gib: int,
    ) -> None:
        super().__init__(scope, id)
        self.secrets_key = kept_key(
            self, "SecretsKey", description=f"{cluster_name}: envelope encryption of Kubernetes secrets"
        )
        endpoint = _ENDPOINTS[endpoint_access]
        if endpoint_access != "private":
            endpoint = endpoint.only_from(*public_access_cidrs)
        # The kubectl/helm handler runs inside the VPC (private subnets, below), so it reaches the
        # private endpoint: the default config keeps the API off the internet altogether.
        self.kubectl_security_group = ec2.SecurityGroup(
            self, "KubectlSecurityGroup", vpc=vpc, description="kubectl handler (Helm charts, manifests)"
        )
        self.cluster = eks.Cluster(
            self,
            "Cluster",
            cluster_name=cluster_name,
            version=eks.KubernetesVersion.of(kubernetes_version),
            service_ipv4_cidr=service_cidr,
            vpc=vpc,
            vpc_subnets=[ec2.SubnetSelection(subnets=list(subnets))],
            endpoint_access=endpoint,
            secrets_encryption_key=self.secrets_key,
            cluster_logging=list(eks.ClusterLoggingTypes),
            default_capacity_type=eks.DefaultCapacityType.NODEGROUP,
            default_capacity=0,
            # Only explicit access entries: the CloudFormation execution role needs no cluster rights.
            bootstrap_cluster_creator_admin_permissions=False,
            kubectl_provider_options=eks.KubectlProviderOptions(
                # kubectl 1.36 is within kubectl's one-minor skew of every supported cluster version
                # (infra/cluster_pins.py KUBECTL_LAYER_MINOR).
                kubectl_layer=KubectlV36Layer(self, "KubectlLayer"),
                private_subnets=list(subnets),
                security_groups=[self.kubectl_security_group],
            ),
            output_config_command=False,
        )
        # The upgrade policy, stated (EKS's own default is extended support, billed as such):
        # https://docs.aws.amazon.com/eks/latest/userguide/view-upgrade-policy.html
        cfn_cluster = self.cluster.node.default_child
        cfn_cluster.add_property_override(  # type: ignore[union-attr]
            "UpgradePolicy.SupportType", "EXTENDED" if support_after_standard == "extended" else "STANDARD"
        )
        if log_group is not None:
            # EKS creates /aws/eks/<name>/cluster itself unless it exists: the declared group (with
            # retention and a key) must be there first.
            self.cluster.node.add_dependency(log_group)
        self.cluster.cluster_security_group.add_ingress_rule(
            self.kubectl_security_group, ec2.Port.tcp(443), "kubectl handler to the API endpoint"
        )
        # The private endpoint's network interfaces carry the cluster security group: a caller outside
        # it (a bastion, a VPN, a connected network) needs its own 443 rule, inside the VPC or not.
        # https://docs.aws.amazon.com/eks/latest/userguide/cluster-endpoint.html
        for block in api_client_cidrs:
            self.cluster.cluster_security_group.add_ingress_rule(
                ec2.Peer.ipv4(block), ec2.Port.tcp(443), f"API clients in {block} (api_access.cidrs)"
            )
        for group in api_client_security_groups:
            self.cluster.cluster_security_group.add_ingress_rule(
                ec2.Peer.security_group_id(group),
                ec2.Port.tcp(443),
                f"API clients in {group} (api_access.security_group_ids)",
            )

        self.admin_role = (
            iam.Role.from_role_arn(self, "AdminRole", admin_role_arn, mutable=False)
            if admin_role_arn
            else iam.Role(
                self,
                "AdminRole",
                assumed_by=_admin_principal(admin_principal_arns),
                description=f"{cluster_name}: cluster administrators (assume it, then update-kubeconfig)",
            )
        )
        self.cluster.grant_access(
            "Admin",
            self.admin_role.role_arn,
            [
                eks.AccessPolicy.from_access_policy_name(
                    "AmazonEKSClusterAdminPolicy", access_scope_type=eks.AccessScopeType.CLUSTER
                )
            ],
        )

        self.node_role = iam.Role(
            self,
            "NodeRole",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            managed_policies=[
                iam.ManagedPolicy.from_aws_managed_policy_name(n) for n in NODE_MANAGED_POLICIES
            ],
        )
        system_template = ec2.CfnLaunchTemplate(
            self,
            "SystemLaunchTemplate",
            launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
                metadata_options=lt.imds_options(lt.IMDS_HOP_LIMIT),
                block_device_mappings=[lt.root_volume(system_root_volume_gib)],
            ),
        )
        self.system_nodegroup = self.cluster.add_nodegroup_capacity(
            "System",
            nodegroup_name=names.SYSTEM_NODEGROUP,
            instance_types=[ec2.InstanceType(system_instance_type)],
            ami_type=eks.NodegroupAmiType.AL2023_X86_64_STANDARD,
            min_size=system_min_size,
            desired_size=system_desired_size,
            max_size=system_max_size,
            node_role=self.node_role,
            subnets=ec2.SubnetSelection(subnets=list(subnets)),
            launch_template_spec=eks.LaunchTemplateSpec(
                id=system_template.ref, version=system_template.attr_latest_version_number
            ),
            labels={SYSTEM_LABEL: names.SYSTEM_NODEGROUP},
            enable_node_auto_repair=True,
            # Drain through PodDisruptionBudgets (Kueue's, coredns'), never past them.
            # https://docs.aws.amazon.com/eks/latest/userguide/managed-node-update-behavior.html
            force_update=False,
        )

        self._acknowledge()

    def _acknowledge(self) -> None:
        nag.acknowledge(
            self.cluster.role,
            "IAM4",
            "EKS requires AmazonEKSClusterPolicy on the cluster role",
            finding=nag.managed_policy_finding("AmazonEKSClusterPolicy"),
        )
        for name in NODE_MANAGED_POLICIES:
            nag.acknowledge(
                self.node_role,
                "IAM4",
                "the node policies EKS documents for managed node groups (create-node-role.html)",
                finding=nag.managed_policy_finding(name),
            )
        provider = self.cluster.node.find_child("KubectlProvider")
        handler = provider.node.find_child("Handler")
        for policy in (
            "service-role/AWSLambdaBasicExecutionRole",
            "service-role/AWSLambdaVPCAccessExecutionRole",
            "AmazonEC2ContainerRegistryReadOnly",
        ):
            nag.acknowledge(provider, "IAM4", nag.HANDLER_REASON, finding=nag.managed_policy_finding(policy))
        # The ECR-public policy is attached through a condition; cdk-nag names the finding by its JSON.
        nag.acknowledge(
            provider,
            "IAM4",
            nag.HANDLER_REASON,
            finding=_conditional_ecr_public_finding(cast("Construct", handler)),
        )
        nag.acknowledge(provider, "L1", nag.HANDLER_REASON)
        nag.acknowledge(provider, "IAM5", nag.HANDLER_REASON, finding=nag.arn_finding(handler, ":*"))

    @property
    def cluster_security_group_id(self) -> str:
        return self.cluster.cluster_security_group_id


def _admin_principal(arns: Sequence[str]) -> iam.IPrincipal:
    """Who may assume the created admin role.

    With admin_principal_arns: exactly those roles/users. Without: the account, which in IAM means
    no one by default: a principal of the account can assume the role only if its own identity policy
    allows sts:AssumeRole on it, so the account's IAM administrators decide who administers the
    cluster (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_elements_principal.html#principal-accounts).
    Narrow it with admin_principal_arns, or bring your own role with admin_role_arn.
    """
    if not arns:
        return iam.AccountRootPrincipal()
    principals = [iam.ArnPrincipal(arn) for arn in arns]
    return principals[0] if len(principals) == 1 else iam.CompositePrincipal(*principals)


def _conditional_ecr_public_finding(handler: Construct) -> str:
    stack = Stack.of(handler)
    condition = stack.resolve(stack.get_logical_id(handler.node.find_child("HasEcrPublic")))  # type: ignore[arg-type]
    policy = {
        "Fn::If": [
            condition,
            {
                "Fn::Join": [
                    "",
                    [
                        "arn:",
                        {"Ref": "AWS::Partition"},
                        ":iam::aws:policy/AmazonElasticContainerRegistryPublicReadOnly",
                    ],
                ]
            },
            {"Ref": "AWS::NoValue"},
        ]
    }
    return "Policy::" + json.dumps(policy, separators=(",", ":"))
