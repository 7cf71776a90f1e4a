"""What the k8s tests share: the cluster chart rendered with the example stack's values."""

from __future__ import annotations

import cdk8s
import pytest

from nvrx_eks.k8s.cluster_chart import ClusterObjectsChart, KueueQuota
from nvrx_eks.k8s.node_verification import NodeCheckSpec

NAMESPACE = "training"


def _cluster_objects(*, node_check: bool = True, pod_monitors: bool = True, kueue: bool = True) -> list[dict]:
    chart = ClusterObjectsChart(
        cdk8s.App(),
        "cluster-objects",
        namespace=NAMESPACE,
        service_account="trainer",
        fsx_file_system_id="fs-0123456789abcdef0",
        fsx_dns_name="fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com",
        fsx_mount_name="abcdefgh",
        storage_capacity_gib=1200,
        pvc_name="fsx-checkpoints",
        kueue=KueueQuota(gpus=16, efa_devices=64, cpu=384, memory_gib=4096, verified_nodes_only=node_check)
        if kueue
        else None,
        node_check=NodeCheckSpec(image="123456789012.dkr.ecr.us-east-1.amazonaws.com/nvrx:abc123")
        if node_check
        else None,
        pod_monitors=pod_monitors,
    )
    return chart.to_json()


@pytest.fixture(scope="session")
def cluster_objects():
    """The cluster chart's objects: `cluster_objects(node_check=, pod_monitors=, kueue=)`."""
    return _cluster_objects
