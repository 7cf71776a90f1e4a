"""Least privilege in the rendered job: what each pod may mount, do and reach.

The Pod Security checks below are the `baseline` / `restricted` rules of
https://kubernetes.io/docs/concepts/security/pod-security-standards/ for the fields the charts set.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import cdk8s
import pytest
import yaml
from kube_objects import container_images

from nvrx_eks.k8s.cluster_chart import ClusterObjectsChart
from nvrx_eks.k8s.job_chart import (
    NODE_READER_TOKEN_VOLUME,
    OWNER_SETUP_CONTAINER,
    TOPOLOGY_CONTAINER,
    render,
    trainer_owned_folders,
)
from nvrx_eks.k8s.load import load_values
from nvrx_eks.k8s.node_verification import DCGM_PORT, HOST_NVME, NODE_CHECK, NodeCheckSpec, NodeVerification
from nvrx_eks.k8s.nvrx_versions import LOCAL_IMAGE
from nvrx_eks.k8s.values import NVME_RAID_ROOT
from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.kitcore.pins import TRAINER_UID

VALUES = Path(__file__).resolve().parents[2] / "k8s" / "values"
LOCAL, P5 = VALUES / "local-cpu.yaml", VALUES / "p5-2.yaml"
DIGEST_REFERENCE = re.compile(r"^[^@\s]+:[^@/\s]+@sha256:[0-9a-f]{64}$")
NODE_CHECK_IMAGE = f"123456789012.dkr.ecr.us-east-1.amazonaws.com/nvrx:abc123@sha256:{'ab' * 32}"
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


def test_only_the_folder_owner_adds_a_capability_and_only_chown(tmp_path):
    for values_file in (LOCAL, P5):
        pod = _pod(_docs(values_file, tmp_path / values_file.stem), "Job")
        for c in _containers(pod):
            added = set(c["securityContext"]["capabilities"].get("add", []))
            assert added == ({"CHOWN"} if c["name"] == OWNER_SETUP_CONTAINER else set()), c["name"]


@pytest.mark.parametrize("values_file", [LOCAL, P5], ids=["local-cpu", "p5"])
def test_the_store_meets_restricted_and_the_init_containers_are_the_selfcheck_and_topology(
    values_file, tmp_path
):
    docs = _docs(values_file, tmp_path)
    store = _pod(docs, "Deployment")
    assert _restricted_violations(store) == set()
    (store_container,) = store["containers"]
    assert store_container["securityContext"]["readOnlyRootFilesystem"] is True
    # The init containers are the folder owner (container images only), the self-check and (with the
    # peer replica) the topology reader, the last two with the trainer's own security context.
    job = _pod(docs, "Job")
    owner = [OWNER_SETUP_CONTAINER] if values_file == P5 else []
    assert [c["name"] for c in job["initContainers"]] == [*owner, "selfcheck", TOPOLOGY_CONTAINER]
    for init in job["initContainers"][-2:]:
        assert init["securityContext"] == job["containers"][0]["securityContext"]


def _token_mounts(pod: dict) -> dict[str, list[str]]:
    """Container -> the volumes it mounts that carry a service account token."""
    token_volumes = {
        v["name"]
        for v in pod.get("volumes", [])
        if any("serviceAccountToken" in s for s in (v.get("projected") or {}).get("sources", []))
    }
    return {
        c["name"]: [m["name"] for m in c.get("volumeMounts", []) if m["name"] in token_volumes]
        for c in _containers(pod)
    }


@pytest.mark.parametrize("values_file", [LOCAL, P5], ids=["local-cpu", "p5"])
def test_only_the_topology_init_container_holds_an_api_token_read_only_and_short_lived(values_file, tmp_path):
    docs = _docs(values_file, tmp_path)
    for kind in ("Deployment", "Job"):
        assert _pod(docs, kind)["automountServiceAccountToken"] is False, kind
    assert not any(_token_mounts(_pod(docs, "Deployment")).values())
    job = _pod(docs, "Job")
    mounts = _token_mounts(job)
    assert {name: vols for name, vols in mounts.items() if vols} == {
        TOPOLOGY_CONTAINER: [NODE_READER_TOKEN_VOLUME]
    }
    (topology,) = [c for c in job["initContainers"] if c["name"] == TOPOLOGY_CONTAINER]
    (mount,) = [m for m in topology["volumeMounts"] if m["name"] == NODE_READER_TOKEN_VOLUME]
    assert mount["readOnly"] is True
    (volume,) = [v for v in job["volumes"] if v["name"] == NODE_READER_TOKEN_VOLUME]
    (token,) = [
        s["serviceAccountToken"] for s in volume["projected"]["sources"] if "serviceAccountToken" in s
    ]
    assert token["expirationSeconds"] == 600  # the least the API server issues
    assert "audience" not in token  # the API server's own
    # Restricted, as the trainer: non-root, no capability, a read-only root filesystem.
    assert _restricted_violations({"containers": [topology]}) == set()
    assert topology["securityContext"]["readOnlyRootFilesystem"] is True
    # Without the peer replica there are no partners to choose: no reader, no token anywhere.
    no_peer = _pod(_docs(values_file, tmp_path / "no-peer", "storage.peer_replicas=0"), "Job")
    assert not any(_token_mounts(no_peer).values())
    assert TOPOLOGY_CONTAINER not in {c["name"] for c in _containers(no_peer)}


def test_training_pods_go_beyond_baseline_only_for_the_local_tier(tmp_path):
    """The namespace enforces `privileged` because of exactly this; without it, baseline holds."""
    raid = f"hostPath {NVME_RAID_ROOT}/nvrx-checkpoints"
    assert _baseline_violations(_pod(_docs(P5, tmp_path / "p5"), "Job")) == {raid}
    assert _baseline_violations(_pod(_docs(LOCAL, tmp_path / "local"), "Job")) == {raid}
    no_tier = _docs(LOCAL, tmp_path / "no-tier", "storage.local_nvme_path=null")
    assert _baseline_violations(_pod(no_tier, "Job")) == set()


def _mounted(container: dict, path: str) -> bool:
    return any(
        path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")
        for m in container["volumeMounts"]
    )


@pytest.mark.parametrize("values_file", sorted(VALUES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_job_runs_images_by_digest_and_the_trainer_non_root_on_a_read_only_root(
    values_file, tmp_path
):
    docs = _docs(values_file, tmp_path)
    local = load_values(values_file).image == LOCAL_IMAGE
    # Every image anywhere in the rendered objects (the store, the Job's init containers and trainer).
    images = container_images(docs)
    assert len(images) >= len([*_containers(_pod(docs, "Deployment")), *_containers(_pod(docs, "Job"))])
    for image in images:
        assert image == LOCAL_IMAGE if local else DIGEST_REFERENCE.match(image), image
    job = _pod(docs, "Job")
    # Beyond the local tier's hostPath, only the folder owner leaves `restricted`: root (with CHOWN
    # alone, below), and only on a container image.
    assert _restricted_violations(job) - {f"hostPath {NVME_RAID_ROOT}/nvrx-checkpoints"} == (
        set() if local else {f"{OWNER_SETUP_CONTAINER} may run as root"}
    )
    by_name = {c["name"]: c for c in _containers(job)}
    for name in ("selfcheck", "trainer"):
        sc = by_name[name]["securityContext"]
        assert sc["runAsNonRoot"] is True
        assert sc["runAsUser"] == sc["runAsGroup"] == TRAINER_UID
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
    trainer = by_name["trainer"]
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    if not local:  # `image: local`: the executor gives each pod its own TMPDIR, as this machine's user
        # What the trainer writes outside the image is on a volume: $HOME, /tmp, /dev/shm, its folders.
        writes = [env["HOME"], "/tmp", "/dev/shm", *trainer_owned_folders(load_values(values_file))]
        assert [w for w in writes if not _mounted(trainer, w)] == []
        scratch = next(v for v in job["volumes"] if v["name"] == "scratch")
        assert "medium" not in scratch["emptyDir"]  # the node's disk, not its RAM
        # The folders on root-owned volumes (hostPath, FSx) are handed to the trainer's uid first.
        owner = by_name[OWNER_SETUP_CONTAINER]
        folders = trainer_owned_folders(load_values(values_file))
        assert owner["command"][-len(folders) :] == folders
        assert f"chown -- {TRAINER_UID}:{TRAINER_UID}" in owner["command"][2]
        assert owner["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
        assert owner["securityContext"]["readOnlyRootFilesystem"] is True
        assert owner["securityContext"]["allowPrivilegeEscalation"] is False
        assert all(_mounted(owner, f) for f in folders)


@pytest.mark.parametrize(
    "image",
    [
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/nvrx-eks-training:0123abcd",
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/nvrx-eks-training",
        "nvcr.io/nvidia/pytorch:25.09-py3",
    ],
)
def test_an_image_without_a_digest_is_one_message_naming_the_field_and_the_fix(image, tmp_path):
    with pytest.raises(
        UserError, match=r"image: .* has no digest: pin the image as REPOSITORY:TAG@sha256:DIGEST"
    ) as info:
        load_values(P5, [f"image={image}"])
    assert "nvrx-eks image push" in str(info.value)
    # The command line: exit 2, the message, no traceback, nothing written.
    values = tmp_path / "job.yaml"
    values.write_text(P5.read_text())
    out = tmp_path / "dist"
    done = subprocess.run(
        [sys.executable, "-c", "from nvrx_eks.cli import main; main()", "job", "render", "-f", str(values),
         "--set", f"image={image}", "-o", str(out)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "has no digest" in done.stderr
    assert "Traceback" not in done.stderr
    assert not out.exists()


def _node_check(**spec: object) -> list[dict]:
    chart = cdk8s.Chart(cdk8s.App(), "c")
    NodeVerification(chart, "n", namespace="training", spec=NodeCheckSpec(image=NODE_CHECK_IMAGE, **spec))
    return chart.to_json()


def test_the_node_check_pod_is_non_root_read_only_and_its_network_is_policed():
    docs = _node_check()
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # Root only to hand the probe folder to the image's uid, with CHOWN alone; the check itself as
    # the trainer's uid, read-only, no capability.
    assert _restricted_violations(pod) - {"hostPath /sys", "hostPath /dev/infiniband"} == {
        f"hostPath {NVME_RAID_ROOT}/{NODE_CHECK}",
        f"{OWNER_SETUP_CONTAINER} may run as root",
    }
    (check,) = pod["containers"]
    assert check["securityContext"]["runAsUser"] == TRAINER_UID
    assert check["securityContext"]["readOnlyRootFilesystem"] is True
    (owner,) = pod["initContainers"]
    assert owner["command"][-1] == HOST_NVME
    assert owner["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    # Its NetworkPolicy selects exactly its pods: nothing in, out only DNS, HTTPS (API server), DCGM.
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    spec = policy["spec"]
    assert spec["podSelector"] == ds["spec"]["selector"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec.get("ingress", []) == []
    ports = {(p["protocol"], p["port"]) for rule in spec["egress"] for p in rule["ports"]}
    assert ports == {("UDP", 53), ("TCP", 53), ("TCP", 443), ("TCP", DCGM_PORT)}
    # Port 80 (the instance metadata service, the node role's credentials) is not among them.
    assert not any(p["port"] == 80 for rule in spec["egress"] for p in rule["ports"])


def test_the_node_check_policy_follows_a_dcgm_port_setting():
    (policy,) = [
        d for d in _node_check(dcgm_host="dcgm.kube-system.svc:5566") if d["kind"] == "NetworkPolicy"
    ]
    ports = {p["port"] for rule in policy["spec"]["egress"] for p in rule["ports"]}
    assert 5566 in ports
    assert DCGM_PORT not in ports


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
    docs = _docs(LOCAL, tmp_path)
    policies = _policies(docs)
    egress = policies["egress"]
    assert egress["policyTypes"] == ["Egress"]
    # Every pod of the job, the store included: its peers and DNS, nothing else.
    assert egress["egress"][0] == {"to": [{"podSelector": {"matchLabels": {"nvrx-eks/job": "nvrx-local"}}}]}
    assert {(p["protocol"], p["port"]) for p in egress["egress"][1]["ports"]} == {("UDP", 53), ("TCP", 53)}
    assert len(egress["egress"]) == 2
    # The trainers alone reach AWS: the Pod Identity agent and HTTPS.
    https = policies["https"]
    assert https["podSelector"] == {
        "matchLabels": {"nvrx-eks/job": "nvrx-local", "app.kubernetes.io/component": "trainer"}
    }
    (job,) = [d for d in docs if d["kind"] == "Job"]
    assert (
        https["podSelector"]["matchLabels"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
    )
    (store,) = [d for d in docs if d["kind"] == "Deployment"]
    assert (
        not https["podSelector"]["matchLabels"].items()
        <= store["spec"]["template"]["metadata"]["labels"].items()
    )
    rules = https["egress"]
    # Port 80 only to the Pod Identity agent: IMDS (169.254.169.254:80, the node role) is not reachable.
    port_80 = [r for r in rules if any(p["port"] == 80 for p in r.get("ports", []))]
    assert [peer["ipBlock"]["cidr"] for r in port_80 for peer in r["to"]] == [
        "169.254.170.23/32",
        "fd00:ec2::23/128",
    ]
    unrestricted = [r for r in rules if "to" not in r]
    assert unrestricted == [{"ports": [{"port": 443, "protocol": "TCP"}]}]
    # HTTPS to any address is the one open rule, and the policy says why beside it.
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("-https")]
    assert "S3" in policy["metadata"]["annotations"]["nvrx-eks.io/https-egress-to-any-address"]


def test_the_store_runs_as_its_own_account_without_the_trainers_rights(tmp_path):
    docs = _docs(LOCAL, tmp_path)
    (store,) = [d for d in docs if d["kind"] == "Deployment"]
    (job,) = [d for d in docs if d["kind"] == "Job"]
    account = store["spec"]["template"]["spec"]["serviceAccountName"]
    # Not the training account (its Pod Identity role and `get nodes`): one rendered with the job.
    assert account != job["spec"]["template"]["spec"]["serviceAccountName"]
    (rendered,) = [d for d in docs if d["kind"] == "ServiceAccount"]
    assert rendered["metadata"]["name"] == account
    assert rendered["automountServiceAccountToken"] is False
    assert store["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


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


# -- Egress to a Service's ClusterIP under a self-referencing podSelector (VPC CNI policy engine). --------

_WORKLOADS = ("Deployment", "Job", "DaemonSet", "StatefulSet")


def _selects(selector: dict, labels: dict[str, str]) -> bool:
    """A LabelSelector against pod labels (matchLabels and the set-based operators)."""
    if not all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        held = {"In": key in labels and labels[key] in values, "NotIn": labels.get(key) not in values}
        held |= {"Exists": key in labels, "DoesNotExist": key not in labels}
        if not held[op]:
            return False
    return True


def _self_referencing_cluster_ip_egress(docs: list[dict], default_namespace: str) -> list[str]:
    """Each (policy, Service) where an egress podSelector that selects the policy's own pods also selects
    the backends of a Service reached through a ClusterIP: traffic the VPC CNI's policy engine drops
    (aws/amazon-network-policy-controller-k8s#236)."""

    def namespace(doc: dict) -> str:
        return doc["metadata"].get("namespace", default_namespace)

    pods = [
        (namespace(d), d["spec"]["template"]["metadata"].get("labels", {}))
        for d in docs
        if d["kind"] in _WORKLOADS
    ]
    found = []
    for policy in (d for d in docs if d["kind"] == "NetworkPolicy"):
        ns, spec = namespace(policy), policy["spec"]
        own = [labels for pod_ns, labels in pods if pod_ns == ns and _selects(spec["podSelector"], labels)]
        for rule in spec.get("egress") or []:
            for peer in rule.get("to") or []:
                if "podSelector" not in peer:
                    continue
                in_namespace = (
                    (lambda pod_ns: True)
                    if "namespaceSelector" in peer
                    else (lambda pod_ns, ns=ns: pod_ns == ns)
                )
                if not any(_selects(peer["podSelector"], labels) for labels in own):
                    continue
                reached = [
                    lb for pod_ns, lb in pods if in_namespace(pod_ns) and _selects(peer["podSelector"], lb)
                ]
                for svc in (d for d in docs if d["kind"] == "Service"):
                    selector = svc["spec"].get("selector")
                    if svc["spec"].get("clusterIP") == "None" or not selector:
                        continue
                    if any(_selects({"matchLabels": selector}, labels) for labels in reached):
                        found.append(f"{policy['metadata']['name']} -> Service {svc['metadata']['name']}")
    return found


@pytest.mark.parametrize("values_file", sorted(VALUES.glob("*.yaml")), ids=lambda p: p.stem)
def test_no_job_pod_reaches_a_cluster_ip_through_a_self_referencing_egress_rule(values_file, tmp_path):
    """The launchers reach the store at its pod IP (a headless Service): the job's egress rule admits
    the job's own pods, the store among them, and a ClusterIP behind such a rule is dropped."""
    docs = _docs(values_file, tmp_path)
    assert _self_referencing_cluster_ip_egress(docs, "training") == []
    (store,) = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"].endswith("-rdzv")]
    assert store["spec"]["clusterIP"] == "None"
    (port,) = store["spec"]["ports"]
    assert port["port"] == port["targetPort"]  # a headless Service forwards nothing


def test_no_cluster_chart_pod_reaches_a_cluster_ip_through_a_self_referencing_egress_rule(cluster_objects):
    docs = cluster_objects()
    assert any(d["kind"] == "NetworkPolicy" for d in docs)
    assert _self_referencing_cluster_ip_egress(docs, "training") == []


def test_the_check_finds_a_cluster_ip_behind_a_self_referencing_rule(tmp_path):
    """The pattern check itself: the job's store behind a ClusterIP is the case it exists for."""
    docs = _docs(P5, tmp_path)
    for doc in docs:
        if doc["kind"] == "Service" and doc["metadata"]["name"].endswith("-rdzv"):
            del doc["spec"]["clusterIP"]
    assert _self_referencing_cluster_ip_egress(docs, "training") == [
        "llama-8b-p5-2-egress -> Service llama-8b-p5-2-rdzv"
    ]
