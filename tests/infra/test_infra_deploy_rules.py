"""Configs that validated but failed at deploy or on the node: refused at synth, with the field and the fix.

Each rule is what EC2/EKS refuse (infra/config.py cites the documentation): a VPC block outside /16
to /28, an instance type EC2 does not know, a second node group named like the kit's system group;
and a node-local checkpoint tier off the NVMe array of an EC2 profile (k8s/values.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aws_cdk import App

from nvrx_eks.infra import app as infra_app
from nvrx_eks.infra.config import SYSTEM_NODEGROUP_NAME, ec2_instance_types
from nvrx_eks.k8s.load import load_values
from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.kitcore.profiles import PROFILES

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "infra" / "configs" / "default.yaml"
P5_VALUES = ROOT / "k8s" / "values" / "p5-2.yaml"
LOCAL_VALUES = ROOT / "k8s" / "values" / "local-cpu.yaml"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["system_nodes.instance_type=m7i.xlarg"], "'m7i.xlarg' is not an EC2 instance type (did you mean"),
        (["system_nodes.instance_type=m7j.xlarge"], "did you mean m7i.xlarge"),
        (["vpc_cidr=10.0.0.0/8"], "vpc_cidr: 10.0.0.0/8 is a /8; a VPC block is a /16 to a /28 (EC2"),
        (["vpc_cidr=10.0.0.0/29"], "vpc_cidr: 10.0.0.0/29 is a /29; a VPC block is a /16 to a /28"),
        (
            ["gpu_node_groups=[{name: system, instance_type: g6.8xlarge}]"],
            "gpu_node_groups.0.name: 'system' is the name of the kit's own node group",
        ),
    ],
)
def test_a_config_the_deploy_would_refuse_is_refused_at_synth(overrides, message):
    with pytest.raises(UserError) as info:
        infra_app.load_config(DEFAULT, overrides)
    assert message in str(info.value)


@pytest.mark.parametrize("name", [n for n, p in PROFILES.items() if p.is_ec2])
def test_every_ec2_profile_is_a_type_ec2_knows(name):
    assert name in ec2_instance_types()


def test_the_shipped_configs_still_load():
    for path in (ROOT / "infra" / "configs").glob("*.yaml"):
        infra_app.load_config(path)


@pytest.mark.slow
@pytest.mark.shareable
def test_the_system_node_group_is_named_as_the_config_reserves(tmp_path):
    """The synthesized template names the add-on node group SYSTEM_NODEGROUP_NAME, and no GPU group."""
    config = infra_app.load_config(DEFAULT)
    app = App(outdir=str(tmp_path))
    stack = infra_app.build(app, config, account="111111111111", nag=False)
    template = app.synth().get_stack_by_name(stack.stack_name).template
    names = [
        r["Properties"].get("NodegroupName")
        for r in template["Resources"].values()
        if r["Type"] == "AWS::EKS::Nodegroup"
    ]
    assert SYSTEM_NODEGROUP_NAME in names, json.dumps(names)
    assert sorted(names) == sorted([SYSTEM_NODEGROUP_NAME, *(g.name for g in config.gpu_node_groups)])


@pytest.mark.parametrize("path", ["/data/ckpt", "/mnt/ckpt", "/var/lib/nvrx"])
def test_a_local_tier_off_the_nvme_array_is_refused_on_ec2(path):
    with pytest.raises(UserError) as info:
        load_values(P5_VALUES, [f"storage.local_nvme_path={path}"])
    message = str(info.value)
    assert f"storage.local_nvme_path {path} is not on the NVMe array of p5.48xlarge" in message
    assert "/mnt/k8s-disks/0/nvrx-checkpoints" in message


def test_a_local_run_keeps_its_local_tier_anywhere():
    values = load_values(LOCAL_VALUES, ["storage.local_nvme_path=/tmp/nvrx-local"])
    assert values.storage.local_nvme_path == "/tmp/nvrx-local"
