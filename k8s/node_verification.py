"""The node-check DaemonSet and its permissions, as one construct of the cluster chart.

`python -m nvrx_eks.training.node.nodecheck` runs on every GPU node (label `nvrx-eks/gpu=true`, tolerating the
GPU taint and its own `nvrx-eks/unverified` taint) and records its verdict on its own Node: the
`nvrx-eks/verified` label with a time, or the `nvrx-eks/unverified` taint, a node condition and an
Event. Training pods require the label (k8s/job_chart.py).

Least privilege, and how "its own node only" is enforced:

- RBAC cannot say "the node this pod runs on": a ClusterRole's resourceNames are fixed names, and
  one DaemonSet's pods share one service account. So the ClusterRole grants `get`/`patch` on nodes
  and `patch` on nodes/status (no list, no watch, no delete, no other resource), and a
  ValidatingAdmissionPolicy pins every node write of this service account to the node its token was
  issued for. A pod's bound service account token carries the node it is scheduled on, and the API
  server puts it in the request's user info as the extra `authentication.kubernetes.io/node-name`
  (ServiceAccountTokenPodNodeInfo, on by default since Kubernetes 1.30, GA in 1.32): the same pattern
  as the NodeRestriction admission plugin, for kubelets. A token without that extra (not bound to a
  pod) is refused, so a stolen, re-issued token cannot be pointed at another node either.
  https://kubernetes.io/docs/reference/access-authn-authz/service-accounts-admin/#bound-service-account-token-volume
- The same policy lets the service account change only what the check owns: the labels
  `nvrx-eks/verified` and `nvrx-eks/verified-at`, the annotation `nvrx-eks/verification`, the
  `nvrx-eks/unverified` taint and the `NvrxEksVerified` condition; every other label, annotation,
  taint, condition and spec field stays as it was (tests/k8s/test_k8s_node_policy.py runs the CEL).
- Events: a namespaced Role (create only) in the check's own namespace.
- The pod: no GPU or EFA request (it must not take devices from training; NVIDIA_VISIBLE_DEVICES=all
  lets the NVIDIA runtime show it every GPU, as dcgm-exporter does), the host's /sys and
  /dev/infiniband read-only, a subdirectory of the NVMe array (its root holds kubelet state),
  the training image's non-root uid with no capability, no privilege escalation, a read-only root
  filesystem and the runtime's default seccomp filter. The probe folder on the array is created
  root-owned by the kubelet: the job chart's CHOWN-only init container hands it to that uid first.
- Its network: a NetworkPolicy admits nothing in (it serves nothing) and lets out only DNS, HTTPS
  (the API server) and the DCGM host engine's port, so it cannot reach the instance metadata service.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from cdk8s_plus_33 import k8s
from constructs import Construct

from nvrx_eks.k8s import names
from nvrx_eks.k8s.job_chart import (
    HTTPS_PORT,
    RUNTIME_DEFAULT_SECCOMP,
    dns_egress,
    network_policy,
    owner_setup_container,
    policy_port,
    trainer_security,
)
from nvrx_eks.k8s.rbac import grant
from nvrx_eks.kitcore.pins import TRAINER_UID
from nvrx_eks.training.node import nodecheck

NODE_CHECK = nodecheck.COMPONENT
"""The node check's DaemonSet, service account and RBAC objects, and its Events' reporting component."""
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
_SA_USER = "system:serviceaccount:{namespace}:{name}"
HOST_SYS = "/host/sys"
HOST_DEV = "/host/dev"
HOST_NVME = "/host/local-nvme"
# nv-hostengine's TCP port when started without --port
# (https://docs.nvidia.com/datacenter/dcgm/latest/reference/command-line-reference/nv-hostengine.html).
DCGM_PORT = 5555


@dataclass(frozen=True, kw_only=True)
class NodeCheckSpec:
    """Where and how often the node check runs."""

    image: str
    """The training image (it carries the trainer package, nvidia-smi comes from the NVIDIA runtime)."""
    interval_s: int = int(nodecheck.DEFAULT_INTERVAL_S)
    local_nvme_path: str = names.NVME_RAID_ROOT
    """The RAID0 mount of the instance-store NVMe."""
    dcgm_host: str | None = None
    """nv-hostengine address for `dcgmi diag` (None: the node's own engine, at the node's IP on
    DCGM_PORT, where the node monitoring agent serves it; the check is skipped, with a note, where
    dcgmi or a host engine is absent)."""
    extra_tolerations: tuple[tuple[str, str], ...] = ()
    """(key, effect) of taints the cluster config adds to GPU node groups: the check runs there too."""


def _policy_validations() -> list[k8s.Validation]:
    """CEL rules on every node write by the check's service account."""
    owned_labels = [nodecheck.VERIFIED_LABEL, nodecheck.VERIFIED_AT_LABEL]
    owned_annotations = [nodecheck.REPORT_ANNOTATION]

    def unchanged_except(field: str, owned: list[str]) -> str:
        # Both directions: nothing the check does not own added, removed or changed. The owned keys are
        # named one by one: the node groups' own labels share the prefix (nvrx-eks/gpu, .../efa).
        keys = "[" + ", ".join(f"'{k}'" for k in owned) + "]"
        new, old = f"object.metadata.?{field}.orValue({{}})", f"oldObject.metadata.?{field}.orValue({{}})"
        return (
            f"{new}.all(k, k in {keys} || (k in {old} && {old}[k] == {new}[k])) && "
            f"{old}.all(k, k in {keys} || k in {new})"
        )

    others = f"filter(t, t.key != '{nodecheck.UNVERIFIED_TAINT}')"
    conditions = f"filter(c, c.type != '{nodecheck.CONDITION_TYPE}')"
    return [
        k8s.Validation(
            expression=(
                f"'{NODE_NAME_EXTRA}' in request.userInfo.extra && "
                f"request.userInfo.extra['{NODE_NAME_EXTRA}'].exists_one(n, n == object.metadata.name)"
            ),
            message_expression=(
                "'the node check may change only the node its pod runs on, not ' + object.metadata.name"
            ),
            reason="Forbidden",
        ),
        k8s.Validation(
            expression=unchanged_except("labels", owned_labels),
            message=f"the node check may change only the labels {', '.join(owned_labels)}",
            reason="Forbidden",
        ),
        k8s.Validation(
            expression=unchanged_except("annotations", owned_annotations),
            message=f"the node check may change only the annotation {owned_annotations[0]}",
            reason="Forbidden",
        ),
        k8s.Validation(
            expression=(
                f"object.spec.?taints.orValue([]).{others} == oldObject.spec.?taints.orValue([]).{others}"
            ),
            message=f"the node check may add or remove only the {nodecheck.UNVERIFIED_TAINT} taint",
            reason="Forbidden",
        ),
        k8s.Validation(
            expression=(
                "object.spec.?unschedulable.orValue(false) == oldObject.spec.?unschedulable.orValue(false)"
                " && object.spec.?providerID == oldObject.spec.?providerID"
                " && object.spec.?podCIDRs == oldObject.spec.?podCIDRs"
            ),
            message="the node check may not cordon a node or change its spec",
            reason="Forbidden",
        ),
        k8s.Validation(
            expression=(
                f"request.subResource != 'status' || "
                f"object.status.?conditions.orValue([]).{conditions} == "
                f"oldObject.status.?conditions.orValue([]).{conditions}"
            ),
            message=f"the node check may set only the {nodecheck.CONDITION_TYPE} condition",
            reason="Forbidden",
        ),
    ]


class NodeVerification(Construct):
    """Service account, RBAC, admission policy and DaemonSet of the node check."""

    def __init__(self, scope: Construct, id: str, *, namespace: str, spec: NodeCheckSpec) -> None:  # noqa: A002
        super().__init__(scope, id)
        labels = {"app.kubernetes.io/name": names.APP, names.COMPONENT_LABEL: NODE_CHECK}
        meta = k8s.ObjectMeta(name=NODE_CHECK, namespace=namespace, labels=labels)
        cluster_meta = k8s.ObjectMeta(name=NODE_CHECK, labels=labels)
        k8s.KubeServiceAccount(self, "service-account", metadata=meta, automount_service_account_token=True)
        grant_own = partial(
            grant, self, name=NODE_CHECK, labels=labels, service_account=NODE_CHECK, namespace=namespace
        )
        grant_own(
            "cluster-role",
            rules=[
                # get: its node's instance type and the node monitoring agent's conditions; patch: the
                # verdict. Which node, and which fields, the admission policy below decides.
                k8s.PolicyRule(api_groups=[""], resources=["nodes"], verbs=["get", "patch"]),
                k8s.PolicyRule(api_groups=[""], resources=["nodes/status"], verbs=["patch"]),
            ],
            cluster_wide=True,
        )
        # The verdict as an Event on the Node (kubectl describe node lists it).
        events = [k8s.PolicyRule(api_groups=[""], resources=["events"], verbs=["create"])]
        grant_own("events-role", rules=events, cluster_wide=False)
        user = _SA_USER.format(namespace=namespace, name=NODE_CHECK)
        k8s.KubeValidatingAdmissionPolicy(
            self,
            "own-node-only",
            metadata=cluster_meta,
            spec=k8s.ValidatingAdmissionPolicySpec(
                # Fail closed: if the policy cannot be evaluated, the write is refused.
                failure_policy="Fail",
                match_constraints=k8s.MatchResources(
                    resource_rules=[
                        k8s.NamedRuleWithOperations(
                            api_groups=[""],
                            api_versions=["v1"],
                            operations=["UPDATE"],  # a PATCH is admitted as an UPDATE
                            resources=["nodes", "nodes/status"],
                        )
                    ]
                ),
                match_conditions=[
                    k8s.MatchCondition(
                        name="node-check-service-account", expression=f"request.userInfo.username == '{user}'"
                    )
                ],
                validations=_policy_validations(),
            ),
        )
        k8s.KubeValidatingAdmissionPolicyBinding(
            self,
            "own-node-only-binding",
            metadata=cluster_meta,
            spec=k8s.ValidatingAdmissionPolicyBindingSpec(
                policy_name=NODE_CHECK, validation_actions=["Deny"]
            ),
        )
        self._daemon_set(namespace=namespace, labels=labels, spec=spec)
        self._network_policy(namespace=namespace, labels=labels, spec=spec)

    def _network_policy(self, *, namespace: str, labels: dict[str, str], spec: NodeCheckSpec) -> None:
        """Nothing in; out only what the check calls: DNS, the API server (HTTPS, through the
        `kubernetes` Service to the control plane's addresses, which the chart does not know) and the
        DCGM host engine (its address is a setting, so by port)."""
        _, colon, port = (spec.dcgm_host or "").rpartition(":")
        dcgm_port = int(port) if colon and port.isdigit() else DCGM_PORT
        network_policy(
            self,
            "network-policy",
            metadata=k8s.ObjectMeta(name=NODE_CHECK, namespace=namespace, labels=labels),
            pod_selector=k8s.LabelSelector(match_labels=labels),
            ingress=[],
            egress=[
                dns_egress(),
                k8s.NetworkPolicyEgressRule(ports=[policy_port(HTTPS_PORT), policy_port(dcgm_port)]),
            ],
        )

    def _daemon_set(self, *, namespace: str, labels: dict[str, str], spec: NodeCheckSpec) -> None:
        def host_path(name: str, path: str, kind: str) -> k8s.Volume:
            return k8s.Volume(name=name, host_path=k8s.HostPathVolumeSource(path=path, type=kind))

        nvme_mount = k8s.VolumeMount(name="local-nvme", mount_path=HOST_NVME)
        container = _node_check_container(spec, nvme_mount)
        k8s.KubeDaemonSet(
            self,
            "daemon-set",
            metadata=k8s.ObjectMeta(name=NODE_CHECK, namespace=namespace, labels=labels),
            spec=k8s.DaemonSetSpec(
                selector=k8s.LabelSelector(match_labels=labels),
                update_strategy=k8s.DaemonSetUpdateStrategy(
                    type="RollingUpdate",
                    rolling_update=k8s.RollingUpdateDaemonSet(
                        max_unavailable=k8s.IntOrString.from_string("25%")
                    ),
                ),
                template=k8s.PodTemplateSpec(
                    metadata=k8s.ObjectMeta(labels=labels),
                    spec=k8s.PodSpec(
                        service_account_name=NODE_CHECK,
                        automount_service_account_token=True,  # the node patches need it
                        node_selector={names.GPU_NODE_LABEL: "true"},
                        tolerations=[
                            k8s.Toleration(
                                key=names.GPU_TAINT_KEY, operator="Exists", effect=names.GPU_TAINT_EFFECT
                            ),
                            # It must keep running on a node it tainted, to lift the taint again.
                            k8s.Toleration(
                                key=nodecheck.UNVERIFIED_TAINT, operator="Exists", effect="NoSchedule"
                            ),
                            *(
                                k8s.Toleration(key=key, operator="Exists", effect=effect)
                                for key, effect in spec.extra_tolerations
                            ),
                        ],
                        # The runtime's default seccomp filter for both containers; the pod's fsGroup
                        # makes the projected service account token readable by the non-root uid.
                        security_context=k8s.PodSecurityContext(
                            seccomp_profile=RUNTIME_DEFAULT_SECCOMP, fs_group=TRAINER_UID
                        ),
                        init_containers=[
                            owner_setup_container(
                                image=spec.image,
                                pull="IfNotPresent",
                                folders=[HOST_NVME],
                                mounts=[nvme_mount],
                            )
                        ],
                        containers=[container],
                        volumes=[
                            host_path("host-sys", "/sys", "Directory"),
                            # Absent when the EFA driver is not loaded: created empty, the check then
                            # reports 0 devices instead of the pod never starting.
                            host_path("host-infiniband", "/dev/infiniband", "DirectoryOrCreate"),
                            host_path(
                                "local-nvme", f"{spec.local_nvme_path}/{NODE_CHECK}", "DirectoryOrCreate"
                            ),
                        ],
                        termination_grace_period_seconds=10,
                    ),
                ),
            ),
        )


def _node_check_container(spec: NodeCheckSpec, nvme_mount: k8s.VolumeMount) -> k8s.Container:
    """`python -m nvrx_eks.training.node.nodecheck` with its Node's name, the node's DCGM engine and
    every GPU visible (none allocated)."""
    command = ["python", "-m", "nvrx_eks.training.node.nodecheck", f"--interval-s={spec.interval_s}"]
    if spec.dcgm_host:
        command.append(f"--dcgm-host={spec.dcgm_host}")

    def field(path: str) -> k8s.EnvVarSource:
        return k8s.EnvVarSource(field_ref=k8s.ObjectFieldSelector(field_path=path))

    return k8s.Container(
        name="nodecheck",
        image=spec.image,
        image_pull_policy="IfNotPresent",
        command=command,
        env=[
            k8s.EnvVar(name="NODE_NAME", value_from=field("spec.nodeName")),
            k8s.EnvVar(name="POD_NAMESPACE", value_from=field("metadata.namespace")),
            # dcgmi's own default is localhost, the pod itself: the engine is the node's (the
            # DCGM exporter reaches it the same way, infra/addon_values.py).
            *(
                []
                if spec.dcgm_host
                else [k8s.EnvVar(name="NVRX_EKS_DCGM_HOST", value_from=field("status.hostIP"))]
            ),
            # Every GPU visible, none allocated (the NVIDIA runtime is the AL2023 NVIDIA AMI's
            # default); utility: nvidia-smi and NVML only.
            k8s.EnvVar(name="NVIDIA_VISIBLE_DEVICES", value="all"),
            k8s.EnvVar(name="NVIDIA_DRIVER_CAPABILITIES", value="utility"),
            k8s.EnvVar(name="PYTHONDONTWRITEBYTECODE", value="1"),
        ],
        resources=k8s.ResourceRequirements(
            requests={
                "cpu": k8s.Quantity.from_string("100m"),
                "memory": k8s.Quantity.from_string("256Mi"),
            },
            limits={"memory": k8s.Quantity.from_string("1Gi")},
        ),
        volume_mounts=[
            k8s.VolumeMount(name="host-sys", mount_path=HOST_SYS, read_only=True),
            k8s.VolumeMount(name="host-infiniband", mount_path=f"{HOST_DEV}/infiniband", read_only=True),
            nvme_mount,
        ],
        # The training image's uid, no capability, read-only root filesystem (job_chart.trainer_security).
        security_context=trainer_security(),
    )
