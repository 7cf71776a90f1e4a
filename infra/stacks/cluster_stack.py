"""The one stack `cdk deploy` stands up: network, EKS, GPU node groups, storage, add-ons, K8s objects.

It composes the constructs from typed values of a validated `ClusterConfig`; it reads no context and
no environment. Its outputs (exactly the keys of infra/outputs.py) feed the job tooling.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, cast

import cdk8s
from aws_cdk import Annotations, CfnOutput, Environment, Stack
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam

from nvrx_eks.infra import nag
from nvrx_eks.infra.addons import (
    IMAGE_BY_TAG_WARNING,
    AddonContext,
    deploy_addons,
    pod_identity_principal,
    standard_addons,
)
from nvrx_eks.infra.config import NODE_CHECK_DIGEST_FIX
from nvrx_eks.infra.constructs.cluster import TrainingCluster
from nvrx_eks.infra.constructs.gpu_nodegroup import GpuNodeGroup, Taint
from nvrx_eks.infra.constructs.logging import LogEncryption
from nvrx_eks.infra.constructs.network import Network
from nvrx_eks.infra.constructs.storage import DurableStorage, LustreClientSecurityGroup
from nvrx_eks.infra.outputs import OUTPUT_KEYS
from nvrx_eks.k8s import names
from nvrx_eks.k8s.cluster_chart import ClusterObjectsChart, KueueQuota
from nvrx_eks.k8s.node_verification import NodeCheckSpec
from nvrx_eks.kitcore.configio import UserError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from constructs import Construct, IConstruct

    from nvrx_eks.infra.config import ClusterConfig


class ClusterStack(Stack):
    def __init__(self, scope: Construct, *, config: ClusterConfig, env: Environment) -> None:
        super().__init__(
            scope,
            config.name,
            env=env,
            description="nvrx-eks: EKS for fault-tolerant multi-node GPU training (EFA, FSx for Lustre, S3)",
        )
        self.config = config
        self.logs = LogEncryption(self, "Logs", cluster_name=config.name)
        network = Network(
            self,
            "Network",
            cidr=config.vpc_cidr,
            availability_zones=config.availability_zones,
            gpu_availability_zone=str(config.gpu_availability_zone),
            nat=config.nat,
            log_key=self.logs.key,
        )
        self.network = network
        training = TrainingCluster(
            self,
            "Eks",
            cluster_name=config.name,
            kubernetes_version=config.kubernetes_version,
            support_after_standard=config.support_after_standard,
            vpc=network.vpc,
            subnets=network.private_subnets,
            endpoint_access=config.endpoint_access,
            public_access_cidrs=config.public_access_cidrs,
            api_client_cidrs=config.api_access.cidrs,
            api_client_security_groups=config.api_access.security_group_ids,
            admin_role_arn=config.admin_role_arn,
            admin_principal_arns=config.admin_principal_arns,
            service_cidr=config.service_cidr,
            log_group=self.logs.control_plane,
            system_instance_type=config.system_nodes.instance_type,
            system_min_size=config.system_nodes.min_size,
            system_desired_size=config.system_nodes.desired_size,
            system_max_size=config.system_nodes.max_size,
            system_root_volume_gib=config.system_nodes.root_volume_gib,
        )
        self.training_cluster = training
        cluster = training.cluster
        # The same cluster where an interface is asked for: eks_v2's type stubs leave
        # kubectl_provider_options off Cluster, so the checker does not see that it is one.
        icluster = cast("eks.ICluster", cluster)

        # GPU nodes are the Lustre clients: the file system's servers open connections back to them.
        lustre_clients = LustreClientSecurityGroup(self, "LustreClients", vpc=network.vpc)
        self.gpu_node_groups = [
            GpuNodeGroup(
                self,
                f"Gpu-{group.name}",
                cluster=icluster,
                nodegroup_name=group.name,
                profile=group.profile,
                vpc=network.vpc,
                subnets=network.gpu_subnets,
                node_role=training.node_role,
                cluster_security_group_id=training.cluster_security_group_id,
                extra_security_group_ids=[lustre_clients.security_group_id],
                min_size=group.min_size,
                desired_size=group.desired_size,
                max_size=group.max_size,
                capacity=group.capacity.type,
                reservation_id=group.capacity.reservation_id,
                placement_group=group.placement_group,
                labels=group.labels,
                taints=[Taint(t.key, t.value, t.effect) for t in group.taints],
                root_volume_gib=group.root_volume_gib,
            )
            for group in config.gpu_node_groups
        ]

        storage = DurableStorage(
            self,
            "Storage",
            vpc=network.vpc,
            fsx_subnet=network.gpu_subnets[0],
            # The literal CIDR (not the VPC's token) so the rules are checkable in the template.
            client_cidr=config.vpc_cidr,
            storage_capacity_gib=config.fsx.storage_capacity_gib,
            throughput_per_tib=config.fsx.throughput_per_tib,
            file_system_path=config.fsx.file_system_path,
            data_repository_path=config.fsx.data_repository_path,
            checkpoint_prefix=config.checkpoint_prefix,
            noncurrent_version_days=config.checkpoint_bucket.noncurrent_version_days,
            expire_days=config.checkpoint_bucket.expire_days,
            retain_bucket=config.checkpoint_bucket.retain_on_delete,
            repository_name=config.ecr.repository_name,
            keep_images=config.ecr.keep_images,
        )
        self.storage = storage
        lustre_clients.allow_file_system(storage.security_group)

        addons = deploy_addons(
            AddonContext(
                scope=self,
                cluster=cluster,
                kubernetes_version=config.kubernetes_version,
                node_dependencies=[training.system_nodegroup],
            ),
            standard_addons(
                cloudwatch_observability=config.addons.cloudwatch_observability,
                kueue=config.addons.kueue,
                gpu_taints=self._config_gpu_taints(),
            ),
        )
        self._training_identity(icluster)
        self._cluster_objects(cluster, addons)
        self._outputs()
        # Last: access logs are let in only once everything else exists, so a failed create's rollback
        # finds the log bucket empty and deletes it (DurableStorage.deliver_access_logs_after).
        storage.deliver_access_logs_after(
            *(child for child in self.node.children if child is not storage),
            *(child for child in storage.node.children if child is not storage.access_logs),
        )

    def _config_gpu_taints(self) -> tuple[tuple[str, str], ...]:
        """(key, effect) of every taint the config adds to a GPU group: the kit's GPU DaemonSets
        (device plugins, DCGM exporter, node check) tolerate them, or the nodes never advertise GPUs."""
        taints = ((t.key, t.effect) for g in self.config.gpu_node_groups for t in g.taints)
        return tuple(dict.fromkeys(taints))

    def _training_identity(self, cluster: eks.ICluster) -> None:
        """The training service account's Pod Identity: the checkpoint prefix of the bucket, nothing else."""
        training = self.config.training
        self.training_role = eks_pod_identity_role(
            self,
            "TrainingRole",
            cluster=cluster,
            namespace=training.namespace,
            service_account=training.service_account,
        )
        self.storage.grant_checkpoint_prefix(self.training_role)
        nag.acknowledge(
            self.training_role,
            "IAM5",
            "object access is scoped to the checkpoint prefix of the checkpoint bucket, by design",
            finding=nag.arn_finding(self.storage.bucket, f"/{self.config.checkpoint_prefix}*"),
        )
        self.training_association = eks.CfnPodIdentityAssociation(
            self,
            "TrainingPodIdentity",
            cluster_name=cluster.cluster_name,
            namespace=training.namespace,
            service_account=training.service_account,
            role_arn=self.training_role.role_arn,
        )

    def _cluster_objects(self, cluster: eks.Cluster, addons: Mapping[str, IConstruct]) -> None:
        training = self.config.training
        kueue = None
        check = self.config.node_check
        if check.image_tag is None:  # infra/app.py build() resolves it; kept for type checkers
            raise UserError("node_check.image_tag is missing; set the tag `nvrx-eks image push` printed")
        # From the first deploy: the DaemonSet names the image `nvrx-eks image push` will push (the tag
        # of this checkout), and the kubelet keeps retrying the pull until it is there. Its digest exists
        # only once pushed: until the config gives it, the image is pulled by its immutable tag.
        image = f"{self.storage.repository.repository_uri}:{check.image_tag}"
        if check.image_digest is None:
            Annotations.of(self).add_warning_v2(
                IMAGE_BY_TAG_WARNING, f"the node check's image is pulled by tag; {NODE_CHECK_DIGEST_FIX}"
            )
        self.node_check_image = f"{image}@{check.image_digest}" if check.image_digest else image
        node_check = NodeCheckSpec(
            image=self.node_check_image,
            interval_s=check.interval_s,
            local_nvme_path=names.NVME_RAID_ROOT,
            dcgm_host=check.dcgm_host,
            extra_tolerations=self._config_gpu_taints(),
        )
        if self.config.addons.kueue:
            groups = self.config.gpu_node_groups
            kueue = KueueQuota(
                gpus=sum(g.max_size * g.profile.gpus for g in groups),
                efa_devices=sum(g.max_size * g.profile.efa_devices for g in groups),
                cpu=sum(g.max_size * g.profile.vcpus for g in groups),
                memory_gib=sum(g.max_size * g.profile.memory_gib for g in groups),
                verified_nodes_only=True,
            )
        chart = ClusterObjectsChart(
            cdk8s.App(),
            "cluster-objects",
            namespace=training.namespace,
            service_account=training.service_account,
            fsx_file_system_id=self.storage.file_system.file_system_id,
            fsx_dns_name=self.storage.file_system.dns_name,
            fsx_mount_name=self.storage.file_system.mount_name,
            storage_capacity_gib=self.storage.storage_capacity_gib,
            pvc_name=training.pvc_name,
            kueue=kueue,
            node_check=node_check,
            pod_monitors=self.config.addons.prometheus_pod_monitors,
        )
        manifest = cluster.add_cdk8s_chart("ClusterObjects", chart)
        manifest.node.add_dependency(self.training_cluster.system_nodegroup)
        for name in ("aws-fsx-csi-driver", "kueue"):
            if name in addons:
                manifest.node.add_dependency(addons[name])

    def _outputs(self) -> None:
        config, storage = self.config, self.storage
        values = {
            "ClusterName": self.training_cluster.cluster.cluster_name,
            "Region": self.region,
            "FsxFileSystemId": storage.file_system.file_system_id,
            "FsxDnsName": storage.file_system.dns_name,
            "FsxMountName": storage.file_system.mount_name,
            "CheckpointPvcName": config.training.pvc_name,
            "CheckpointBucketName": storage.bucket.bucket_name,
            "CheckpointPrefix": config.checkpoint_prefix,
            "ImageRepositoryUri": storage.repository.repository_uri,
            "TrainingNamespace": config.training.namespace,
            "TrainingServiceAccount": config.training.service_account,
            "GpuNodeGroups": json.dumps(
                {group.nodegroup_name: group.profile.name for group in self.gpu_node_groups}, sort_keys=True
            ),
            "AdminRoleArn": self.training_cluster.admin_role.role_arn,
            "NodeCheckImage": self.node_check_image,
        }
        for key in OUTPUT_KEYS:
            CfnOutput(self, key, value=values[key])


def eks_pod_identity_role(
    scope: Construct,
    id: str,  # noqa: A002
    *,
    cluster: eks.ICluster,
    namespace: str,
    service_account: str,
) -> iam.Role:
    return iam.Role(
        scope,
        id,
        assumed_by=pod_identity_principal(cluster, namespace=namespace, service_account=service_account),
        description="nvrx-eks training pods: the checkpoint prefix of the checkpoint bucket",
    )
