"""Cluster configs that would synthesize but that EC2 / EKS / S3 / ECR / Kubernetes reject at deploy
are refused up front: one message naming the field and the fix (exit code 2 in every entry point)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from nvrx_eks.infra.config import ClusterConfig
from nvrx_eks.kitcore.configio import UserError, load_model

CONFIGS = Path(__file__).resolve().parents[2] / "infra" / "configs"


def _load(tmp_path: Path, **patch: object) -> ClusterConfig:
    data = yaml.safe_load((CONFIGS / "default.yaml").read_text())
    data.update(patch)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_model(ClusterConfig, path)


def _group(**fields: object) -> dict[str, object]:
    return {"name": "gpu", "instance_type": "p5.48xlarge", "max_size": 2, **fields}


REFUSED = {
    # Availability zones: format, region, duplicates.
    "zone-id-not-name": (
        {"availability_zones": ["use1-az1", "us-east-1b"]},
        r"availability_zones: 'use1-az1' is not an Availability Zone name; use the region plus a letter",
    ),
    "zone-of-other-region": (
        {"availability_zones": ["us-east-1a", "us-east-2b"]},
        r"availability_zones: us-east-2b is not in region us-east-1",
    ),
    "zone-prefix-of-other-region": (
        # startswith(region) accepted this: us-east-1 is a prefix of us-east-10 style names.
        {"region": "us-east-1", "availability_zones": ["us-east-1a", "us-east-1-bos-1a"]},
        r"availability_zones: 'us-east-1-bos-1a' is not an Availability Zone name",
    ),
    "zone-twice": (
        {"availability_zones": ["us-east-1a", "us-east-1a"]},
        r"availability_zones lists a zone twice",
    ),
    "gpu-zone-malformed": (
        {"gpu_availability_zone": "us-east-1"},
        r"gpu_availability_zone: 'us-east-1' is not an Availability Zone name",
    ),
    # Instance types.
    "system-type-syntax": (
        {"system_nodes": {"instance_type": "m7i-xlarge"}},
        r"system_nodes\.instance_type: 'm7i-xlarge' is not an EC2 instance type name",
    ),
    "system-type-graviton": (
        {"system_nodes": {"instance_type": "m7g.xlarge"}},
        r"system_nodes\.instance_type: m7g\.xlarge is a Graviton \(arm64\) type",
    ),
    # CIDRs.
    "vpc-host-bits": (
        {"vpc_cidr": "10.0.0.1/16"},
        r"vpc_cidr: '10\.0\.0\.1/16' has host bits set; write the network address: 10\.0\.0\.0/16",
    ),
    "vpc-public-range": (
        {"vpc_cidr": "8.8.0.0/16"},
        r"vpc_cidr: 8\.8\.0\.0/16 is not private address space",
    ),
    "vpc-too-small-for-subnets": (
        # /18 passed the old check but cannot hold a /19 private subnet per zone plus the public ones.
        {"vpc_cidr": "10.0.0.0/18"},
        r"vpc_cidr: 10\.0\.0\.0/18 cannot hold a /24 public and a /19 private subnet in each of 2 zones",
    ),
    "vpc-too-small-for-zones": (
        {
            "vpc_cidr": "10.0.0.0/17",
            "availability_zones": ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d"],
        },
        r"vpc_cidr: 10\.0\.0\.0/17 cannot hold .* in each of 4 zones .*use a /16",
    ),
    "service-overlaps-vpc": (
        {"vpc_cidr": "172.20.0.0/16"},
        r"service_cidr: 172\.20\.0\.0/16 overlaps the VPC block 172\.20\.0\.0/16",
    ),
    "service-not-rfc1918": (
        {"service_cidr": "100.64.0.0/16"},
        r"service_cidr: 100\.64\.0\.0/16 is not in 10\.0\.0\.0/8, 172\.16\.0\.0/12 or 192\.168\.0\.0/16",
    ),
    "service-too-small": (
        {"service_cidr": "172.20.0.0/25"},
        r"service_cidr: 172\.20\.0\.0/25 must be between a /12 and a /24 block",
    ),
    "public-cidr-garbage": (
        {"endpoint_access": "public_and_private", "public_access_cidrs": ["office"]},
        r"public_access_cidrs: 'office' is not an IPv4 CIDR block",
    ),
    # Kubernetes label and taint syntax.
    "label-key-syntax": (
        {"gpu_node_groups": [_group(labels={"team name": "a"})]},
        r"gpu_node_groups\.0\.labels: label key 'team name': the name 'team name' must be 1-63",
    ),
    "label-key-prefix": (
        {"gpu_node_groups": [_group(labels={"Example.COM/pool": "a"})]},
        r"label key 'Example\.COM/pool': the prefix 'Example\.COM' must be a lowercase DNS subdomain",
    ),
    "label-value-too-long": (
        {"gpu_node_groups": [_group(labels={"pool": "x" * 64})]},
        r"gpu_node_groups\.0\.labels: 'x{64}' is not a Kubernetes label value: at most 63",
    ),
    "label-reserved": (
        {"gpu_node_groups": [_group(labels={"nvrx-eks/gpu": "false"})]},
        r"label nvrx-eks/gpu is set by the kit on every GPU node",
    ),
    "taint-key-syntax": (
        {"gpu_node_groups": [_group(taints=[{"key": "a/b/c"}])]},
        r"gpu_node_groups\.0\.taints\.0\.key: taint key 'a/b/c' has more than one '/'",
    ),
    "taint-value": (
        {"gpu_node_groups": [_group(taints=[{"key": "dedicated", "value": "-bad-"}])]},
        r"gpu_node_groups\.0\.taints\.0\.value: '-bad-' is not a Kubernetes label value",
    ),
    "taint-effect": (
        {"gpu_node_groups": [_group(taints=[{"key": "dedicated", "effect": "NoScheduling"}])]},
        (
            r"gpu_node_groups\.0\.taints\.0\.effect: Input should be 'NoSchedule', 'PreferNoSchedule' or "
            r"'NoExecute'"
        ),
    ),
    "taint-kit-key": (
        {"gpu_node_groups": [_group(taints=[{"key": "nvidia.com/gpu", "value": "true"}])]},
        r"every GPU node already has the taint nvidia\.com/gpu=true:NoSchedule",
    ),
    # Names the services constrain.
    "ecr-uppercase": (
        {"ecr": {"repository_name": "NVRX/Trainer"}},
        r"ecr\.repository_name: 'NVRX/Trainer' is not an ECR repository name",
    ),
    "ecr-double-separator": (
        {"ecr": {"repository_name": "nvrx--eks//trainer"}},
        r"ecr\.repository_name: 'nvrx--eks//trainer' is not an ECR repository name",
    ),
    "bucket-uppercase": (
        {"fsx": {"data_repository_path": "s3://My_Bucket/ckpt/"}},
        r"fsx\.data_repository_path: 'My_Bucket' is not an S3 bucket name",
    ),
    "bucket-ip": (
        {"fsx": {"data_repository_path": "s3://192.168.1.1/ckpt/"}},
        r"'192\.168\.1\.1' is not an S3 bucket name: not formatted as an IP address",
    ),
    "bucket-dotdot": (
        {"fsx": {"data_repository_path": "s3://my..bucket/"}},
        r"'my\.\.bucket' is not an S3 bucket name: no two adjacent periods \('\.\.'\)",
    ),
    "cluster-name": (
        {"name": "nvrx_eks"},
        r"name: 'nvrx_eks' is not a stack/cluster name",
    ),
    # The API endpoint.
    "public-endpoint-anywhere": (
        {"endpoint_access": "public_and_private", "public_access_cidrs": ["0.0.0.0/0"]},
        (
            r"public_access_cidrs 0\.0\.0\.0/0 opens the Kubernetes API to the whole internet; .*"
            r"allow_public_api_from_anywhere: true"
        ),
    ),
    "public-endpoint-without-cidrs": (
        {"endpoint_access": "public_and_private"},
        r"endpoint_access: public_and_private needs public_access_cidrs",
    ),
    "public-only-endpoint": (
        {"endpoint_access": "public", "public_access_cidrs": ["203.0.113.0/24"]},
        r"endpoint_access: public leaves the in-VPC kubectl handler .* without a private endpoint",
    ),
    "old-nat-field": ({"nat_gateways": 2}, r"nat_gateways was replaced by nat: gpu_zone"),
}


@pytest.mark.parametrize(("patch", "expected"), REFUSED.values(), ids=REFUSED.keys())
def test_deploy_time_rejections_are_refused_with_the_fix(tmp_path, patch, expected):
    with pytest.raises(UserError, match=expected) as info:
        _load(tmp_path, **patch)
    message = str(info.value)
    assert "Traceback" not in message
    assert message.count("\n  - ") == 1, message  # one message for the one bad field


ACCEPTED = {
    "default": {},
    "cgnat-vpc": {"vpc_cidr": "100.64.0.0/16"},
    "three-zones-in-a-17": {
        "vpc_cidr": "10.0.0.0/17",
        "availability_zones": ["us-east-1a", "us-east-1b", "us-east-1c"],
    },
    "flex-system-type": {"system_nodes": {"instance_type": "m7i-flex.xlarge"}},
    "prefixed-labels-and-taints": {
        "gpu_node_groups": [
            _group(
                labels={"example.com/team": "ml-infra", "nvrx-eks/pool": "training", "tier": ""},
                taints=[{"key": "example.com/dedicated", "value": "training", "effect": "NoExecute"}],
            )
        ]
    },
    "office-cidrs": {"endpoint_access": "public_and_private", "public_access_cidrs": ["203.0.113.0/24"]},
    "anywhere-opted-in": {
        "endpoint_access": "public_and_private",
        "public_access_cidrs": ["0.0.0.0/0"],
        "allow_public_api_from_anywhere": True,
    },
    "nat-per-zone": {"nat": "per_zone"},
}


@pytest.mark.parametrize("patch", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_valid_configs_still_load(tmp_path, patch):
    config = _load(tmp_path, **patch)
    assert config.endpoint_access in ("private", "public_and_private")


def test_shipped_configs_keep_the_api_private():
    for name in ("default.yaml", "p5-capacity-block.yaml"):
        config = load_model(ClusterConfig, CONFIGS / name)
        assert config.endpoint_access == "private"
        assert config.public_access_cidrs == []
