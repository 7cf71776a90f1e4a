"""Construct by construct, inside bare stacks: the synthesized resources carry the intent."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest
from aws_cdk import App, Environment, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk.assertions import Annotations, Match, Template

from nvrx_eks.infra import cluster_pins
from nvrx_eks.infra.addons import (
    IMAGE_BY_TAG_WARNING,
    KUEUE_VALUES,
    AddonContext,
    AddonError,
    HelmAddon,
    ManagedAddon,
    deploy_addons,
    standard_addons,
)
from nvrx_eks.infra.app import FEATURE_FLAGS
from nvrx_eks.infra.constructs.gpu_nodegroup import GpuNodeGroup
from nvrx_eks.infra.constructs.launch_template import IMDS_HOP_LIMIT
from nvrx_eks.infra.constructs.storage import DurableStorage
from nvrx_eks.kitcore import pins
from nvrx_eks.kitcore.profiles import get_profile

ENV = Environment(account="111111111111", region="us-east-1")
BLOCK = "cr-0123456789abcdef0"
RESERVATION = "cr-0fedcba9876543210"


def _base(stack: Stack) -> tuple[ec2.Vpc, eks.ICluster, iam.Role]:
    vpc = ec2.Vpc(stack, "Vpc", availability_zones=["us-east-1a", "us-east-1b"], nat_gateways=1)
    cluster = eks.Cluster.from_cluster_attributes(stack, "Cluster", cluster_name="test", vpc=vpc)
    role = iam.Role(stack, "NodeRole", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"))
    return vpc, cluster, role


@pytest.fixture(scope="module")
def nodegroups() -> Template:
    """One stack with a node group per capacity kind and instance family."""
    stack = Stack(App(), "NodeGroups", env=ENV)
    vpc, cluster, role = _base(stack)
    common = {
        "cluster": cluster,
        "vpc": vpc,
        "subnets": vpc.private_subnets[:1],
        "node_role": role,
        "cluster_security_group_id": "sg-0cluster",
    }
    groups = [
        ("p5-block", "p5.48xlarge", {"capacity": "capacity_block", "reservation_id": BLOCK}),
        ("p5en-odcr", "p5en.48xlarge", {"capacity": "capacity_reservation", "reservation_id": RESERVATION}),
        ("p4d-pg", "p4d.24xlarge", {"placement_group": True}),
        ("g6-dev", "g6.8xlarge", {}),
    ]
    for name, instance_type, extra in groups:
        GpuNodeGroup(
            stack,
            name,
            nodegroup_name=name,
            profile=get_profile(instance_type),
            min_size=0,
            desired_size=2,
            max_size=4,
            **common,
            **extra,
        )
    return Template.from_stack(stack)


def _launch_data(template: Template, nodegroup: str) -> dict:
    nodegroups = template.find_resources("AWS::EKS::Nodegroup", {"Properties": {"NodegroupName": nodegroup}})
    (props,) = [r["Properties"] for r in nodegroups.values()]
    lt_id = props["LaunchTemplate"]["Id"]["Ref"]
    return template.to_json()["Resources"][lt_id]["Properties"]["LaunchTemplateData"]


@pytest.mark.parametrize(
    ("nodegroup", "instance_type"),
    [
        ("p5-block", "p5.48xlarge"),
        ("p5en-odcr", "p5en.48xlarge"),
        ("p4d-pg", "p4d.24xlarge"),
        ("g6-dev", "g6.8xlarge"),
    ],
)
def test_efa_interfaces_follow_the_profile(nodegroups, nodegroup, instance_type):
    profile = get_profile(instance_type)
    interfaces = _launch_data(nodegroups, nodegroup)["NetworkInterfaces"]
    assert len(interfaces) == profile.network_cards + 1
    primary = [i for i in interfaces if (i["NetworkCardIndex"], i["DeviceIndex"]) == (0, 0)]
    assert [i["InterfaceType"] for i in primary] == ["interface"]
    efa = [i for i in interfaces if i["InterfaceType"] == "efa-only"]
    assert len(efa) == profile.efa_devices
    assert sorted(i["NetworkCardIndex"] for i in efa) == list(range(profile.network_cards))
    # Every interface carries the cluster SG and the EFA SG; no subnet (the node group chooses).
    assert all(
        len(i["Groups"]) == 2 and "sg-0cluster" in i["Groups"] and "SubnetId" not in i for i in interfaces
    )


def test_imdsv2_required_with_hop_limit_one(nodegroups):
    for name in ("p5-block", "g6-dev"):
        assert _launch_data(nodegroups, name)["MetadataOptions"] == {
            "HttpEndpoint": "enabled",
            "HttpTokens": "required",
            "HttpPutResponseHopLimit": IMDS_HOP_LIMIT,
        }
    assert IMDS_HOP_LIMIT == 1


def test_user_data_assembles_nvme_into_raid0(nodegroups):
    user_data = _launch_data(nodegroups, "p5-block")["UserData"]["Fn::Base64"]
    assert "Content-Type: application/node.eks.aws" in user_data
    assert "kind: NodeConfig" in user_data
    assert "localStorage:\n      strategy: RAID0" in user_data


def test_capacity_block_market_and_target(nodegroups):
    data = _launch_data(nodegroups, "p5-block")
    assert data["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert data["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": BLOCK}
    }
    assert "Placement" not in data
    nodegroups.has_resource_properties(
        "AWS::EKS::Nodegroup", {"NodegroupName": "p5-block", "CapacityType": "CAPACITY_BLOCK"}
    )


def test_reservation_is_targeted_on_demand(nodegroups):
    data = _launch_data(nodegroups, "p5en-odcr")
    assert (
        data["CapacityReservationSpecification"]["CapacityReservationTarget"]["CapacityReservationId"]
        == RESERVATION
    )
    assert "InstanceMarketOptions" not in data
    assert "Placement" not in data
    nodegroups.has_resource_properties(
        "AWS::EKS::Nodegroup", {"NodegroupName": "p5en-odcr", "CapacityType": "ON_DEMAND"}
    )


def test_placement_group_only_where_asked(nodegroups):
    nodegroups.resource_count_is("AWS::EC2::PlacementGroup", 1)
    nodegroups.has_resource_properties("AWS::EC2::PlacementGroup", {"Strategy": "cluster"})
    assert "Placement" in _launch_data(nodegroups, "p4d-pg")
    assert "Placement" not in _launch_data(nodegroups, "g6-dev")


def test_placement_group_with_reservation_is_refused():
    stack = Stack(App(), "Refused", env=ENV)
    vpc, cluster, role = _base(stack)
    with pytest.raises(ValueError, match="placement group cannot be combined"):
        GpuNodeGroup(
            stack,
            "Bad",
            cluster=cluster,
            nodegroup_name="bad",
            profile=get_profile("p5.48xlarge"),
            vpc=vpc,
            subnets=vpc.private_subnets[:1],
            node_role=role,
            cluster_security_group_id="sg-0cluster",
            min_size=0,
            desired_size=0,
            max_size=1,
            capacity="capacity_block",
            reservation_id=BLOCK,
            placement_group=True,
        )


def test_efa_security_group_allows_all_traffic_to_and_from_itself(nodegroups):
    groups = nodegroups.find_resources(
        "AWS::EC2::SecurityGroup", {"Properties": {"GroupDescription": Match.string_like_regexp("^EFA")}}
    )
    assert len(groups) == 4
    for logical_id, group in groups.items():
        self_ref = {"Fn::GetAtt": [logical_id, "GroupId"]}
        nodegroups.has_resource_properties(
            "AWS::EC2::SecurityGroupIngress",
            {"IpProtocol": "-1", "GroupId": self_ref, "SourceSecurityGroupId": self_ref},
        )
        nodegroups.has_resource_properties(
            "AWS::EC2::SecurityGroupEgress",
            {"IpProtocol": "-1", "GroupId": self_ref, "DestinationSecurityGroupId": self_ref},
        )
        assert "SecurityGroupEgress" not in group["Properties"] or all(
            rule.get("CidrIp") != "0.0.0.0/0" for rule in group["Properties"]["SecurityGroupEgress"]
        )


def test_gpu_nodes_are_tainted_labelled_and_auto_repaired(nodegroups):
    nodegroups.has_resource_properties(
        "AWS::EKS::Nodegroup",
        {
            "NodegroupName": "g6-dev",
            "AmiType": "AL2023_x86_64_NVIDIA",
            "InstanceTypes": ["g6.8xlarge"],
            "NodeRepairConfig": {"Enabled": True},
            "Taints": [{"Key": "nvidia.com/gpu", "Value": "true", "Effect": "NO_SCHEDULE"}],
            "Labels": Match.object_like(
                {"nvrx-eks/gpu": "true", "nvrx-eks/efa": "true", "nvrx-eks/nodegroup": "g6-dev"}
            ),
            "ScalingConfig": {"MinSize": 0, "DesiredSize": 2, "MaxSize": 4},
        },
    )


@pytest.fixture(scope="module")
def storage() -> tuple[Template, DurableStorage]:
    # The construct expects the app's feature flags (log delivery by bucket policy, no ACLs).
    stack = Stack(App(context=FEATURE_FLAGS), "Storage", env=ENV)
    vpc = ec2.Vpc(stack, "Vpc", availability_zones=["us-east-1a", "us-east-1b"], nat_gateways=1)
    built = DurableStorage(
        stack,
        "Storage",
        vpc=vpc,
        fsx_subnet=vpc.private_subnets[0],
        client_cidr="10.0.0.0/16",
        storage_capacity_gib=2400,
        throughput_per_tib=500,
        file_system_path="/durable",
        data_repository_path=None,
        checkpoint_prefix="checkpoints/",
        noncurrent_version_days=30,
        expire_days=None,
        retain_bucket=True,
        repository_name="nvrx-eks/trainer",
        keep_images=30,
    )
    role = iam.Role(stack, "Trainer", assumed_by=iam.ServicePrincipal("pods.eks.amazonaws.com"))
    built.grant_checkpoint_prefix(role)
    return Template.from_stack(stack), built


def _key_ref(template: Template) -> dict:
    (key_id,) = template.find_resources("AWS::KMS::Key")
    return {"Fn::GetAtt": [key_id, "Arn"]}


def test_fsx_is_persistent2_compressed_and_kms_encrypted(storage):
    template, _ = storage
    (key_id,) = template.find_resources("AWS::KMS::Key", {"Properties": {"EnableKeyRotation": True}})
    template.has_resource_properties(
        "AWS::FSx::FileSystem",
        {
            "FileSystemType": "LUSTRE",
            "StorageCapacity": 2400,
            "KmsKeyId": {"Ref": key_id},
            "LustreConfiguration": Match.object_like(
                {
                    "DeploymentType": "PERSISTENT_2",
                    "PerUnitStorageThroughput": 500,
                    "DataCompressionType": "LZ4",
                }
            ),
        },
    )
    for port in (988, 1018):
        template.has_resource_properties(
            "AWS::EC2::SecurityGroupIngress", {"FromPort": port, "IpProtocol": "tcp"}
        )


def test_fsx_links_the_checkpoint_prefix_both_ways(storage):
    template, _ = storage
    (bucket_id,) = template.find_resources(
        "AWS::S3::Bucket", {"Properties": {"VersioningConfiguration": {"Status": "Enabled"}}}
    )
    template.has_resource_properties(
        "AWS::FSx::DataRepositoryAssociation",
        {
            "FileSystemPath": "/durable",
            "DataRepositoryPath": {"Fn::Join": ["", ["s3://", {"Ref": bucket_id}, "/checkpoints/"]]},
            "S3": {
                "AutoExportPolicy": {"Events": ["NEW", "CHANGED", "DELETED"]},
                "AutoImportPolicy": {"Events": ["NEW", "CHANGED", "DELETED"]},
            },
        },
    )


def test_checkpoint_bucket_is_kms_versioned_private_and_tls_only(storage):
    template, _ = storage
    template.has_resource_properties(
        "AWS::S3::Bucket",
        {
            "VersioningConfiguration": {"Status": "Enabled"},
            "BucketEncryption": {
                "ServerSideEncryptionConfiguration": [
                    Match.object_like(
                        {
                            "ServerSideEncryptionByDefault": {
                                "SSEAlgorithm": "aws:kms",
                                "KMSMasterKeyID": _key_ref(template),
                            }
                        }
                    )
                ]
            },
            "PublicAccessBlockConfiguration": {
                "BlockPublicAcls": True,
                "BlockPublicPolicy": True,
                "IgnorePublicAcls": True,
                "RestrictPublicBuckets": True,
            },
            "LifecycleConfiguration": {
                "Rules": Match.array_with(
                    [
                        Match.object_like(
                            {"Prefix": "checkpoints/", "NoncurrentVersionExpiration": {"NoncurrentDays": 30}}
                        )
                    ]
                )
            },
        },
    )
    template.has_resource_properties(
        "AWS::S3::BucketPolicy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        Match.object_like(
                            {"Effect": "Deny", "Condition": {"Bool": {"aws:SecureTransport": "false"}}}
                        )
                    ]
                )
            }
        },
    )


def test_ecr_scans_on_push_with_immutable_tags(storage):
    template, _ = storage
    template.has_resource_properties(
        "AWS::ECR::Repository",
        {
            "ImageScanningConfiguration": {"ScanOnPush": True},
            "ImageTagMutability": "IMMUTABLE",
            "EncryptionConfiguration": {"EncryptionType": "KMS", "KmsKey": _key_ref(template)},
            "LifecyclePolicy": Match.any_value(),
        },
    )


def test_prefix_grant_touches_only_the_checkpoint_prefix(storage):
    template, _ = storage
    (bucket_id,) = template.find_resources(
        "AWS::S3::Bucket", {"Properties": {"VersioningConfiguration": {"Status": "Enabled"}}}
    )
    (policy,) = template.find_resources("AWS::IAM::Policy").values()
    statements = {s["Sid"]: s for s in policy["Properties"]["PolicyDocument"]["Statement"]}
    objects = statements["CheckpointObjects"]
    assert objects["Resource"] == {"Fn::Join": ["", [{"Fn::GetAtt": [bucket_id, "Arn"]}, "/checkpoints/*"]]}
    assert "s3:PutObject" in objects["Action"]
    assert "s3:*" not in objects["Action"]
    listing = statements["CheckpointListing"]
    assert listing["Condition"] == {"StringLike": {"s3:prefix": ["checkpoints/", "checkpoints/*"]}}
    assert (
        statements["CheckpointKeyViaS3"]["Condition"]["StringEquals"]["kms:ViaService"]
        == "s3.us-east-1.amazonaws.com"
    )
    assert len(statements) == 3


def test_addon_with_missing_dependency_fails_at_synth():
    stack = Stack(App(), "Addons", env=ENV)
    cluster = eks.Cluster.from_cluster_attributes(stack, "Cluster", cluster_name="test")
    ctx = AddonContext(scope=stack, cluster=cluster, kubernetes_version="1.35", node_dependencies=[])  # type: ignore[arg-type]
    with pytest.raises(AddonError, match="add-on 'aws-fsx-csi-driver' needs eks-pod-identity-agent"):
        deploy_addons(ctx, [ManagedAddon("aws-fsx-csi-driver", depends_on=("eks-pod-identity-agent",))])
    with pytest.raises(AddonError, match="listed twice"):
        deploy_addons(ctx, [HelmAddon("kueue"), HelmAddon("kueue")])


@pytest.mark.parametrize("kubernetes", cluster_pins.SUPPORTED_KUBERNETES_VERSIONS)
def test_managed_addons_are_pinned_per_kubernetes_version(kubernetes):
    stack = Stack(App(), "Pinned", env=ENV)
    cluster = eks.Cluster.from_cluster_attributes(stack, "Cluster", cluster_name="test")
    ctx = AddonContext(scope=stack, cluster=cluster, kubernetes_version=kubernetes, node_dependencies=[])  # type: ignore[arg-type]
    deploy_addons(ctx, [ManagedAddon("kube-proxy"), ManagedAddon("vpc-cni")])
    template = Template.from_stack(stack)
    template.has_resource_properties(
        "AWS::EKS::Addon",
        {
            "AddonName": "kube-proxy",
            "AddonVersion": cluster_pins.EKS_ADDONS["kube-proxy"].version_for(kubernetes),
            "ResolveConflicts": "OVERWRITE",
        },
    )
    assert json.dumps(template.to_json()).count("eksbuild") == 2


def _helm_charts(stack: Stack) -> Template:
    """Every Helm add-on of the kit's set (Kueue on), with the kit's values, on an imported cluster."""
    kubectl = eks.KubectlProvider.from_kubectl_provider_attributes(
        stack,
        "Kubectl",
        service_token="arn:aws:lambda:us-east-1:111111111111:function:kubectl",  # noqa: S106 - an ARN
    )
    cluster = eks.Cluster.from_cluster_attributes(
        stack, "Cluster", cluster_name="test", kubectl_provider=kubectl
    )
    ctx = AddonContext(scope=stack, cluster=cluster, kubernetes_version="1.35", node_dependencies=[])  # type: ignore[arg-type]
    for addon in standard_addons(cloudwatch_observability=False, kueue=True):
        if isinstance(addon, HelmAddon):
            addon.deploy(ctx)
    return Template.from_stack(stack)


def _chart_values(template: Template) -> dict[str, dict]:
    charts = template.find_resources("Custom::AWSCDK-EKS-HelmChart").values()
    return {c["Properties"]["Chart"]: json.loads(c["Properties"]["Values"]) for c in charts}


def _at(values: dict, dotted: str) -> dict:
    for key in dotted.split("."):
        values = values[key]
    return values


def _charts_with(*, unpublished: tuple[str, ...]) -> dict[str, cluster_pins.ChartPin]:
    """The pinned charts, each image by a digest made up from its reference, except the charts named."""

    def digest(name: str, image: cluster_pins.ChartImage) -> str:
        made_up = f"sha256:{hashlib.sha256(image.reference.encode()).hexdigest()}"
        return pins.UNPUBLISHED_SHA256 if name in unpublished else made_up

    return {
        name: dataclasses.replace(
            chart, images=tuple(dataclasses.replace(i, digest=digest(name, i)) for i in chart.images)
        )
        for name, chart in cluster_pins.HELM_CHARTS.items()
    }


def test_every_helm_chart_is_given_a_digest_for_each_image_it_runs(monkeypatch):
    """The chart values name each image REPOSITORY + TAG@DIGEST, which every pinned chart's template joins
    to REPOSITORY:TAG@DIGEST: the DaemonSets and Deployments pull by digest."""
    monkeypatch.setattr(cluster_pins, "HELM_CHARTS", _charts_with(unpublished=()))
    stack = Stack(App(), "Charts", env=ENV)
    values = _chart_values(_helm_charts(stack))
    assert set(values) == set(cluster_pins.HELM_CHARTS)
    for name, chart in cluster_pins.HELM_CHARTS.items():
        assert chart.images, f"{name}: list the images the chart runs in infra/cluster_pins.py"
        for image in chart.images:
            assert _at(values[name], image.values_key) == {
                "repository": image.repository,
                "tag": f"{image.tag}@{image.digest}",
            }
    # The kit's own values are kept beside the images (Kueue's sit under the same key).
    manager = {k: v for k, v in values["kueue"]["controllerManager"].items() if k != "manager"}
    assert manager == KUEUE_VALUES["controllerManager"]
    Annotations.from_stack(stack).has_no_warning("*", Match.any_value())


def test_a_chart_image_without_a_digest_is_pulled_by_tag_and_synth_warns_naming_image_pin(monkeypatch):
    monkeypatch.setattr(cluster_pins, "HELM_CHARTS", _charts_with(unpublished=("kueue",)))
    stack = Stack(App(), "ByTag", env=ENV)
    values = _chart_values(_helm_charts(stack))
    (image,) = cluster_pins.HELM_CHARTS["kueue"].images
    assert _at(values["kueue"], image.values_key) == {"repository": image.repository, "tag": image.tag}
    (warning,) = Annotations.from_stack(stack).find_warning("*", Match.any_value())
    assert warning.id.endswith("/chart-Kueue")
    message = str(warning.entry.data)
    assert f"kueue: {image.repository}:{image.tag} is pulled by tag" in message
    assert "nvrx-eks image pin" in message
    assert IMAGE_BY_TAG_WARNING in message


def test_admin_role_trust_is_the_named_principals_when_given():
    from nvrx_eks.infra.constructs.cluster import _admin_principal  # noqa: PLC0415

    stack = Stack(App(), "Admin", env=ENV)
    one = "arn:aws:iam::111111111111:role/platform-admins"
    two = "arn:aws:iam::111111111111:user/oncall"
    assert stack.resolve(_admin_principal([one]).policy_fragment.principal_json) == {"AWS": [one]}
    both = stack.resolve(_admin_principal([one, two]).policy_fragment.principal_json)
    assert sorted(both["AWS"]) == sorted([one, two])
    # Without names: the account, i.e. whoever the account's IAM policies allow to assume it.
    root = json.dumps(stack.resolve(_admin_principal([]).policy_fragment.principal_json))
    assert ":root" in root
