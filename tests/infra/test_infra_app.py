"""The whole app, synthesized once per shipped config: the templates are the product."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from aws_cdk import App, Environment, Stack
from aws_cdk import aws_s3 as s3
from aws_cdk.assertions import Annotations, Match, Template
from cfnlint.api import lint
from children import run_python
from kube_objects import container_images

from nvrx_eks.infra import app as infra_app
from nvrx_eks.infra import cluster_pins
from nvrx_eks.infra.nag import acknowledge, add_checks
from nvrx_eks.infra.revision import image_revision
from nvrx_eks.infra.stacks.cluster_stack import OUTPUT_KEYS
from nvrx_eks.k8s import names
from nvrx_eks.kitcore.configio import UserError

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "infra" / "configs"


@pytest.fixture(scope="module")
def assemblies(tmp_path_factory) -> dict[str, tuple[dict, list[str]]]:
    """Each shipped config synthesized with cdk-nag (an unacknowledged finding fails synthesis here): its
    template and the warnings synth left for the CDK CLI to print."""
    synthesized = {}
    for name in ("default", "p5-capacity-block"):
        config = infra_app.load_config(CONFIGS / f"{name}.yaml")
        outdir = tmp_path_factory.mktemp(name)
        app = App(outdir=str(outdir))
        stack = infra_app.build(app, config, account="111111111111")
        assembly = app.synth()
        # Offline: no context lookup left for the CDK CLI to make (it would need credentials).
        assert "missing" not in json.loads((outdir / "manifest.json").read_text())
        warnings = [
            str(w.entry.data) for w in Annotations.from_stack(stack).find_warning("*", Match.any_value())
        ]
        synthesized[name] = assembly.get_stack_by_name(stack.stack_name).template, warnings
    return synthesized


@pytest.fixture(scope="module")
def synthesized(assemblies) -> dict[str, dict]:
    return {name: template for name, (template, _) in assemblies.items()}


@pytest.fixture(scope="module")
def synthesized_warnings(assemblies) -> dict[str, list[str]]:
    return {name: warnings for name, (_, warnings) in assemblies.items()}


@pytest.mark.parametrize("name", ["default", "p5-capacity-block"])
def test_cfn_lint_reports_no_errors(synthesized, name):
    matches = lint(json.dumps(synthesized[name]), regions=["us-east-1", "us-east-2"])
    errors = [f"{m.rule.id} {m.path}: {m.message}" for m in matches if m.rule.id.startswith("E")]
    assert errors == []


@pytest.mark.parametrize("name", ["default", "p5-capacity-block"])
def test_outputs_are_the_contract(synthesized, name):
    template = synthesized[name]
    assert sorted(template["Outputs"]) == sorted(OUTPUT_KEYS)
    outputs = template["Outputs"]
    assert outputs["CheckpointPrefix"]["Value"] == "checkpoints/"
    assert outputs["TrainingNamespace"]["Value"] == "training"
    assert outputs["CheckpointPvcName"]["Value"] == "fsx-checkpoints"
    expected = {
        "default": {"g6-dev": "g6.8xlarge", "p5-ondemand": "p5.48xlarge"},
        "p5-capacity-block": {"p5-block": "p5.48xlarge"},
    }[name]
    assert json.loads(outputs["GpuNodeGroups"]["Value"]) == expected


def test_cluster_encrypts_secrets_and_logs_the_control_plane(synthesized):
    template = Template.from_json(synthesized["default"])
    template.has_resource_properties(
        "AWS::EKS::Cluster",
        {
            "Name": "nvrx-eks",
            "Version": cluster_pins.DEFAULT_KUBERNETES_VERSION,
            "EncryptionConfig": [{"Provider": {"KeyArn": Match.any_value()}, "Resources": ["secrets"]}],
            "Logging": {
                "ClusterLogging": {
                    "EnabledTypes": Match.array_with(
                        [
                            {"Type": t}
                            for t in ("api", "audit", "authenticator", "controllerManager", "scheduler")
                        ]
                    )
                }
            },
            "AccessConfig": Match.object_like({"BootstrapClusterCreatorAdminPermissions": False}),
        },
    )
    template.has_resource_properties(
        "AWS::EKS::AccessEntry",
        {
            "AccessPolicies": [
                Match.object_like({"PolicyArn": Match.any_value(), "AccessScope": {"Type": "cluster"}})
            ],
            "PrincipalArn": {"Fn::GetAtt": [Match.string_like_regexp("^EksAdminRole"), "Arn"]},
        },
    )


def test_network_has_endpoints_and_flow_logs(synthesized):
    template = Template.from_json(synthesized["default"])
    template.resource_count_is("AWS::EC2::FlowLog", 1)
    services = [
        json.dumps(r["Properties"]["ServiceName"])
        for r in template.find_resources("AWS::EC2::VPCEndpoint").values()
    ]
    for service in ("ecr.api", "ecr.dkr", ".sts", ".logs", "eks-auth", ".ec2", ".s3"):
        assert any(service in s for s in services), service


def test_addons_are_installed_at_pinned_versions(synthesized):
    template = Template.from_json(synthesized["p5-capacity-block"])
    kubernetes = infra_app.load_config(CONFIGS / "p5-capacity-block.yaml").kubernetes_version
    for name in (
        "vpc-cni",
        "coredns",
        "kube-proxy",
        "eks-pod-identity-agent",
        "aws-fsx-csi-driver",
        "eks-node-monitoring-agent",
        "amazon-cloudwatch-observability",
    ):
        template.has_resource_properties(
            "AWS::EKS::Addon",
            {"AddonName": name, "AddonVersion": cluster_pins.EKS_ADDONS[name].version_for(kubernetes)},
        )
    template.has_resource_properties(
        "AWS::EKS::Addon",
        {
            "AddonName": "aws-fsx-csi-driver",
            "PodIdentityAssociations": [
                {"ServiceAccount": "fsx-csi-controller-sa", "RoleArn": Match.any_value()}
            ],
        },
    )
    charts = {
        r["Properties"]["Chart"]: r["Properties"]["Version"]
        for r in template.find_resources("Custom::AWSCDK-EKS-HelmChart").values()
    }
    assert charts == {name: pin.version for name, pin in cluster_pins.HELM_CHARTS.items()}
    # Each chart is given every image it runs, by the digest infra/cluster_pins.py holds (by tag while none).
    for resource in template.find_resources("Custom::AWSCDK-EKS-HelmChart").values():
        values = json.loads(resource["Properties"]["Values"])
        for image in cluster_pins.HELM_CHARTS[resource["Properties"]["Chart"]].images:
            for key in image.values_key.split("."):
                values = values[key]
            assert f"{values['repository']}:{values['tag']}" == image.reference
    efa_plugin = tuple(int(x) for x in charts["aws-efa-k8s-device-plugin"].lstrip("v").split("."))
    assert efa_plugin >= (0, 5, 10)
    # The default config has no Kueue and no CloudWatch add-on.
    default = Template.from_json(synthesized["default"])
    assert "kueue" not in json.dumps(default.find_resources("Custom::AWSCDK-EKS-HelmChart"))
    assert "cloudwatch" not in json.dumps(default.find_resources("AWS::EKS::Addon"))


def test_training_pod_identity_is_scoped_to_the_prefix(synthesized):
    template = Template.from_json(synthesized["default"])
    template.has_resource_properties(
        "AWS::EKS::PodIdentityAssociation",
        {
            "Namespace": names.TRAINING_NAMESPACE,
            "ServiceAccount": names.TRAINING_SERVICE_ACCOUNT,
            "RoleArn": {"Fn::GetAtt": [Match.string_like_regexp("^TrainingRole"), "Arn"]},
        },
    )
    policies = template.find_resources(
        "AWS::IAM::Policy", {"Properties": {"Roles": [{"Ref": Match.string_like_regexp("^TrainingRole")}]}}
    )
    (policy,) = policies.values()
    resources = json.dumps([s["Resource"] for s in policy["Properties"]["PolicyDocument"]["Statement"]])
    assert "/checkpoints/*" in resources
    assert '"*"' not in resources


def test_cluster_objects_chart_is_deployed_with_the_fsx_volume(synthesized):
    template = Template.from_json(synthesized["p5-capacity-block"])
    _, text = _cluster_manifest(template)
    for fragment in (
        '\\"kind\\":\\"Namespace\\"',
        '\\"kind\\":\\"PersistentVolumeClaim\\"',
        "fsx.csi.aws.com",
        '\\"storage\\":\\"4800Gi\\"',
        "LustreMountName",
        '\\"kind\\":\\"ClusterQueue\\"',
        '\\"kind\\":\\"PriorityClass\\"',
    ):
        assert fragment in text, fragment


def test_p5_block_nodes_get_the_full_efa_layout(synthesized):
    template = Template.from_json(synthesized["p5-capacity-block"])
    (data,) = [
        r["Properties"]["LaunchTemplateData"]
        for r in template.find_resources("AWS::EC2::LaunchTemplate").values()
        if "NetworkInterfaces" in r["Properties"]["LaunchTemplateData"]
    ]
    assert sum(i["InterfaceType"] == "efa-only" for i in data["NetworkInterfaces"]) == 32
    assert data["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert data["MetadataOptions"]["HttpPutResponseHopLimit"] == 1
    # System nodes run the rendezvous store: IMDSv2-only and hop limit 1 there too.
    (system,) = [
        r["Properties"]["LaunchTemplateData"]
        for r in template.find_resources("AWS::EC2::LaunchTemplate").values()
        if "NetworkInterfaces" not in r["Properties"]["LaunchTemplateData"]
    ]
    assert system["MetadataOptions"] == {
        "HttpEndpoint": "enabled",
        "HttpTokens": "required",
        "HttpPutResponseHopLimit": 1,
    }
    template.resource_count_is("AWS::EC2::PlacementGroup", 0)
    Template.from_json(synthesized["default"]).resource_count_is("AWS::EC2::PlacementGroup", 2)


def test_nag_fails_synthesis_on_an_unacknowledged_finding(tmp_path):
    app = App(outdir=str(tmp_path))
    stack = Stack(app, "Careless", env=Environment(account="111111111111", region="us-east-1"))
    s3.Bucket(stack, "Open")  # no TLS-only policy, no access logs
    add_checks(app)
    with pytest.raises(RuntimeError, match=r"(?s)AwsSolutions-S1'.*AwsSolutions-S10'"):
        app.synth()


def test_acknowledged_findings_pass_with_their_reasons(tmp_path):
    app = App(outdir=str(tmp_path))
    stack = Stack(app, "Acknowledged", env=Environment(account="111111111111", region="us-east-1"))
    bucket = s3.Bucket(stack, "Open")
    acknowledge(bucket, "S1", "test bucket: no access logs")
    acknowledge(bucket, "S10", "test bucket: never deployed")
    add_checks(app)
    assert "Acknowledged" in [s.stack_name for s in app.synth().stacks]


def test_synth_summary_describes_gpu_groups():
    summary = infra_app.synth_summary(CONFIGS / "p5-capacity-block.yaml")
    assert "stack nvrx-eks-p5" in summary
    assert "p5-block" in summary
    assert "32 EFA" in summary
    assert "capacity_block cr-0123456789abcdef0" in summary


@pytest.mark.parametrize(
    ("context", "message"),
    [
        (
            {"config": str(CONFIGS / "default.yaml"), "fsx.throughput_per_tib": 300},
            "fsx.throughput_per_tib: 300 is not",
        ),
        ({"config": "missing.yaml"}, "missing.yaml: no such file"),
        (
            {"config": str(CONFIGS / "default.yaml"), "kubernetes_version": "1.20"},
            "kubernetes_version: 1.20 is not supported",
        ),
        (
            # A minor EKS has not released yet, or one without pins: the same one message.
            {"config": str(CONFIGS / "default.yaml"), "kubernetes_version": "1.37"},
            "kubernetes_version: 1.37 is not supported",
        ),
    ],
)
def test_app_entry_exits_2_with_one_message(capsys, context, message):
    with pytest.raises(SystemExit) as info:
        infra_app.main(context)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_cdk_app_process_exits_nonzero_without_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        (CONFIGS / "default.yaml").read_text().replace("instance_type: g6.8xlarge", "instance_type: p9.huge")
    )
    env = {
        **os.environ,
        "CDK_CONTEXT_JSON": json.dumps({"config": str(bad)}),
        "CDK_OUTDIR": str(tmp_path / "out"),
    }
    result = run_python("-m", "nvrx_eks.infra.app", timeout=120, cwd=ROOT, env=env)
    assert result.returncode == 2
    assert "gpu_node_groups.0.instance_type: unknown instance type 'p9.huge'" in result.stderr
    assert "Traceback" not in result.stderr


def test_node_check_is_deployed_with_the_pushed_image_and_pins_kueue_to_verified_nodes(tmp_path):
    digest = f"sha256:{hashlib.sha256(b'abc1234').hexdigest()}"
    config = infra_app.load_config(
        CONFIGS / "p5-capacity-block.yaml",
        [
            "node_check.image_tag=abc1234",
            f"node_check.image_digest={digest}",
            "addons.prometheus_pod_monitors=true",
        ],
    )
    app = App(outdir=str(tmp_path))
    stack = infra_app.build(app, config, account="111111111111")
    template = Template.from_json(app.synth().get_stack_by_name(stack.stack_name).template)
    manifest, text = _cluster_manifest(template)
    for fragment in (
        '\\"kind\\":\\"DaemonSet\\"',
        '\\"kind\\":\\"ValidatingAdmissionPolicy\\"',
        '\\"kind\\":\\"PodMonitor\\"',
        '\\"grafana_dashboard\\":\\"1\\"',
        '\\"nodeLabels\\":{\\"nvrx-eks/verified\\":\\"true\\"}',
    ):
        assert fragment in text, fragment
    # Every image of the cluster's own objects: the stack's repository (a token) + the tag, by digest.
    images = container_images(_manifest_objects(manifest))
    assert images
    assert all(image.endswith(f"/TOKEN:abc1234@{digest}") for image in images), images
    warnings = [str(w.entry.data) for w in Annotations.from_stack(stack).find_warning("*", Match.any_value())]
    assert not [w for w in warnings if "node check" in w]


def test_the_node_check_without_its_digest_is_pulled_by_tag_and_synth_warns(synthesized_warnings):
    (warning,) = [w for w in synthesized_warnings["p5-capacity-block"] if "node check" in w]
    assert "pulled by tag" in warning
    assert "-c node_check.image_digest=" in warning


def test_a_node_check_digest_is_of_a_tag_and_a_sha256():
    digest = f"sha256:{hashlib.sha256(b'v1').hexdigest()}"
    with pytest.raises(UserError, match=r"node_check: .*image_digest needs image_tag"):
        infra_app.load_config(CONFIGS / "default.yaml", [f"node_check.image_digest={digest}"])
    with pytest.raises(
        UserError, match=r"node_check\.image_digest: .*is not an image digest: sha256:<64 hex>"
    ):
        infra_app.load_config(
            CONFIGS / "default.yaml", ["node_check.image_tag=v1", "node_check.image_digest=v1"]
        )


def test_a_bad_node_check_image_tag_is_one_message():
    with pytest.raises(UserError, match=r"node_check\.image_tag") as info:
        infra_app.load_config(CONFIGS / "default.yaml", ["node_check.image_tag=no:colons"])
    assert "is not an image tag" in str(info.value)


# -- Hardening: least privilege, encryption and private endpoints in the synthesized templates. -----


def _resources(template: dict, kind: str) -> dict[str, dict]:
    return {k: r for k, r in template["Resources"].items() if r["Type"] == kind}


def _logical_id(template: dict, kind: str, prefix: str) -> str:
    (logical_id,) = [k for k in _resources(template, kind) if k.startswith(prefix)]
    return logical_id


@pytest.mark.parametrize("name", ["default", "p5-capacity-block"])
def test_api_endpoint_is_private_by_default(synthesized, name):
    (cluster,) = _resources(synthesized[name], "AWS::EKS::Cluster").values()
    vpc_config = cluster["Properties"]["ResourcesVpcConfig"]
    assert vpc_config["EndpointPublicAccess"] is False
    assert vpc_config["EndpointPrivateAccess"] is True
    assert cluster["Properties"]["KubernetesNetworkConfig"]["ServiceIpv4Cidr"] == "172.20.0.0/16"


def test_logs_are_encrypted_and_the_control_plane_group_is_declared(synthesized):
    template = synthesized["default"]
    groups = _resources(template, "AWS::Logs::LogGroup")
    assert groups, "no log groups"
    for logical_id, group in groups.items():
        assert "KmsKeyId" in group["Properties"], logical_id
        assert "RetentionInDays" in group["Properties"], logical_id
    (control_plane,) = [
        k for k, g in groups.items() if g["Properties"].get("LogGroupName") == "/aws/eks/nvrx-eks/cluster"
    ]
    (cluster_id,) = _resources(template, "AWS::EKS::Cluster")
    assert control_plane in template["Resources"][cluster_id]["DependsOn"]
    (flow_log,) = _resources(template, "AWS::EC2::FlowLog").values()
    flow_group = flow_log["Properties"]["LogGroupName"]["Ref"]
    assert "KmsKeyId" in groups[flow_group]["Properties"]


@pytest.mark.parametrize("name", ["default", "p5-capacity-block"])
def test_pod_identity_trust_is_the_documented_one_for_one_service_account(synthesized, name):
    """The EKS guide's trust policy (pod-id-role): sts:AssumeRole + sts:TagSession for
    pods.eks.amazonaws.com, restricted by the session tags Pod Identity sets, never by aws:SourceArn."""
    template = synthesized[name]
    roles = {
        k: r
        for k, r in _resources(template, "AWS::IAM::Role").items()
        if "pods.eks.amazonaws.com" in json.dumps(r["Properties"]["AssumeRolePolicyDocument"])
    }
    assert len(roles) == (3 if name == "p5-capacity-block" else 2)  # training, FSx CSI (+ CloudWatch)
    (cluster_id,) = _resources(template, "AWS::EKS::Cluster")
    # Which (namespace, service account) each role is associated with, read from the template.
    associated = {
        a["Properties"]["RoleArn"]["Fn::GetAtt"][0]: (
            a["Properties"]["Namespace"],
            a["Properties"]["ServiceAccount"],
        )
        for a in _resources(template, "AWS::EKS::PodIdentityAssociation").values()
    }
    addon_namespaces = {
        "aws-fsx-csi-driver": "kube-system",
        "amazon-cloudwatch-observability": "amazon-cloudwatch",
    }
    for addon in _resources(template, "AWS::EKS::Addon").values():
        for association in addon["Properties"].get("PodIdentityAssociations", []):
            role = association["RoleArn"]["Fn::GetAtt"][0]
            associated[role] = (
                addon_namespaces[addon["Properties"]["AddonName"]],
                association["ServiceAccount"],
            )
    assert sorted(associated) == sorted(roles)
    for role_id, role in roles.items():
        (statement,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
        assert statement["Principal"] == {"Service": "pods.eks.amazonaws.com"}
        assert sorted(statement["Action"]) == ["sts:AssumeRole", "sts:TagSession"]
        namespace, service_account = associated[role_id]
        assert statement["Condition"] == {
            "StringEquals": {
                "aws:RequestTag/eks-cluster-arn": {"Fn::GetAtt": [cluster_id, "Arn"]},
                "aws:RequestTag/kubernetes-namespace": namespace,
                "aws:RequestTag/kubernetes-service-account": service_account,
            }
        }
        assert "aws:Source" not in json.dumps(statement)


def _addon_configuration(template: dict, addon: str) -> dict | None:
    (resource,) = [
        r for r in _resources(template, "AWS::EKS::Addon").values() if r["Properties"]["AddonName"] == addon
    ]
    raw = resource["Properties"].get("ConfigurationValues")
    return json.loads(raw) if raw else None


def test_vpc_cni_enforces_network_policies(synthesized):
    for template in synthesized.values():
        assert _addon_configuration(template, "vpc-cni") == {"enableNetworkPolicy": "true"}


def test_one_dcgm_engine_per_gpu_node(synthesized):
    template = synthesized["p5-capacity-block"]
    # The node monitoring agent's dcgm-server is the engine (it feeds node auto-repair), and it runs on
    # the tainted GPU nodes: it tolerates every taint (its chart tolerates none by default) ...
    assert _addon_configuration(template, "eks-node-monitoring-agent") == {
        "dcgmAgent": {"tolerations": [{"operator": "Exists"}]}
    }
    # ... the CloudWatch add-on deploys no DCGM exporter (and no Application Signals) ...
    cloudwatch = _addon_configuration(template, "amazon-cloudwatch-observability")
    assert cloudwatch is not None
    kubernetes = cloudwatch["agent"]["config"]["logs"]["metrics_collected"]["kubernetes"]
    assert kubernetes["accelerated_compute_metrics"] is False
    assert "application_signals" not in json.dumps(cloudwatch)
    # ... and dcgm-exporter connects to that engine instead of embedding its own.
    (exporter,) = [
        r
        for r in _resources(template, "Custom::AWSCDK-EKS-HelmChart").values()
        if r["Properties"]["Chart"] == "dcgm-exporter"
    ]
    values = json.loads(exporter["Properties"]["Values"])
    remote = values["arguments"][values["arguments"].index("-r") + 1]
    assert remote == "$(NODE_IP):5555"
    assert {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}} in values[
        "extraEnv"
    ]


def test_kueue_objects_wait_for_a_serving_kueue(synthesized):
    template = synthesized["p5-capacity-block"]
    charts = _resources(template, "Custom::AWSCDK-EKS-HelmChart")
    (kueue_id,) = [k for k, r in charts.items() if r["Properties"]["Chart"] == "kueue"]
    kueue = charts[kueue_id]["Properties"]
    assert kueue["Wait"] is True
    values = json.loads(kueue["Values"])["controllerManager"]
    assert values["replicas"] == 2
    assert values["podDisruptionBudget"] == {"enabled": True, "minAvailable": 1}
    (manifest_id,) = _resources(template, "Custom::AWSCDK-EKS-KubernetesResource")
    assert kueue_id in template["Resources"][manifest_id]["DependsOn"]


def test_capacity_block_instance_type_is_in_the_launch_template(synthesized):
    template = synthesized["p5-capacity-block"]
    (group,) = [
        r
        for r in _resources(template, "AWS::EKS::Nodegroup").values()
        if r["Properties"].get("CapacityType") == "CAPACITY_BLOCK"
    ]
    assert "InstanceTypes" not in group["Properties"]
    template_id = group["Properties"]["LaunchTemplate"]["Id"]["Ref"]
    data = template["Resources"][template_id]["Properties"]["LaunchTemplateData"]
    assert data["InstanceType"] == "p5.48xlarge"
    # On-Demand groups keep the type on the node group and none in the launch template.
    for nodegroup in _resources(synthesized["default"], "AWS::EKS::Nodegroup").values():
        if nodegroup["Properties"]["NodegroupName"] == "system":
            continue
        assert nodegroup["Properties"]["InstanceTypes"]
        lt_id = nodegroup["Properties"]["LaunchTemplate"]["Id"]["Ref"]
        assert (
            "InstanceType"
            not in synthesized["default"]["Resources"][lt_id]["Properties"]["LaunchTemplateData"]
        )


@pytest.mark.parametrize("name", ["default", "p5-capacity-block"])
def test_gpu_nodes_accept_lustre_from_the_file_system(synthesized, name):
    template = synthesized[name]
    fsx_group = _logical_id(template, "AWS::EC2::SecurityGroup", "StorageFsxSecurityGroup")
    clients = _logical_id(template, "AWS::EC2::SecurityGroup", "LustreClients")
    ingress = [
        (r["Properties"].get("FromPort"), r["Properties"].get("ToPort"))
        for r in _resources(template, "AWS::EC2::SecurityGroupIngress").values()
        if r["Properties"]["GroupId"] == {"Fn::GetAtt": [clients, "GroupId"]}
        and r["Properties"].get("SourceSecurityGroupId") == {"Fn::GetAtt": [fsx_group, "GroupId"]}
    ]
    assert sorted(ingress) == [(988, 988), (1018, 1023)]
    for lt in _resources(template, "AWS::EC2::LaunchTemplate").values():
        interfaces = lt["Properties"]["LaunchTemplateData"].get("NetworkInterfaces")
        if interfaces:  # GPU node groups (system nodes use the node group's own security groups)
            for interface in interfaces:
                assert {"Fn::GetAtt": [clients, "GroupId"]} in interface["Groups"]


def test_the_one_nat_gateway_is_in_the_gpu_zone(synthesized):
    template = synthesized["p5-capacity-block"]  # GPU zone us-east-2b, the second zone
    (nat,) = _resources(template, "AWS::EC2::NatGateway").values()
    subnet = template["Resources"][nat["Properties"]["SubnetId"]["Ref"]]
    assert subnet["Properties"]["AvailabilityZone"] == "us-east-2b"


def test_only_kubernetes_versions_in_standard_support_are_offered():
    assert cluster_pins.DEFAULT_KUBERNETES_VERSION in cluster_pins.SUPPORTED_KUBERNETES_VERSIONS
    # Each offered version is in EKS standard support past the day the pins were reviewed
    # (1.34's ended 2026-12-02, before that day: not offered).
    for version in cluster_pins.SUPPORTED_KUBERNETES_VERSIONS:
        assert cluster_pins.STANDARD_SUPPORT_ENDS[version] > cluster_pins.PINS_REVIEWED, version
    assert "1.34" not in cluster_pins.SUPPORTED_KUBERNETES_VERSIONS
    with pytest.raises(UserError, match=r"kubernetes_version: 1\.34 is not supported"):
        infra_app.load_config(CONFIGS / "default.yaml", ['kubernetes_version="1.34"'])


def test_every_addon_pin_names_its_source():
    for pin in cluster_pins.EKS_ADDONS.values():
        assert sorted(pin.versions) == sorted(cluster_pins.SUPPORTED_KUBERNETES_VERSIONS), pin.name
        for minor, pinned in pin.versions.items():
            assert re.fullmatch(r"v\d+\.\d+\.\d+-eksbuild\.\d+", pinned.version), (pin.name, minor)
            assert pinned.source, (pin.name, minor)
            # An unconfirmed pin says so in its source; only preflight's DescribeAddonVersions settles it.
            assert pinned.confirmed or pinned.source.startswith(("https://", "none found")), (pin.name, minor)
    for minor in cluster_pins.SUPPORTED_KUBERNETES_VERSIONS:
        assert cluster_pins.EKS_ADDONS["kube-proxy"].version_for(minor).startswith(f"v{minor}.")


def test_the_default_version_has_the_most_confirmed_pins_of_the_newest():
    def confirmed(minor: str) -> int:
        return sum(pin.versions[minor].confirmed for pin in cluster_pins.EKS_ADDONS.values())

    default = cluster_pins.DEFAULT_KUBERNETES_VERSION
    newer = [v for v in cluster_pins.SUPPORTED_KUBERNETES_VERSIONS if _minor(v) > _minor(default)]
    older = [v for v in cluster_pins.SUPPORTED_KUBERNETES_VERSIONS if _minor(v) < _minor(default)]
    assert all(confirmed(default) >= confirmed(v) for v in older)
    assert all(confirmed(v) < confirmed(default) for v in newer)
    # kubectl within one minor of every offered version.
    assert all(
        abs(_minor(v) - _minor(cluster_pins.KUBECTL_LAYER_MINOR)) <= 1
        for v in cluster_pins.SUPPORTED_KUBERNETES_VERSIONS
    )


def _minor(version: str) -> int:
    return int(version.split(".")[1])


@pytest.mark.parametrize("kubernetes", cluster_pins.SUPPORTED_KUBERNETES_VERSIONS)
def test_a_stack_for_each_offered_version_carries_that_versions_addons(tmp_path, kubernetes):
    config = infra_app.load_config(CONFIGS / "p5-capacity-block.yaml", [f'kubernetes_version="{kubernetes}"'])
    stack = infra_app.build(App(outdir=str(tmp_path)), config, account="111111111111", nag=False)
    template = Template.from_stack(stack)
    template.has_resource_properties("AWS::EKS::Cluster", {"Version": kubernetes})
    addons = {
        resource["Properties"]["AddonName"]: resource["Properties"]["AddonVersion"]
        for resource in template.find_resources("AWS::EKS::Addon").values()
    }
    assert addons == {name: cluster_pins.EKS_ADDONS[name].version_for(kubernetes) for name in addons}
    assert sorted(addons) == sorted(cluster_pins.EKS_ADDONS)


def _npx_cdk(
    *args: str, config: Path, output: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`npx cdk ARGS -c config=CONFIG --output OUTPUT` as a user runs it, with `env` over this
    environment and JSII's warnings about the Node version silenced."""
    return subprocess.run(
        ["npx", "--no-install", "cdk", *args, "-c", f"config={config}", "--output", str(output)],
        cwd=ROOT,
        env={
            **os.environ,
            "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1",
            "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
            **(env or {}),
        },
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.shareable
def test_npx_cdk_synth_on_a_bad_config_exits_2_with_the_one_message(tmp_path):
    """The documented command, as a user runs it: the CDK CLI alone would exit 1 (infra/cdk-cli.js)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        (CONFIGS / "default.yaml")
        .read_text()
        .replace("\naddons:", "\necr:\n  repository_name: Bad//Repo\naddons:")
    )
    result = _npx_cdk("synth", "--quiet", config=bad, output=tmp_path / "out")
    assert result.returncode == 2, result.stderr
    assert "ecr.repository_name: 'Bad//Repo' is not an ECR repository name" in result.stderr
    assert "Traceback" not in result.stderr
    assert "jsii" not in result.stderr.lower()


# -- A first deploy and a first p5 job that work. -------------------------------------------------------


def test_the_node_check_runs_from_the_first_deploy(synthesized):
    """No node_check.image_tag: the DaemonSet names the tag `nvrx-eks image push` gives this checkout,
    so the first deploy already has it (it starts once the image is pushed; no second deploy), and
    Kueue admits to verified nodes only."""
    template = Template.from_json(synthesized["p5-capacity-block"])
    _, text = _cluster_manifest(template)
    assert '\\"kind\\":\\"DaemonSet\\"' in text
    assert f":{image_revision()}" in text
    assert '\\"nodeLabels\\":{\\"nvrx-eks/verified\\":\\"true\\"}' in text


def test_the_node_check_tag_is_the_images_content_tag_unless_given():
    config = infra_app.load_config(CONFIGS / "default.yaml")
    assert infra_app.with_node_check_tag(config).node_check.image_tag == image_revision()
    tagged = infra_app.load_config(CONFIGS / "default.yaml", ["node_check.image_tag=v1"])
    assert infra_app.with_node_check_tag(tagged).node_check.image_tag == "v1"


def test_the_capacity_block_group_is_created_at_zero(synthesized):
    (group,) = [
        r
        for r in _resources(synthesized["p5-capacity-block"], "AWS::EKS::Nodegroup").values()
        if r["Properties"].get("CapacityType") == "CAPACITY_BLOCK"
    ]
    scaling = group["Properties"]["ScalingConfig"]
    assert (scaling["MinSize"], scaling["DesiredSize"], scaling["MaxSize"]) == (0, 0, 2)


@pytest.mark.parametrize("name", ["default", "p5-capacity-block"])
def test_node_group_updates_respect_disruption_budgets(synthesized, name):
    groups = _resources(synthesized[name], "AWS::EKS::Nodegroup")
    assert groups
    for logical_id, group in groups.items():
        assert group["Properties"]["ForceUpdateEnabled"] is False, logical_id
        if group["Properties"]["NodegroupName"] != "system":
            assert group["Properties"]["UpdateConfig"] == {"MaxUnavailable": 1}, logical_id


def test_system_nodes_have_room_for_the_training_image_the_store_runs(synthesized):
    template = synthesized["default"]
    (system,) = [
        r
        for r in _resources(template, "AWS::EKS::Nodegroup").values()
        if r["Properties"]["NodegroupName"] == "system"
    ]
    launch_template = template["Resources"][system["Properties"]["LaunchTemplate"]["Id"]["Ref"]]
    (root,) = launch_template["Properties"]["LaunchTemplateData"]["BlockDeviceMappings"]
    assert root["Ebs"]["VolumeSize"] >= 100


def test_the_default_job_finds_what_the_default_stack_made(synthesized, tmp_path):
    """The p5 job values, rendered as shipped, against the default stack's template: every name the
    job uses is one the stack creates or outputs."""
    from nvrx_eks.k8s.job_chart import render  # noqa: PLC0415
    from nvrx_eks.k8s.load import load_values  # noqa: PLC0415

    template = synthesized["default"]
    outputs = {key: output["Value"] for key, output in template["Outputs"].items()}
    values = load_values(ROOT / "k8s" / "values" / "p5-2.yaml", [])
    docs = [doc for doc in _render_docs(render, values, tmp_path) if doc]
    (job,) = [d for d in docs if d["kind"] == "Job"]
    (store,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = job["spec"]["template"]["spec"]

    # Namespace, service account (bound to the training role by the stack's Pod Identity association)
    assert {d["metadata"]["namespace"] for d in docs if "namespace" in d["metadata"]} == {
        outputs["TrainingNamespace"]
    }
    assert pod["serviceAccountName"] == outputs["TrainingServiceAccount"]
    (association,) = _resources(template, "AWS::EKS::PodIdentityAssociation").values()
    assert (association["Properties"]["Namespace"], association["Properties"]["ServiceAccount"]) == (
        outputs["TrainingNamespace"],
        outputs["TrainingServiceAccount"],
    )
    # ... which the cluster chart creates, with the PVC and the priority classes the job names.
    (manifest,) = _resources(template, "Custom::AWSCDK-EKS-KubernetesResource").values()
    created = {(o["kind"], o["metadata"]["name"]) for o in _manifest_objects(manifest)}
    for kind, name in (
        ("ServiceAccount", pod["serviceAccountName"]),
        ("PersistentVolumeClaim", outputs["CheckpointPvcName"]),
        ("PriorityClass", pod["priorityClassName"]),
        ("PriorityClass", store["spec"]["template"]["spec"]["priorityClassName"]),
    ):
        assert (kind, name) in created
    claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
    assert claims == {outputs["CheckpointPvcName"]}
    # The GPU node group of the job's instance type, and the system node group the store selects.
    assert values.instance_profile in json.loads(outputs["GpuNodeGroups"]).values()
    nodegroups = {
        r["Properties"]["NodegroupName"] for r in _resources(template, "AWS::EKS::Nodegroup").values()
    }
    store_selector = store["spec"]["template"]["spec"]["nodeSelector"]
    assert store_selector == {"eks.amazonaws.com/nodegroup": "system"}
    assert store_selector["eks.amazonaws.com/nodegroup"] in nodegroups
    # The trainer's AWS SDK gets the stack's region (IMDS is out of the pod's reach).
    (trainer,) = [c for c in pod["containers"] if c["name"] == "trainer"]
    assert {"name": "AWS_REGION", "value": outputs["Region"]} in trainer["env"]
    assert {"name": "AWS_DEFAULT_REGION", "value": outputs["Region"]} in trainer["env"]
    # Every taint of the GPU node groups is tolerated by the job's pods.
    effects = {
        "NO_SCHEDULE": "NoSchedule",
        "PREFER_NO_SCHEDULE": "PreferNoSchedule",
        "NO_EXECUTE": "NoExecute",
    }
    gpu_taints = {
        (taint["Key"], effects[taint["Effect"]])
        for r in _resources(template, "AWS::EKS::Nodegroup").values()
        for taint in r["Properties"].get("Taints", [])
    }
    assert gpu_taints
    tolerated = {(t["key"], t["effect"]) for t in pod["tolerations"] if t.get("operator") == "Exists"}
    assert gpu_taints <= tolerated
    # The node-local tier lies on the NVMe array the stack's node check verifies.
    (node_check,) = [o for o in _manifest_objects(manifest) if o["kind"] == "DaemonSet"]
    (checked,) = [
        Path(v["hostPath"]["path"]).parent
        for v in node_check["spec"]["template"]["spec"]["volumes"]
        if v["name"] == "local-nvme"
    ]
    (local_tier,) = [Path(v["hostPath"]["path"]) for v in pod["volumes"] if v["name"] == "local-nvme"]
    assert local_tier.is_relative_to(checked)
    assert local_tier != checked


def _cluster_manifest(template: Template) -> tuple[dict, str]:
    """The stack's one cdk8s manifest (the cluster objects chart) and its JSON text, which holds each
    object's JSON escaped once more."""
    (manifest,) = template.find_resources("Custom::AWSCDK-EKS-KubernetesResource").values()
    return manifest, json.dumps(manifest["Properties"]["Manifest"])


def _manifest_objects(manifest: dict) -> list[dict]:
    """The Kubernetes objects of a cdk8s chart deployed by the stack: its Fn::Join of JSON text and
    tokens (the FSx ids), with each token read as a placeholder string."""
    joined = manifest["Properties"]["Manifest"]
    parts = joined["Fn::Join"][1] if isinstance(joined, dict) else [joined]
    return json.loads("".join(part if isinstance(part, str) else "TOKEN" for part in parts))


def _render_docs(render, values, out: Path) -> list[dict]:
    import yaml  # noqa: PLC0415

    return [doc for path in render(values, str(out)) for doc in yaml.safe_load_all(Path(path).read_text())]


# -- cdk deploy waits for a recent passing preflight of the same config. --------------------------------


def _gate_config(*overrides: str):
    return infra_app.load_config(CONFIGS / "p5-capacity-block.yaml", list(overrides))


def test_deploy_without_a_passing_preflight_is_refused_before_anything_is_built(
    monkeypatch, tmp_path, capsys
):
    from nvrx_eks.infra import deploy_gate  # noqa: PLC0415

    monkeypatch.setenv(deploy_gate.CDK_COMMAND_ENV, "deploy")
    monkeypatch.setenv(deploy_gate.STATE_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("CDK_DEFAULT_ACCOUNT", "111111111111")
    monkeypatch.setattr(infra_app, "build", lambda *a, **k: pytest.fail("built without a preflight pass"))
    with pytest.raises(SystemExit) as info:
        infra_app.main({"config": str(CONFIGS / "p5-capacity-block.yaml")})
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "cdk deploy refused: no passing preflight is recorded for nvrx-eks-p5" in err
    assert f"run `nvrx-eks preflight -c {CONFIGS / 'p5-capacity-block.yaml'}`" in err
    assert '-c skip_preflight="<why>"' in err
    assert "Traceback" not in err
    # A bare flag is not a reason.
    with pytest.raises(SystemExit):
        infra_app.main({"config": str(CONFIGS / "p5-capacity-block.yaml"), "skip_preflight": "true"})
    assert "-c skip_preflight needs the reason, not a flag" in capsys.readouterr().err


def test_deploy_with_a_reason_to_skip_says_so_and_builds(monkeypatch, tmp_path, capsys):
    from nvrx_eks.infra import deploy_gate  # noqa: PLC0415

    monkeypatch.setenv(deploy_gate.CDK_COMMAND_ENV, "deploy")
    monkeypatch.setenv(deploy_gate.STATE_DIR_ENV, str(tmp_path))
    built = []
    monkeypatch.setattr(infra_app, "build", lambda app, config, **kw: built.append(config.name))
    infra_app.main(
        {"config": str(CONFIGS / "p5-capacity-block.yaml"), "skip_preflight": "block checked by hand"}
    )
    assert built == ["nvrx-eks-p5"]
    assert (
        "deploying nvrx-eks-p5 without a passing preflight: block checked by hand" in capsys.readouterr().err
    )


def test_a_recent_pass_of_the_same_config_and_account_lets_the_deploy_start(tmp_path):
    from datetime import UTC, datetime, timedelta  # noqa: PLC0415

    from nvrx_eks.infra import deploy_gate  # noqa: PLC0415

    passed = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)
    deploy_gate.record_pass(_gate_config(), account="111111111111", now=passed, directory=tmp_path)

    def gate(config, *, account="111111111111", hours=1.0):
        return deploy_gate.require_recent_pass(
            config,
            config_path="p5.yaml",
            account=account,
            now=passed + timedelta(hours=hours),
            directory=tmp_path,
        )

    assert gate(_gate_config()).passed_at == passed
    # The account is compared on its own: `-c account=...` at deploy is the same config.
    assert gate(_gate_config('account="111111111111"')).account == "111111111111"
    with pytest.raises(UserError, match=r"the last passing preflight is 25 h old \(at most 24 h\)"):
        gate(_gate_config(), hours=25)
    with pytest.raises(UserError, match=r"the config changed since preflight passed"):
        gate(_gate_config("fsx.throughput_per_tib=1000"))
    with pytest.raises(
        UserError, match=r"preflight passed for account 111111111111, this deploy targets 2222"
    ):
        gate(_gate_config(), account="222222222222")


@pytest.mark.slow
@pytest.mark.shareable
def test_npx_cdk_deploy_without_a_preflight_pass_exits_2_before_any_aws_call(tmp_path):
    """As a user runs it: infra/cdk-cli.js tells the app it deploys; refused without credentials."""
    no_credentials = {
        "NVRX_EKS_STATE_DIR": str(tmp_path / "state"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_ACCESS_KEY_ID": "",
        "AWS_SECRET_ACCESS_KEY": "",
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
    }
    config = CONFIGS / "p5-capacity-block.yaml"
    result = _npx_cdk("deploy", config=config, output=tmp_path / "out", env=no_credentials)
    assert result.returncode == 2, result.stderr
    assert "cdk deploy refused: no passing preflight is recorded for nvrx-eks-p5" in result.stderr
    assert "Traceback" not in result.stderr


def test_gpu_daemon_sets_tolerate_the_taints_a_config_adds(tmp_path):
    """A config's own GPU taint must not keep the device plugins (the GPUs and EFA devices would never
    be advertised), the DCGM exporter or the node check off its nodes."""
    config_file = tmp_path / "tainted.yaml"
    config_file.write_text(
        (CONFIGS / "p5-capacity-block.yaml")
        .read_text()
        .replace(
            "    labels: {nvrx-eks/pool: training}",
            "    labels: {nvrx-eks/pool: training}\n"
            "    taints: [{key: team.example.com/llm, effect: NoExecute}]",
        )
    )
    config = infra_app.load_config(config_file)
    app = App(outdir=str(tmp_path / "out"))
    stack = infra_app.build(app, config, account="111111111111")
    template = app.synth().get_stack_by_name(stack.stack_name).template
    wanted = {"key": "team.example.com/llm", "operator": "Exists", "effect": "NoExecute"}
    for chart in _resources(template, "Custom::AWSCDK-EKS-HelmChart").values():
        name = chart["Properties"]["Chart"]
        if name in ("nvidia-device-plugin", "aws-efa-k8s-device-plugin", "dcgm-exporter"):
            tolerations = json.loads(chart["Properties"]["Values"])["tolerations"]
            assert wanted in tolerations, name
            assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations, (
                name
            )
    (manifest,) = _resources(template, "Custom::AWSCDK-EKS-KubernetesResource").values()
    (daemon_set,) = [o for o in _manifest_objects(manifest) if o["kind"] == "DaemonSet"]
    assert wanted in daemon_set["spec"]["template"]["spec"]["tolerations"]


@pytest.mark.parametrize("name", ["default", "p5-capacity-block"])
def test_gpu_add_ons_tolerate_the_node_checks_unverified_taint(synthesized, name):
    """A device plugin or the DCGM exporter re-created on a node the node check has not verified yet
    must start there: without them the node's GPUs and EFA devices are never advertised and it stays
    unverified."""
    from nvrx_eks.training.node.nodecheck import UNVERIFIED_TAINT  # noqa: PLC0415

    wanted = {"key": UNVERIFIED_TAINT, "operator": "Exists", "effect": "NoSchedule"}
    charts = {
        chart["Properties"]["Chart"]: json.loads(chart["Properties"]["Values"])
        for chart in _resources(synthesized[name], "Custom::AWSCDK-EKS-HelmChart").values()
    }
    for gpu_add_on in ("nvidia-device-plugin", "aws-efa-k8s-device-plugin", "dcgm-exporter"):
        assert wanted in charts[gpu_add_on]["tolerations"], gpu_add_on


# -- what a failed first deploy leaves, and how the private API is reached -------------------------

# Properties that give a resource a fixed physical name: kept by a Retain policy, it blocks the
# next create of the same stack.
_FIXED_NAMES = ("RepositoryName", "BucketName", "FileSystemName", "AliasName", "RoleName", "LogGroupName")
_RETAINED = frozenset({"Retain", "RetainExceptOnCreate", "Snapshot"})
# Why each kind of retained resource is gone after a failed create's rollback, so that the CDK CLI's
# retry creates the stack anew without a hand: RetainExceptOnCreate deletes it, and its delete works
# only if nothing wrote what the delete refuses to drop. A retained kind without a story here fails
# the test below: say how a failed create leaves none of it, then add it.
_RETRY_STORIES = {
    "AWS::KMS::Key": "deleted (scheduled for deletion) whatever it encrypted",
    "AWS::FSx::FileSystem": "deleted with what it holds",
    "AWS::ECR::Repository": "deleted while it holds no image: only `nvrx-eks image push` writes one",
    "AWS::S3::Bucket": "deleted while empty: a log destination lets delivery in after every other resource",
}
# Where a resource names a bucket that a service delivers into on its own (the delivery's grant is the
# destination's bucket policy).
_LOG_DESTINATIONS = (("AWS::S3::Bucket", ("LoggingConfiguration", "DestinationBucketName")),)


def _references(value: object) -> set[str]:
    """Logical ids a template value refers to (Ref, Fn::GetAtt, ${X} in Fn::Sub)."""
    found: set[str] = set()
    if isinstance(value, dict):
        if "Ref" in value:
            found.add(str(value["Ref"]))
        if "Fn::GetAtt" in value:
            target = value["Fn::GetAtt"]
            found.add(str(target[0] if isinstance(target, list) else target.split(".")[0]))
        if "Fn::Sub" in value:
            text = value["Fn::Sub"][0] if isinstance(value["Fn::Sub"], list) else value["Fn::Sub"]
            found |= {name.split(".")[0] for name in re.findall(r"\$\{([^}!]+)\}", str(text))}
        for item in value.values():
            found |= _references(item)
    elif isinstance(value, list):
        for item in value:
            found |= _references(item)
    return found


def _created_after(resources: dict[str, dict]) -> dict[str, set[str]]:
    """Each resource's transitive dependencies: what CloudFormation creates before it starts it."""
    direct = {
        logical: (set(r.get("DependsOn", [])) | _references(r.get("Properties", {}))) & resources.keys()
        for logical, r in resources.items()
    }
    closed: dict[str, set[str]] = {}

    def visit(logical: str) -> set[str]:
        if logical not in closed:
            closed[logical] = set()
            for dependency in direct[logical]:
                closed[logical] |= {dependency} | visit(dependency)
        return closed[logical]

    for logical in resources:
        visit(logical)
    return closed


def _writes_during_create(resources: dict[str, dict], bucket: str) -> list[str]:
    """The resources whose service delivers into `bucket` on its own (server access logs)."""
    writers = []
    for logical, resource in resources.items():
        for kind, path in _LOG_DESTINATIONS:
            value: object = resource.get("Properties", {}) if resource["Type"] == kind else None
            for key in path:
                value = value.get(key) if isinstance(value, dict) else None
            if value is not None and bucket in _references(value):
                writers.append(logical)
    return writers


def _delivery_grants(resources: dict[str, dict], bucket: str) -> list[str]:
    """The bucket policies of `bucket` (where S3 log delivery is granted, ACLs being off)."""
    return [
        logical
        for logical, r in resources.items()
        if r["Type"] == "AWS::S3::BucketPolicy" and bucket in _references(r["Properties"].get("Bucket"))
    ]


@pytest.mark.parametrize("name", ["default", "p5-capacity-block"])
def test_every_retained_resource_is_gone_after_any_failed_create(synthesized, name):
    """A failed create at any resource F: every resource that may exist by then (all but those that
    need F) is rolled back. A retained one must be deleted by that rollback (RetainExceptOnCreate),
    and deletable then: a bucket that received logs is not, so the grant that lets logs in must not
    exist before F has been created, for every F. Checked over the dependency graph of the template."""
    _check_retained(synthesized[name]["Resources"])


def _check_retained(resources: dict[str, dict]) -> None:
    after = _created_after(resources)
    retained = {k: r for k, r in resources.items() if r.get("DeletionPolicy") in _RETAINED}
    assert retained
    for logical, resource in retained.items():
        kind = resource["Type"]
        assert kind in _RETRY_STORIES, f"{logical}: a retained {kind} with no story of its failed create"
        policy = resource["DeletionPolicy"]
        assert policy == "RetainExceptOnCreate", (
            f"{logical}: {policy} keeps it after a failed create; use RetainExceptOnCreate"
        )
        fixed = [key for key in _FIXED_NAMES if key in resource.get("Properties", {})]
        assert not fixed, f"{logical}: a fixed {fixed} blocks the next create if it outlives the stack"
        if kind != "AWS::S3::Bucket" or not _writes_during_create(resources, logical):
            continue
        grants = _delivery_grants(resources, logical)
        assert grants, f"{logical} receives logs without a bucket policy granting them"
        for failed in resources:
            exists = {other for other in resources if failed not in after[other] and other != failed}
            early = [grant for grant in grants if grant in exists]
            assert not early, (
                f"{logical} may hold access logs when {failed} fails: {early} lets delivery in first, and "
                "the rollback cannot delete a bucket that is not empty"
            )


def test_the_failed_create_check_finds_a_log_grant_made_early():
    """The check above, on a template whose log bucket's grant does not wait: it fails."""
    resources = {
        "Logs": {"Type": "AWS::S3::Bucket", "DeletionPolicy": "RetainExceptOnCreate"},
        "LogsPolicy": {"Type": "AWS::S3::BucketPolicy", "Properties": {"Bucket": {"Ref": "Logs"}}},
        "Data": {
            "Type": "AWS::S3::Bucket",
            "Properties": {"LoggingConfiguration": {"DestinationBucketName": {"Ref": "Logs"}}},
        },
        "Cluster": {"Type": "AWS::EKS::Cluster", "Properties": {}},
    }
    with pytest.raises(AssertionError, match=r"Logs may hold access logs when (Data|Cluster) fails"):
        _check_retained(resources)
    resources["LogsPolicy"]["DependsOn"] = ["Data", "Cluster"]
    _check_retained(resources)
    resources["Queue"] = {"Type": "AWS::SQS::Queue", "DeletionPolicy": "RetainExceptOnCreate"}
    resources["LogsPolicy"]["DependsOn"].append("Queue")
    with pytest.raises(AssertionError, match=r"Queue: a retained AWS::SQS::Queue with no story"):
        _check_retained(resources)


def test_the_private_endpoint_admits_443_from_the_configured_networks_only(tmp_path):
    """EKS admits a bastion, a VPN or a connected network to the private endpoint only through an
    ingress rule of the cluster security group: each api_access entry is one, on 443 alone."""
    overrides = ['api_access={"cidrs": ["10.200.0.0/16"], "security_group_ids": ["sg-0123456789abcdef0"]}']
    config = infra_app.load_config(CONFIGS / "p5-capacity-block.yaml", overrides)
    stack = infra_app.build(App(outdir=str(tmp_path)), config, account="111111111111", nag=False)
    template = Template.from_stack(stack)
    cluster_group = {"Fn::GetAtt": [_logical(template, "AWS::EKS::Cluster"), "ClusterSecurityGroupId"]}
    rules = [
        r["Properties"]
        for r in template.find_resources("AWS::EC2::SecurityGroupIngress").values()
        if r["Properties"]["GroupId"] == cluster_group
    ]
    callers = {
        json.dumps(r.get("CidrIp") or r.get("SourceSecurityGroupId")).strip('"')
        for r in rules
        if (r["IpProtocol"], r["FromPort"], r["ToPort"]) == ("tcp", 443, 443)
    }
    assert {"10.200.0.0/16", "sg-0123456789abcdef0"} <= callers
    assert not [r for r in rules if r.get("CidrIp") and (r["FromPort"], r["ToPort"]) != (443, 443)]
    # Without api_access the shipped config admits no network at all (the nodes and the handler only).
    shipped = Template.from_stack(
        infra_app.build(
            App(outdir=str(tmp_path / "shipped")),
            infra_app.load_config(CONFIGS / "p5-capacity-block.yaml"),
            account="111111111111",
            nag=False,
        )
    )
    assert not [
        r
        for r in shipped.find_resources("AWS::EC2::SecurityGroupIngress").values()
        if "CidrIp" in r["Properties"] and r["Properties"]["GroupId"] == cluster_group
    ]


def _logical(template: Template, kind: str) -> str:
    (logical,) = template.find_resources(kind)
    return logical


@pytest.mark.parametrize("name", ["default", "p5-capacity-block"])
def test_the_admin_role_output_is_the_principal_of_the_admin_access_entry(synthesized, name):
    template = Template.from_json(synthesized[name])
    value = synthesized[name]["Outputs"]["AdminRoleArn"]["Value"]
    template.has_resource_properties(
        "AWS::EKS::AccessEntry",
        {
            "PrincipalArn": value,
            "AccessPolicies": [
                Match.object_like(
                    {
                        "AccessScope": {"Type": "cluster"},
                        "PolicyArn": Match.object_like(
                            {
                                "Fn::Join": [
                                    "",
                                    Match.array_with(
                                        [Match.string_like_regexp("AmazonEKSClusterAdminPolicy")]
                                    ),
                                ]
                            }
                        ),
                    }
                )
            ],
        },
    )


def test_gpu_nodes_give_containers_the_memlock_limit_efa_needs(synthesized):
    import yaml  # noqa: PLC0415

    template = Template.from_json(synthesized["p5-capacity-block"])
    templates = template.find_resources(
        "AWS::EC2::LaunchTemplate",
        {"Properties": {"LaunchTemplateData": {"UserData": Match.any_value()}}},
    )
    assert templates
    for resource in templates.values():
        user_data = resource["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]
        (node_config,) = [
            yaml.safe_load(part.split("---\n", 1)[1])
            for part in user_data.split("--==NVRXEKS==")
            if "application/node.eks.aws" in part
        ]
        rlimits = node_config["spec"]["containerd"]["baseRuntimeSpec"]["process"]["rlimits"]
        memlock = {r["type"]: r for r in rlimits}["RLIMIT_MEMLOCK"]
        assert memlock["soft"] == memlock["hard"] >= 2**60


@pytest.mark.parametrize("name", ["default", "p5-capacity-block"])
def test_the_cluster_states_its_upgrade_policy(synthesized, name):
    # Unset, EKS moves a cluster past standard support into extended support and its pricing.
    Template.from_json(synthesized[name]).has_resource_properties(
        "AWS::EKS::Cluster", {"UpgradePolicy": {"SupportType": "STANDARD"}}
    )


def test_extended_support_is_a_choice_in_the_config(tmp_path):
    config = infra_app.load_config(CONFIGS / "default.yaml", ["support_after_standard=extended"])
    app = App(outdir=str(tmp_path))
    stack = infra_app.build(app, config, account="111111111111", nag=False)
    Template.from_stack(stack).has_resource_properties(
        "AWS::EKS::Cluster", {"UpgradePolicy": {"SupportType": "EXTENDED"}}
    )


@pytest.mark.parametrize("name", ["default", "p5-capacity-block"])
def test_ecr_expires_no_tagged_image_a_deployment_may_still_pull(synthesized, name):
    (repository,) = Template.from_json(synthesized[name]).find_resources("AWS::ECR::Repository").values()
    rules = json.loads(repository["Properties"]["LifecyclePolicy"]["LifecyclePolicyText"])["rules"]
    assert [r["selection"]["tagStatus"] for r in rules] == ["untagged"]


def test_a_capped_ecr_keeps_the_newest_images(tmp_path):
    config = infra_app.load_config(CONFIGS / "default.yaml", ["ecr.keep_images=200"])
    stack = infra_app.build(App(outdir=str(tmp_path)), config, account="111111111111", nag=False)
    (repository,) = Template.from_stack(stack).find_resources("AWS::ECR::Repository").values()
    rules = json.loads(repository["Properties"]["LifecyclePolicy"]["LifecyclePolicyText"])["rules"]
    assert rules[1]["selection"] == {
        "tagStatus": "any",
        "countType": "imageCountMoreThan",
        "countNumber": 200,
    }


def test_a_template_synthesized_without_a_pass_is_refused_by_cloudformation(monkeypatch, tmp_path):
    """Every deploy path checks the gate: the CDK CLI run directly (no wrapper tells the app it deploys)
    or `cdk deploy --app cdk.out` deploys a template that carries a rule CloudFormation evaluates
    before it creates anything."""
    import functools  # noqa: PLC0415
    from datetime import UTC, datetime  # noqa: PLC0415

    import aws_cdk  # noqa: PLC0415

    from nvrx_eks.infra import deploy_gate  # noqa: PLC0415

    monkeypatch.delenv(deploy_gate.CDK_COMMAND_ENV, raising=False)
    monkeypatch.setenv(deploy_gate.STATE_DIR_ENV, str(tmp_path / "state"))
    monkeypatch.setenv("CDK_DEFAULT_ACCOUNT", "111111111111")
    config = str(CONFIGS / "p5-capacity-block.yaml")

    def synth(outdir: Path) -> dict:
        monkeypatch.setattr(aws_cdk, "App", functools.partial(App, outdir=str(outdir)))
        infra_app.main({"config": config})
        return json.loads((outdir / "nvrx-eks-p5.template.json").read_text())

    refused = synth(tmp_path / "no-pass")
    (assertion,) = refused["Rules"][deploy_gate.GATE_RULE]["Assertions"]
    assert assertion["Assert"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": deploy_gate.GATE_PARAMETER}, "none"]}]}
    assert refused["Parameters"][deploy_gate.GATE_PARAMETER]["Default"] == "none"
    assert "no passing preflight is recorded for nvrx-eks-p5" in assertion["AssertDescription"]
    assert f"nvrx-eks preflight -c {config}" in assertion["AssertDescription"]
    errors = [m for m in lint(json.dumps(refused), regions=["us-east-2"]) if m.rule.id.startswith("E")]
    assert errors == []

    deploy_gate.record_pass(
        _gate_config(), account="111111111111", now=datetime.now(UTC), directory=tmp_path / "state"
    )
    admitted = synth(tmp_path / "pass")
    assert deploy_gate.GATE_RULE not in admitted.get("Rules", {})
    assert deploy_gate.GATE_PARAMETER not in admitted.get("Parameters", {})
