"""The cluster config and the job values name the same Kubernetes objects, labels and bucket: a name
one accepts the other accepts too (both apply kitcore/naming.py), so a stack deploys with exactly the
names a job can then be rendered with."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from nvrx_eks.infra.config import ClusterConfig
from nvrx_eks.k8s.load import load_values
from nvrx_eks.kitcore.configio import UserError, load_model

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "infra" / "configs" / "default.yaml"
JOB = ROOT / "k8s" / "values" / "p5-2.yaml"


def _cluster_accepts(tmp_path: Path, patch: dict[str, object]) -> bool:
    data = yaml.safe_load(CLUSTER.read_text())
    for key, value in patch.items():
        data.setdefault(key, {}).update(value) if isinstance(value, dict) else data.update({key: value})
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    try:
        load_model(ClusterConfig, path)
    except UserError:
        return False
    return True


def _job_accepts(overrides: list[str]) -> bool:
    try:
        load_values(JOB, overrides)
    except UserError:
        return False
    return True


def _gpu_group(**fields: object) -> dict[str, object]:
    return {"gpu_node_groups": [{"name": "gpu", "instance_type": "p5.48xlarge", "max_size": 2, **fields}]}


@pytest.mark.parametrize(
    ("cluster_patch", "job_overrides", "accepted"),
    [
        # A ServiceAccount and a PVC are DNS subdomains: periods allowed.
        ({"training": {"service_account": "nvrx.trainer"}}, ["service_account=nvrx.trainer"], True),
        ({"training": {"pvc_name": "fsx.checkpoints"}}, ["storage.fsx_pvc=fsx.checkpoints"], True),
        ({"training": {"service_account": "Trainer"}}, ["service_account=Trainer"], False),
        # A namespace is a DNS label: no periods.
        ({"training": {"namespace": "train.ing"}}, ["namespace=train.ing"], False),
        ({"training": {"namespace": "training-2"}}, ["namespace=training-2"], True),
        # A bucket formatted as an IP address is refused, whether or not it is a valid address.
        ({"fsx": {"data_repository_path": "s3://999.1.1.1/ckpt/"}}, ["storage.s3_bucket=999.1.1.1"], False),
        (
            {"fsx": {"data_repository_path": "s3://ckpt-bucket/ckpt/"}},
            ["storage.s3_bucket=ckpt-bucket"],
            True,
        ),
        # A label key with an empty prefix.
        (_gpu_group(labels={"/pool": "a"}), ["gpu_node_selector./pool=a"], False),
        (_gpu_group(labels={"pool": "a_b"}), ["gpu_node_selector.pool=a_b"], True),
    ],
)
def test_the_cluster_config_and_the_job_values_agree_on_every_shared_name(
    tmp_path, cluster_patch, job_overrides, accepted
):
    assert (_cluster_accepts(tmp_path, cluster_patch), _job_accepts(job_overrides)) == (accepted, accepted)
