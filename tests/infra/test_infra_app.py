"""The whole app, synthesized once per shipped config: the templates are the product."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from aws_cdk import App, Environment, Stack
from aws_cdk import aws_s3 as s3
from aws_cdk.assertions import Match, Template
from cfnlint.api import lint

from infra import app as infra_app
from infra.nag import acknowledge, add_checks
from infra.stacks.cluster_stack import OUTPUT_KEYS
from kitcore import pins
from kitcore.configio import UserError

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "infra" / "configs"


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory) -> dict[str, dict]:
    """Each shipped config synthesized with cdk-nag; an unacknowledged finding fails synthesis here."""
    templates = {}
    for name in ("default", "p5-capacity-block"):
        config = infra_app.load_config(CONFIGS / f"{name}.yaml")
        outdir = tmp_path_factory.mktemp(name)
        app = App(outdir=str(outdir))
        stack = infra_app.build(app, config, account="111111111111")
        assembly = app.synth()
        # Offline: no context lookup left for the CDK CLI to make (it would need credentials).
        assert "missing" not in json.loads((outdir / "manifest.json").read_text())
        templates[name] = assembly.get_stack_by_name(stack.stack_name).template
    return templates


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
            "Version": "1.35",
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
            "AWS::EKS::Addon", {"AddonName": name, "AddonVersion": pins.EKS_ADDONS[name].version_for("1.35")}
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
    assert charts == {name: pin.version for name, pin in pins.HELM_CHARTS.items()}
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
            "Namespace": "training",
            "ServiceAccount": "trainer",
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
    (manifest,) = template.find_resources("Custom::AWSCDK-EKS-KubernetesResource").values()
    text = json.dumps(manifest["Properties"]["Manifest"])
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
    result = subprocess.run(
        [sys.executable, "-m", "infra.app"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert "gpu_node_groups.0.instance_type: unknown instance type 'p9.huge'" in result.stderr
    assert "Traceback" not in result.stderr


def test_node_check_is_deployed_with_the_pushed_image_and_pins_kueue_to_verified_nodes(tmp_path):
    config = infra_app.load_config(
        CONFIGS / "p5-capacity-block.yaml",
        ["node_check.image_tag=abc1234", "addons.prometheus_pod_monitors=true"],
    )
    app = App(outdir=str(tmp_path))
    stack = infra_app.build(app, config, account="111111111111")
    template = Template.from_json(app.synth().get_stack_by_name(stack.stack_name).template)
    (manifest,) = template.find_resources("Custom::AWSCDK-EKS-KubernetesResource").values()
    text = json.dumps(manifest["Properties"]["Manifest"])
    for fragment in (
        '\\"kind\\":\\"DaemonSet\\"',
        '\\"kind\\":\\"ValidatingAdmissionPolicy\\"',
        '\\"kind\\":\\"PodMonitor\\"',
        '\\"grafana_dashboard\\":\\"1\\"',
        ":abc1234",  # the image: the stack's repository URI (a token) + the tag
        '\\"nodeLabels\\":{\\"nvrx-eks/verified\\":\\"true\\"}',
    ):
        assert fragment in text, fragment


def test_a_bad_node_check_image_tag_is_one_message():
    with pytest.raises(UserError, match=r"node_check\.image_tag") as info:
        infra_app.load_config(CONFIGS / "default.yaml", ["node_check.image_tag=no:colons"])
    assert "is not an image tag" in str(info.value)


# -- Hardening (issue 14): what the security and desk reviews asked of the synthesized templates. ----


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
def test_pod_identity_trust_names_this_account_and_cluster(synthesized, name):
    roles = [
        r
        for r in _resources(synthesized[name], "AWS::IAM::Role").values()
        if "pods.eks.amazonaws.com" in json.dumps(r["Properties"]["AssumeRolePolicyDocument"])
    ]
    assert len(roles) == (3 if name == "p5-capacity-block" else 2)  # training, FSx CSI (+ CloudWatch)
    (cluster_id,) = _resources(synthesized[name], "AWS::EKS::Cluster")
    for role in roles:
        (statement,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
        assert sorted(statement["Action"]) == ["sts:AssumeRole", "sts:TagSession"]
        assert statement["Condition"]["StringEquals"]["aws:SourceAccount"] == "111111111111"
        assert statement["Condition"]["ArnEquals"]["aws:SourceArn"] == {"Fn::GetAtt": [cluster_id, "Arn"]}


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
    # The node monitoring agent's dcgm-server is the engine (it feeds node auto-repair) ...
    assert _addon_configuration(template, "eks-node-monitoring-agent") is None
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


def test_addon_pins_cover_every_supported_kubernetes_version():
    assert pins.DEFAULT_KUBERNETES_VERSION in pins.SUPPORTED_KUBERNETES_VERSIONS
    # In EKS standard support on 2026-12-01: 1.34 until 2026-12-02, 1.35 until 2027-03-27.
    assert pins.DEFAULT_KUBERNETES_VERSION == "1.35"
    assert "1.33" not in pins.SUPPORTED_KUBERNETES_VERSIONS
    for pin in pins.EKS_ADDONS.values():
        assert sorted(pin.versions) == sorted(pins.SUPPORTED_KUBERNETES_VERSIONS), pin.name
    for minor in pins.SUPPORTED_KUBERNETES_VERSIONS:
        assert pins.EKS_ADDONS["kube-proxy"].version_for(minor).startswith(f"v{minor}.")


@pytest.mark.slow
def test_npx_cdk_synth_on_a_bad_config_exits_2_with_the_one_message(tmp_path):
    """The documented command, as a user runs it: the CDK CLI alone would exit 1 (infra/cdk-cli.js)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        (CONFIGS / "default.yaml")
        .read_text()
        .replace("repository_name: nvrx-eks/trainer", "repository_name: Bad//Repo")
    )
    env = {
        **os.environ,
        "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1",
        "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
    }
    result = subprocess.run(
        [
            "npx",
            "--no-install",
            "cdk",
            "synth",
            "--quiet",
            "-c",
            f"config={bad}",
            "--output",
            str(tmp_path / "out"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "ecr.repository_name: 'Bad//Repo' is not an ECR repository name" in result.stderr
    assert "Traceback" not in result.stderr
    assert "jsii" not in result.stderr.lower()
