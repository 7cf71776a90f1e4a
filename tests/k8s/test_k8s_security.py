"""Least privilege in the rendered job: what each pod may mount, do and reach.

The Pod Security checks below are the `baseline` / `restricted` rules of
https://kubernetes.io/docs/concepts/security/pod-security-standards/ for the fields the charts set.
"""

from __future__ import annotations

from pathlib import Path

import cdk8s
import pytest
import yaml

from k8s.cluster_chart import ClusterObjectsChart
from k8s.job_chart import render
from k8s.load import load_values
from k8s.values import NVME_RAID_ROOT
from kitcore.configio import UserError

VALUES = Path(__file__).resolve().parents[2] / "k8s" / "values"
LOCAL, P5 = VALUES / "local-cpu.yaml", VALUES / "p5-2.yaml"
# Capabilities `baseline` allows a container to add (the container runtime's defaults).
BASELINE_CAPS = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip


def _docs(values_file: Path, tmp_path: Path, *overrides: str) -> list[dict]:
    files = render(load_values(values_file, list(overrides)), str(tmp_path / "out"))
    return [d for f in files for d in yaml.safe_load_all(Path(f).read_text()) if d]


def _pod(docs: list[dict], kind: str) -> dict:
    (obj,) = [d for d in docs if d["kind"] == kind]
    return obj["spec"]["template"]["spec"]


def _containers(pod: dict) -> list[dict]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def _baseline_violations(pod: dict) -> set[str]:
    found = {f"hostPath {v['hostPath']['path']}" for v in pod.get("volumes", []) if "hostPath" in v}
    found |= {f"pod {k}" for k in ("hostNetwork", "hostPID", "hostIPC") if pod.get(k)}
    for c in _containers(pod):
        sc = c.get("securityContext", {})
        found |= {f"{c['name']} privileged"} if sc.get("privileged") else set()
        found |= {f"{c['name']} adds {cap}" for cap in sc.get("capabilities", {}).get("add", [])} - {
            f"{c['name']} adds {cap}" for cap in BASELINE_CAPS
        }
        found |= {f"{c['name']} hostPort" for p in c.get("ports", []) if p.get("hostPort")}
    return found


def _restricted_violations(pod: dict) -> set[str]:
    found = _baseline_violations(pod)
    pod_sc = pod.get("securityContext", {})
    for c in _containers(pod):
        sc = c.get("securityContext", {})
        name = c["name"]
        if sc.get("allowPrivilegeEscalation") is not False:
            found.add(f"{name} may escalate privileges")
        if sc.get("capabilities", {}).get("drop") != ["ALL"]:
            found.add(f"{name} keeps capabilities")
        if not (sc.get("runAsNonRoot") or pod_sc.get("runAsNonRoot")) or sc.get("runAsUser") == 0:
            found.add(f"{name} may run as root")
        seccomp = sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}
        if seccomp.get("type") not in {"RuntimeDefault", "Localhost"}:
            found.add(f"{name} without seccomp")
    return found


def test_local_tier_is_a_dedicated_folder_below_the_nvme_array(tmp_path):
    pod = _pod(_docs(P5, tmp_path), "Job")
    (volume,) = [v for v in pod["volumes"] if "hostPath" in v]
    assert volume["hostPath"] == {"path": f"{NVME_RAID_ROOT}/nvrx-checkpoints", "type": "DirectoryOrCreate"}


@pytest.mark.parametrize(
    "path",
    [NVME_RAID_ROOT, f"{NVME_RAID_ROOT}/", "/mnt/k8s-disks", "/", f"{NVME_RAID_ROOT}/kubelet", "/var/log/x"],
)
def test_the_nvme_array_root_and_node_state_are_refused(path):
    with pytest.raises(UserError, match=r"storage\.local_nvme_path: .*\(the node's own state\)"):
        load_values(LOCAL, [f"storage.local_nvme_path={path}"])


@pytest.mark.parametrize("values_file", [LOCAL, P5], ids=["local-cpu", "p5"])
def test_every_container_drops_privileges(values_file, tmp_path):
    docs = _docs(values_file, tmp_path)
    for kind in ("Deployment", "Job"):
        pod = _pod(docs, kind)
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in _containers(pod):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, c["name"]
            assert sc["capabilities"]["drop"] == ["ALL"], c["name"]
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, c["name"]


def test_ipc_lock_only_where_efa_needs_it(tmp_path):
    for values_file, expected in ((LOCAL, set()), (P5, {"IPC_LOCK"})):
        pod = _pod(_docs(values_file, tmp_path / values_file.stem), "Job")
        for c in _containers(pod):
            added = set(c["securityContext"]["capabilities"].get("add", []))
            assert added == (expected if c["name"] in {"trainer", "selfcheck"} else set()), c["name"]


@pytest.mark.parametrize("values_file", [LOCAL, P5], ids=["local-cpu", "p5"])
def test_the_store_meets_restricted_and_the_only_init_container_is_the_selfcheck(values_file, tmp_path):
    docs = _docs(values_file, tmp_path)
    store = _pod(docs, "Deployment")
    assert _restricted_violations(store) == set()
    (store_container,) = store["containers"]
    assert store_container["securityContext"]["readOnlyRootFilesystem"] is True
    # The only init container is the self-check, with the trainer's own security context.
    job = _pod(docs, "Job")
    assert [c["name"] for c in job["initContainers"]] == ["selfcheck"]
    assert job["initContainers"][0]["securityContext"] == job["containers"][0]["securityContext"]


def test_training_pods_go_beyond_baseline_only_for_the_local_tier_and_efa(tmp_path):
    """The namespace enforces `privileged` because of exactly these; without them, baseline holds."""
    raid = f"hostPath {NVME_RAID_ROOT}/nvrx-checkpoints"
    p5 = _baseline_violations(_pod(_docs(P5, tmp_path / "p5"), "Job"))
    assert p5 == {raid, "selfcheck adds IPC_LOCK", "trainer adds IPC_LOCK"}
    assert _baseline_violations(_pod(_docs(LOCAL, tmp_path / "local"), "Job")) == {raid}
    no_tier = _docs(LOCAL, tmp_path / "no-tier", "storage.local_nvme_path=null")
    assert _baseline_violations(_pod(no_tier, "Job")) == set()


def _policies(docs: list[dict]) -> dict[str, dict]:
    return {d["metadata"]["name"].rsplit("-", 1)[-1]: d["spec"] for d in docs if d["kind"] == "NetworkPolicy"}


def test_only_the_jobs_own_pods_reach_its_pods(tmp_path):
    docs = _docs(LOCAL, tmp_path)
    job_pods = {"matchLabels": {"nvrx-eks/job": "nvrx-local"}}
    ingress = _policies(docs)["ingress"]
    assert ingress["podSelector"] == job_pods
    assert ingress["policyTypes"] == ["Ingress"]
    assert ingress["ingress"] == [{"from": [{"podSelector": job_pods}]}]
    # Every pod of the job (store and trainers) carries the label the policies select on.
    for kind in ("Deployment", "Job"):
        (obj,) = [d for d in docs if d["kind"] == kind]
        assert obj["spec"]["template"]["metadata"]["labels"]["nvrx-eks/job"] == "nvrx-local"


def test_egress_is_peers_dns_pod_identity_and_https_but_not_instance_metadata(tmp_path):
    egress = _policies(_docs(LOCAL, tmp_path))["egress"]
    assert egress["policyTypes"] == ["Egress"]
    rules = egress["egress"]
    assert rules[0] == {"to": [{"podSelector": {"matchLabels": {"nvrx-eks/job": "nvrx-local"}}}]}
    assert {(p["protocol"], p["port"]) for p in rules[1]["ports"]} == {("UDP", 53), ("TCP", 53)}
    # Port 80 only to the Pod Identity agent: IMDS (169.254.169.254:80, the node role) is not reachable.
    port_80 = [r for r in rules if any(p["port"] == 80 for p in r.get("ports", []))]
    assert [peer["ipBlock"]["cidr"] for r in port_80 for peer in r["to"]] == [
        "169.254.170.23/32",
        "fd00:ec2::23/128",
    ]
    unrestricted = [r for r in rules if "to" not in r]
    assert unrestricted == [{"ports": [{"port": 443, "protocol": "TCP"}]}]


def test_metrics_ports_are_opened_only_when_served(tmp_path):
    assert len(_policies(_docs(LOCAL, tmp_path / "a"))["ingress"]["ingress"]) == 1
    served = _policies(_docs(LOCAL, tmp_path / "b", "trainer.metrics.prometheus_port=9400"))["ingress"]
    assert served["ingress"][1] == {
        "from": [{"namespaceSelector": {}}],
        "ports": [{"port": 9400, "endPort": 9401, "protocol": "TCP"}],
    }


def _namespace(**kwargs: object) -> dict:
    app = cdk8s.App()
    chart = ClusterObjectsChart(
        app,
        "cluster",
        namespace="training",
        service_account="nvrx-trainer",
        fsx_file_system_id="fs-0123456789abcdef0",
        fsx_dns_name="fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com",
        fsx_mount_name="abcdefgh",
        storage_capacity_gib=1200,
        pvc_name="fsx-checkpoints",
        **kwargs,
    )
    (ns,) = [o for o in chart.to_json() if o["kind"] == "Namespace"]
    return ns["metadata"]["labels"]


def test_namespace_pod_security_labels():
    labels = _namespace()
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert labels["pod-security.kubernetes.io/warn"] == "baseline"
    assert labels["pod-security.kubernetes.io/audit"] == "baseline"
    strict = _namespace(pod_security="restricted")
    assert (
        strict["pod-security.kubernetes.io/enforce"]
        == strict["pod-security.kubernetes.io/warn"]
        == "restricted"
    )
