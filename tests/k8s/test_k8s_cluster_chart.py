"""The cluster chart's node check, scrape objects and dashboards: schema-valid, least privilege, wired to
the job chart and to the trainer's node check by the same names."""

from __future__ import annotations

import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from nvrx_eks.k8s.job_chart import render
from nvrx_eks.k8s.load import load_values
from nvrx_eks.k8s.node_verification import HOST_DEV, HOST_NVME, HOST_SYS, NODE_CHECK, NODE_NAME_EXTRA
from nvrx_eks.k8s.observability import DCGM_EXPORTER_PORT, GRAFANA_DASHBOARD_LABEL
from nvrx_eks.training.node import nodecheck

K8S_VERSION = "1.33"
ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "training"
CRD_KINDS = {"PodMonitor", "PrometheusRule", "ResourceFlavor", "ClusterQueue", "LocalQueue"}


def _one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    (found,) = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return found


@pytest.fixture(scope="module")
def docs(cluster_objects) -> list[dict]:
    return cluster_objects()


def test_every_core_object_validates_against_the_k8s_schema(docs):
    kinds = {d["kind"] for d in docs}
    assert kinds >= {
        "DaemonSet",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "NetworkPolicy",
        "ConfigMap",
        "PodMonitor",
    }
    for doc in docs:
        if doc["kind"] not in CRD_KINDS:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_without_node_check_or_operator_only_the_dashboards_are_added(cluster_objects):
    kinds = [d["kind"] for d in cluster_objects(node_check=False, pod_monitors=False, kueue=False)]
    assert "DaemonSet" not in kinds
    assert "PodMonitor" not in kinds
    assert kinds.count("ConfigMap") == 1


def test_rbac_is_get_and_patch_on_nodes_and_create_on_events_only(docs):
    role = _one(docs, "ClusterRole", NODE_CHECK)
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
    ]
    events = _one(docs, "Role", NODE_CHECK)
    assert events["metadata"]["namespace"] == NAMESPACE
    assert events["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        (subject,) = _one(docs, kind, NODE_CHECK)["subjects"]
        assert subject == {"kind": "ServiceAccount", "name": NODE_CHECK, "namespace": NAMESPACE}
    # No token for the training service account unless a container asks for one (k8s/job_chart.py).
    assert _one(docs, "ServiceAccount", "trainer")["automountServiceAccountToken"] is False


def test_the_training_service_account_may_get_nodes_and_nothing_else(docs):
    """The trainer pod's topology init container reads its own Node's labels: `get` on nodes, bound to
    the training service account, is its only grant anywhere in the cluster chart."""
    grants = [
        d
        for d in docs
        if d["kind"] in {"ClusterRoleBinding", "RoleBinding"}
        and {"kind": "ServiceAccount", "name": "trainer", "namespace": NAMESPACE} in d["subjects"]
    ]
    (binding,) = grants
    assert binding["kind"] == "ClusterRoleBinding"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "trainer", "namespace": NAMESPACE}]
    role = _one(docs, "ClusterRole", binding["roleRef"]["name"])
    assert binding["roleRef"]["kind"] == "ClusterRole"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]


def test_admission_policy_pins_the_service_account_to_its_own_node(docs):
    policy = _one(docs, "ValidatingAdmissionPolicy", NODE_CHECK)["spec"]
    assert policy["failurePolicy"] == "Fail"
    (rule,) = policy["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["nodes", "nodes/status"]
    assert rule["operations"] == ["UPDATE"]
    (condition,) = policy["matchConditions"]
    assert (
        condition["expression"]
        == f"request.userInfo.username == 'system:serviceaccount:{NAMESPACE}:{NODE_CHECK}'"
    )
    expressions = [v["expression"] for v in policy["validations"]]
    assert f"request.userInfo.extra['{NODE_NAME_EXTRA}']" in expressions[0]
    assert "object.metadata.name" in expressions[0]
    # What it may change is exactly what training/node/nodecheck.py writes.
    text = json.dumps(policy)
    for owned in (
        nodecheck.VERIFIED_LABEL,
        nodecheck.VERIFIED_AT_LABEL,
        nodecheck.REPORT_ANNOTATION,
        nodecheck.UNVERIFIED_TAINT,
        nodecheck.CONDITION_TYPE,
    ):
        assert owned in text
    binding = _one(docs, "ValidatingAdmissionPolicyBinding", NODE_CHECK)["spec"]
    assert binding == {"policyName": NODE_CHECK, "validationActions": ["Deny"]}


def test_daemon_set_runs_the_check_on_gpu_nodes_without_taking_devices(docs):
    ds = _one(docs, "DaemonSet", NODE_CHECK)
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvrx-eks/gpu": "true"}
    tolerated = {t["key"] for t in pod["tolerations"]}
    assert tolerated == {"nvidia.com/gpu", nodecheck.UNVERIFIED_TAINT}  # it must run on a node it tainted
    assert pod["serviceAccountName"] == NODE_CHECK
    (c,) = pod["containers"]
    assert c["command"][:3] == ["python", "-m", "nvrx_eks.training.node.nodecheck"]
    assert "nvidia.com/gpu" not in json.dumps(c["resources"])
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    # dcgmi asks the node's engine (the node's IP), not localhost, which is the pod itself.
    assert env["NVRX_EKS_DCGM_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    sc = c["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc.get("privileged", False) is False
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts[HOST_SYS]["readOnly"]
    assert mounts[f"{HOST_DEV}/infiniband"]["readOnly"]
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    # Only a subdirectory of the array: its root holds the kubelet's and containerd's state.
    assert volumes["local-nvme"] == f"/mnt/k8s-disks/0/{NODE_CHECK}"
    # The trainer's node check looks where the chart mounts.
    host = nodecheck.Host()
    assert (str(host.sys_root), str(host.efa_dev_root), str(host.nvme_path)) == (
        HOST_SYS,
        HOST_DEV,
        HOST_NVME,
    )


def test_kueue_flavor_admits_to_verified_nodes_only(docs, cluster_objects):
    flavor = _one(docs, "ResourceFlavor")
    assert flavor["spec"] == {"nodeLabels": {nodecheck.VERIFIED_LABEL: "true"}}
    assert "spec" not in _one(cluster_objects(node_check=False), "ResourceFlavor")


def test_kueue_objects_are_on_the_api_version_the_pinned_release_serves(docs):
    from nvrx_eks.infra import cluster_pins  # noqa: PLC0415
    from nvrx_eks.k8s.cluster_chart import KUEUE_API_VERSION  # noqa: PLC0415

    kueue = [d for d in docs if d["kind"] in {"ResourceFlavor", "ClusterQueue", "LocalQueue"}]
    assert len(kueue) == 3
    assert {d["apiVersion"] for d in kueue} == {KUEUE_API_VERSION} == {"kueue.x-k8s.io/v1beta2"}
    minor = tuple(int(x) for x in cluster_pins.HELM_CHARTS["kueue"].version.split(".")[:2])
    assert minor >= (0, 19)  # serves v1beta2 only; WaitForPodsReady on by default


@pytest.mark.parametrize("values_file", sorted((ROOT / "k8s" / "values").glob("p5-*.yaml")))
def test_a_lost_node_is_replaced_before_kueue_evicts_the_job(values_file):
    """Kueue 0.19+ evicts a workload whose pods stay not-ready past WaitForPodsReady's recovery timeout;
    the job's own wait for a replacement pod must end first."""
    from nvrx_eks.k8s.cluster_chart import KUEUE_PODS_READY_TIMEOUT_S  # noqa: PLC0415

    values = load_values(values_file)
    assert values.timeouts.pod_reschedule_s < KUEUE_PODS_READY_TIMEOUT_S


def test_dashboard_config_map_for_the_grafana_sidecar(docs):
    cm = _one(docs, "ConfigMap", "nvrx-eks-dashboards")
    assert cm["metadata"]["labels"][GRAFANA_DASHBOARD_LABEL] == "1"
    shipped = (ROOT / "k8s" / "dashboards" / "training.json").read_text()
    assert cm["data"]["training.json"] == shipped
    assert json.loads(shipped)["uid"] == "nvrx-eks-training"


def test_pod_monitors_scrape_the_ports_the_job_chart_declares(docs, tmp_path):
    files = render(load_values(ROOT / "k8s" / "values" / "p5-2.yaml"), str(tmp_path))
    (job,) = [d for f in files for d in yaml.safe_load_all(Path(f).read_text()) if d and d["kind"] == "Job"]
    template = job["spec"]["template"]
    (container,) = template["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {f"metrics-{i}": 9500 + i for i in range(8)}
    scrape = {"prometheus.io/scrape": "true", "prometheus.io/port": "9500", "prometheus.io/path": "/metrics"}
    assert scrape.items() <= template["metadata"]["annotations"].items()
    monitor = _one(docs, "PodMonitor", "nvrx-eks-trainer")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= template["metadata"]["labels"].items()
    scraped = {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]}
    assert set(ports) <= scraped
    dcgm = _one(docs, "PodMonitor", "nvrx-eks-dcgm-exporter")
    assert dcgm["metadata"]["namespace"] == "kube-system"
    assert [e["port"] for e in dcgm["spec"]["podMetricsEndpoints"]] == [DCGM_EXPORTER_PORT]


@pytest.mark.parametrize(
    ("values_file", "overrides", "required"),
    [
        ("p5-2.yaml", [], True),
        ("p5-2.yaml", ["require_verified_nodes=false"], False),
        ("local-cpu.yaml", [], False),
    ],
)
def test_training_pods_require_verified_nodes_on_ec2_by_default(tmp_path, values_file, overrides, required):
    files = render(load_values(ROOT / "k8s" / "values" / values_file, overrides), str(tmp_path))
    (job,) = [d for f in files for d in yaml.safe_load_all(Path(f).read_text()) if d and d["kind"] == "Job"]
    selector = job["spec"]["template"]["spec"].get("nodeSelector") or {}
    assert (selector.get(nodecheck.VERIFIED_LABEL) == "true") is required
