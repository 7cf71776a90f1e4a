"""Cluster config validation: every bad input gives one message naming the field and the fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from nvrx_eks.infra import cluster_pins
from nvrx_eks.infra.app import overrides_from_context
from nvrx_eks.infra.config import ClusterConfig
from nvrx_eks.kitcore.configio import UserError, load_model

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "infra" / "configs"


def _load(tmp_path: Path, overrides: list[str] | None = None, **patch: object) -> ClusterConfig:
    data = yaml.safe_load((CONFIGS / "default.yaml").read_text())
    data.update(patch)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_model(ClusterConfig, path, overrides or [])


def _group(**fields: object) -> dict[str, object]:
    return {
        "name": "gpu",
        "instance_type": "p5.48xlarge",
        "min_size": 0,
        "desired_size": 1,
        "max_size": 2,
        **fields,
    }


@pytest.mark.parametrize("name", ["default.yaml", "p5-capacity-block.yaml"])
def test_shipped_configs_are_valid(name):
    config = load_model(ClusterConfig, CONFIGS / name)
    assert config.gpu_availability_zone in config.availability_zones


def test_capacity_block_config_targets_its_block():
    config = load_model(ClusterConfig, CONFIGS / "p5-capacity-block.yaml")
    (group,) = config.gpu_node_groups
    assert (group.capacity.type, group.capacity.reservation_id) == ("capacity_block", "cr-0123456789abcdef0")
    assert group.placement_group is False


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        (
            {"gpu_node_groups": [_group(instance_type="p9.huge")]},
            r"gpu_node_groups\.0\.instance_type: unknown instance type 'p9\.huge'; use one of: p5\.48xlarge",
        ),
        (
            {"gpu_node_groups": [_group(instance_type="local-cpu")]},
            r"gpu_node_groups\.0\.instance_type: unknown instance type 'local-cpu'",
        ),
        (
            {"fsx": {"storage_capacity_gib": 2000}},
            (
                r"fsx\.storage_capacity_gib: 2000 GiB is not a valid PERSISTENT_2 size; "
                r"use 1200 or a multiple of 2400"
            ),
        ),
        (
            {"fsx": {"throughput_per_tib": 200}},
            (
                r"fsx\.throughput_per_tib: 200 is not a PERSISTENT_2 throughput tier; "
                r"use one of 125, 250, 500, 1000"
            ),
        ),
        (
            {
                "gpu_node_groups": [
                    _group(
                        placement_group=True,
                        desired_size=0,
                        capacity={"type": "capacity_block", "reservation_id": "cr-0123456789abcdef0"},
                    )
                ]
            },
            (
                r"placement_group: true cannot be combined with capacity type capacity_block; "
                r"set placement_group: false"
            ),
        ),
        (
            {
                "gpu_node_groups": [
                    _group(
                        placement_group=True,
                        capacity={"type": "capacity_reservation", "reservation_id": "cr-0123456789abcdef0"},
                    )
                ]
            },
            r"cannot be combined with capacity type capacity_reservation",
        ),
        (
            {"gpu_node_groups": [_group(min_size=3, desired_size=2, max_size=4)]},
            r"min_size <= desired_size <= max_size \(got 3 / 2 / 4\)",
        ),
        (
            {"gpu_node_groups": [_group(min_size=0, desired_size=5, max_size=4)]},
            r"min_size <= desired_size <= max_size \(got 0 / 5 / 4\)",
        ),
        (
            {"gpu_availability_zone": None},
            (
                r"gpu_availability_zone is missing; set it to the AZ of your GPU capacity "
                r"\(one of us-east-1a, us-east-1b\)"
            ),
        ),
        (
            {"gpu_availability_zone": "us-east-1f"},
            r"gpu_availability_zone us-east-1f is not one of availability_zones",
        ),
        (
            {"api_access": {"cidrs": ["0.0.0.0/0"]}},
            r"api_access\.cidrs: 0\.0\.0\.0/0 admits every network routed into the VPC; list the ranges",
        ),
        (
            {"api_access": {"cidrs": ["10.200.0.1/16"]}},
            (
                r"api_access\.cidrs: '10\.200\.0\.1/16' has host bits set; write the network address: "
                r"10\.200\.0\.0/16"
            ),
        ),
        (
            {"api_access": {"security_group_ids": ["sg-12"]}},
            r"api_access\.security_group_ids: 'sg-12' is not a security group id",
        ),
        (
            {"kubernetes_version": "1.29"},
            (
                r"kubernetes_version: 1\.29 is not supported by the add-on pins in infra/cluster_pins\.py; "
                rf"use one of {re.escape(', '.join(cluster_pins.SUPPORTED_KUBERNETES_VERSIONS))}"
            ),
        ),
        (
            {
                "gpu_node_groups": [
                    _group(
                        desired_size=2,
                        max_size=2,
                        capacity={"type": "capacity_block", "reservation_id": "cr-0123456789abcdef0"},
                    )
                ]
            },
            (
                r"gpu_node_groups\.0: a capacity_block group is created with min_size 0 and desired_size 0 "
                r"\(got 0 / 2\); when the block is active, scale it: aws eks update-nodegroup-config "
                r"--region REGION --cluster-name CLUSTER --nodegroup-name gpu "
                r"--scaling-config minSize=0,maxSize=2,desiredSize=2"
            ),
        ),
        (
            {"gpu_node_groups": [_group(capacity={"type": "capacity_block"})]},
            r"type capacity_block needs reservation_id",
        ),
        ({"unknown_knob": 1}, r"unknown_knob: Extra inputs are not permitted"),
    ],
    ids=[
        "unknown-instance",
        "local-profile-on-ec2",
        "fsx-capacity",
        "fsx-throughput",
        "placement-with-capacity-block",
        "placement-with-reservation",
        "min-above-desired",
        "desired-above-max",
        "missing-az",
        "az-not-in-vpc",
        "api-access-anywhere",
        "api-access-host-bits",
        "api-access-group",
        "k8s-version",
        "capacity-block-created-above-zero",
        "block-without-id",
        "unknown-field",
    ],
)
def test_invalid_input_names_field_and_fix(tmp_path, patch, expected):
    with pytest.raises(UserError, match=expected) as info:
        _load(tmp_path, **patch)
    assert "Traceback" not in str(info.value)


def test_context_overrides_reach_the_config(tmp_path):
    path, overrides = overrides_from_context(
        {
            "config": str(CONFIGS / "default.yaml"),
            "region": "us-west-2",
            "availability_zones": ["us-west-2a", "us-west-2b"],
            "gpu_availability_zone": "us-west-2b",
            "fsx.throughput_per_tib": 500,
            "@aws-cdk/core:flag": True,
        }
    )
    config = load_model(ClusterConfig, path, overrides)
    assert (config.region, config.gpu_availability_zone, config.fsx.throughput_per_tib) == (
        "us-west-2",
        "us-west-2b",
        500,
    )


def test_context_strings_stay_strings():
    _, overrides = overrides_from_context(
        {
            "kubernetes_version": "1.30",
            "fsx.storage_capacity_gib": "2400",
            "availability_zones": '["us-east-1a", "us-east-1c"]',
        }
    )
    assert overrides == [
        'availability_zones=["us-east-1a", "us-east-1c"]',
        'fsx.storage_capacity_gib="2400"',
        'kubernetes_version="1.30"',
    ]


def test_unquoted_version_in_yaml_gets_a_fix(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(
        (CONFIGS / "default.yaml")
        .read_text()
        .replace(
            f'kubernetes_version: "{cluster_pins.DEFAULT_KUBERNETES_VERSION}"', "kubernetes_version: 1.30"
        )
    )
    quoted = re.escape(f'"{cluster_pins.DEFAULT_KUBERNETES_VERSION}"')
    with pytest.raises(
        UserError, match=rf"kubernetes_version: write the version as a quoted string such as {quoted}"
    ):
        load_model(ClusterConfig, path)


def test_unknown_context_key_is_refused():
    with pytest.raises(UserError, match="context key 'regoin' is not a cluster config field"):
        overrides_from_context({"regoin": "us-west-2"})


def test_context_keys_the_cdk_cli_writes_are_accepted():
    # `cdk acknowledge ID` and `cdk cli-telemetry` save these into cdk.context.json, which every later
    # synth and deploy reads: refusing them would stop every `npx cdk` run after the first acknowledge.
    cli = (ROOT / "node_modules" / "aws-cdk" / "lib" / "cli" / "cdk-toolkit.js").read_text()
    written = set(re.findall(r"context\.set\('([^']+)'", cli))
    assert "acknowledged-issue-numbers" in written
    path, overrides = overrides_from_context(
        {key: [34892] for key in written} | {"config": str(CONFIGS / "default.yaml")}
    )
    assert overrides == []
    load_model(ClusterConfig, path, overrides)


def test_every_example_job_fits_an_example_cluster():
    """Each GPU job values file of k8s/values runs, nodes and spares, on a GPU node group of the same
    instance type in one of the example cluster configs (preflight's offline capacity check)."""
    from nvrx_eks.infra.ops.preflight import Status, job_capacity  # noqa: PLC0415
    from nvrx_eks.k8s.load import load_values  # noqa: PLC0415

    configs = [load_model(ClusterConfig, path) for path in sorted(CONFIGS.glob("*.yaml"))]
    jobs = [load_values(path, []) for path in sorted((ROOT / "k8s" / "values").glob("*.yaml"))]
    gpu_jobs = [job for job in jobs if job.profile.gpus]
    assert gpu_jobs
    for job in gpu_jobs:
        checks = [job_capacity(config, job) for config in configs]
        assert any(c.status is Status.PASS for c in checks), [c.detail for c in checks]
