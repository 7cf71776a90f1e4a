"""Cluster-level Kubernetes objects the training jobs rely on, as one cdk8s chart.

The CDK stack deploys this chart with `cluster.add_cdk8s_chart(...)` (infra/), and the job tooling
refers to the same names (k8s/names.py), so there is one typed definition of the namespace, the
service account, the FSx volume, the priority classes and the optional Kueue queues.

- The service account carries no IAM annotation: EKS Pod Identity binds the role to
  (namespace, service account) on the AWS side (the stack's pod identity association), so nothing
  about credentials lives in Kubernetes objects.
- The service account may `get` Nodes, and nothing else in the API (`_node_reader`): the trainer pod's
  topology init container reads its own Node's labels for the peer replica's partners.
- The FSx for Lustre volume is statically provisioned (the stack owns the file system): a PV whose CSI
  handle is the file system id, and a PVC bound to it by name with an empty storage class so that no
  dynamic provisioner claims it. https://github.com/kubernetes-sigs/aws-fsx-csi-driver/tree/master/examples/kubernetes/static_provisioning
- Kueue objects are plain ApiObjects (CRDs have no bindings in cdk8s_plus_33.k8s); they are only
  emitted when a queue is asked for, because their CRDs exist only where the Kueue chart is installed.
  With the node check on, the flavor carries the verified label as `nodeLabels`: Kueue adds a flavor's
  nodeLabels to the node selector of the pods it admits, so admitted pods land only on verified nodes.
  Admission itself counts quota, not nodes; only Topology-Aware Scheduling makes admission wait for
  enough matching nodes with free capacity.
- The node check (k8s/node_verification.py) and the dashboards and scrape objects
  (k8s/observability.py) are constructs of their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import cdk8s
from cdk8s_plus_33 import k8s

from nvrx_eks.k8s import names
from nvrx_eks.k8s.node_verification import NodeCheckSpec, NodeVerification
from nvrx_eks.k8s.observability import Monitoring
from nvrx_eks.k8s.rbac import grant
from nvrx_eks.training.node.nodecheck import VERIFIED_LABEL

if TYPE_CHECKING:
    from constructs import Construct

FSX_CSI_DRIVER = "fsx.csi.aws.com"
# The API version of Kueue's objects, for the chart pinned in infra/cluster_pins.py (0.19): v1beta2, which
# 0.15 introduced and later releases serve alone (https://github.com/kubernetes-sigs/kueue/issues/7626).
# ResourceFlavor.nodeLabels, ClusterQueue.resourceGroups / namespaceSelector and
# LocalQueue.clusterQueue are unchanged from v1beta1.
KUEUE_API_VERSION = "kueue.x-k8s.io/v1beta2"
# Kueue 0.19+ evicts and requeues an admitted workload whose pods are not all ready within
# WaitForPodsReady's timeout, and one that stays not-ready longer than its recoveryTimeout after a
# pod fails (both 30 minutes by default, kept here):
# https://github.com/kubernetes-sigs/kueue/pull/11855
# A job's `timeouts.pod_reschedule_s` (a lost node's replacement) must stay below it (tests check the
# shipped values).
KUEUE_PODS_READY_TIMEOUT_S = 1800


PodSecurityLevel = Literal["privileged", "baseline", "restricted"]


def pod_security_labels(enforce: PodSecurityLevel) -> dict[str, str]:
    """Pod Security Admission labels for the training namespace
    (https://kubernetes.io/docs/concepts/security/pod-security-admission/).

    Enforced: `privileged` by default, the strictest level the training pods pass. They need one
    thing `baseline` forbids: a hostPath volume (the node-local checkpoint tier on the NVMe array,
    a dedicated folder, never the array's root). EFA needs no capability: the memory libfabric pins
    is bounded by the container's RLIMIT_MEMLOCK, which the GPU nodes' runtime spec raises
    (infra/constructs/launch_template.py). PSA has no per-pod exemption an EKS user can configure (exemptions
    live in the API server's admission configuration), so the namespace level is the pods' level;
    everything else the pod spec can restrict it does (k8s/job_chart.py: no privilege escalation,
    all other capabilities dropped, RuntimeDefault seccomp, the rendezvous store non-root
    with read-only root filesystems, which is `restricted`). A cluster without the local tier can
    enforce `baseline`.
    `warn` and `audit` stay at `baseline`, so whatever a pod here does beyond it is reported on every
    apply and in the audit log instead of passing silently.
    """
    labels: dict[str, str] = {"pod-security.kubernetes.io/enforce": enforce}
    for mode in ("warn", "audit"):
        labels[f"pod-security.kubernetes.io/{mode}"] = "restricted" if enforce == "restricted" else "baseline"
    return labels


@dataclass(frozen=True, kw_only=True)
class KueueQuota:
    """One ClusterQueue with a single resource flavor, and a LocalQueue in the training namespace."""

    cluster_queue: str = "nvrx-training"
    local_queue: str = "training"
    flavor: str = "gpu-default"
    gpus: int
    efa_devices: int
    cpu: int
    memory_gib: int
    verified_nodes_only: bool = False
    """Put the node check's verified label in the flavor's nodeLabels (set where the check runs)."""


class ClusterObjectsChart(cdk8s.Chart):
    """Namespace, service account, FSx PV/PVC, priority classes and (optionally) Kueue queues."""

    def __init__(
        self,
        scope: Construct,
        id: str,  # noqa: A002 - the construct id, named as every construct names it
        *,
        namespace: str,
        service_account: str,
        fsx_file_system_id: str,
        fsx_dns_name: str,
        fsx_mount_name: str,
        storage_capacity_gib: int,
        pvc_name: str,
        pv_name: str | None = None,
        kueue: KueueQuota | None = None,
        node_check: NodeCheckSpec | None = None,
        pod_monitors: bool = False,
        labels: dict[str, str] | None = None,
        pod_security: PodSecurityLevel = "privileged",
    ) -> None:
        super().__init__(scope, id, labels={"app.kubernetes.io/name": names.APP, **(labels or {})})
        ns = k8s.KubeNamespace(
            self,
            "namespace",
            metadata=k8s.ObjectMeta(name=namespace, labels=pod_security_labels(pod_security)),
        )
        sa = k8s.KubeServiceAccount(
            self,
            "service-account",
            metadata=k8s.ObjectMeta(name=service_account, namespace=namespace),
            # No container gets a token unless it asks: only the trainer pod's topology init container
            # mounts one (k8s/job_chart.py topology_init); the trainer itself never talks to the API.
            automount_service_account_token=False,
        )
        sa.add_dependency(ns)
        self._node_reader(namespace=namespace, service_account=service_account)
        pv_name = pv_name or f"{pvc_name}-pv"
        self._fsx_volume(
            namespace=namespace,
            pv_name=pv_name,
            pvc_name=pvc_name,
            file_system_id=fsx_file_system_id,
            dns_name=fsx_dns_name,
            mount_name=fsx_mount_name,
            capacity_gib=storage_capacity_gib,
        ).add_dependency(ns)
        self._priority_classes()
        if kueue is not None:
            self._kueue(namespace=namespace, quota=kueue).add_dependency(ns)
        if node_check is not None:
            NodeVerification(self, "node-check", namespace=namespace, spec=node_check).node.add_dependency(ns)
        Monitoring(self, "monitoring", namespace=namespace, pod_monitors=pod_monitors).node.add_dependency(ns)

    def _node_reader(self, *, namespace: str, service_account: str) -> None:
        """`get` on nodes for the training service account: the topology init container reads its own
        Node's zone and network-node labels (k8s/job_chart.py topology_init) for the peer replica.

        Here, not in the job chart: Nodes are cluster-scoped, so the grant is a ClusterRole, which the
        stack deploys once with the cluster's admin rights, while rendering and applying a job then needs
        no right to create RBAC. A job run as another service account gets no grant, and its pods fall
        back to the zone (saying so).
        """
        grant(
            self,
            "node-reader",
            name=f"{namespace}-{service_account}-node-reader",
            labels={names.COMPONENT_LABEL: "trainer"},
            rules=[
                # get: one Node by name, the pod's own (spec.nodeName). No list or watch: the token
                # cannot enumerate the cluster's nodes. RBAC cannot narrow `get` to the pod's own node
                # (resourceNames are fixed names), and reads pass no admission policy; what it shows of a
                # node it can name (labels, capacity, addresses, conditions) grants nothing. No write.
                k8s.PolicyRule(api_groups=[""], resources=["nodes"], verbs=["get"]),
            ],
            service_account=service_account,
            namespace=namespace,
            cluster_wide=True,
        )

    def _fsx_volume(
        self,
        *,
        namespace: str,
        pv_name: str,
        pvc_name: str,
        file_system_id: str,
        dns_name: str,
        mount_name: str,
        capacity_gib: int,
    ) -> k8s.KubePersistentVolumeClaim:
        storage = k8s.Quantity.from_string(f"{capacity_gib}Gi")
        k8s.KubePersistentVolume(
            self,
            "fsx-pv",
            metadata=k8s.ObjectMeta(name=pv_name),
            spec=k8s.PersistentVolumeSpec(
                capacity={"storage": storage},
                volume_mode="Filesystem",
                access_modes=["ReadWriteMany"],
                # Retain: deleting the claim must never delete checkpoints.
                persistent_volume_reclaim_policy="Retain",
                storage_class_name="",
                # flock: checkpoint writers on several nodes rely on POSIX locks.
                mount_options=["flock"],
                claim_ref=k8s.ObjectReference(namespace=namespace, name=pvc_name),
                csi=k8s.CsiPersistentVolumeSource(
                    driver=FSX_CSI_DRIVER,
                    volume_handle=file_system_id,
                    volume_attributes={"dnsname": dns_name, "mountname": mount_name},
                ),
            ),
        )
        return k8s.KubePersistentVolumeClaim(
            self,
            "fsx-pvc",
            metadata=k8s.ObjectMeta(name=pvc_name, namespace=namespace),
            spec=k8s.PersistentVolumeClaimSpec(
                access_modes=["ReadWriteMany"],
                storage_class_name="",
                volume_name=pv_name,
                resources=k8s.VolumeResourceRequirements(requests={"storage": storage}),
            ),
        )

    def _priority_classes(self) -> None:
        k8s.KubePriorityClass(
            self,
            "store-priority",
            metadata=k8s.ObjectMeta(name=names.STORE_PRIORITY_CLASS),
            value=names.STORE_PRIORITY_VALUE,
            global_default=False,
            description="Rendezvous store of a training job: losing it stops every node of the job.",
        )
        k8s.KubePriorityClass(
            self,
            "training-priority",
            metadata=k8s.ObjectMeta(name=names.TRAINING_PRIORITY_CLASS),
            value=names.TRAINING_PRIORITY_VALUE,
            global_default=False,
            # A replacement pod must not preempt a running rank of the same or another job.
            preemption_policy="Never",
            description="Training pods of nvrx-eks jobs.",
        )

    def _kueue(self, *, namespace: str, quota: KueueQuota) -> cdk8s.ApiObject:
        flavor = cdk8s.ApiObject(
            self,
            "kueue-flavor",
            api_version=KUEUE_API_VERSION,
            kind="ResourceFlavor",
            metadata=cdk8s.ApiObjectMetadata(name=quota.flavor),
        )
        if quota.verified_nodes_only:
            flavor.add_json_patch(cdk8s.JsonPatch.add("/spec", {"nodeLabels": {VERIFIED_LABEL: "true"}}))
        resources = [
            ("cpu", str(quota.cpu)),
            ("memory", f"{quota.memory_gib}Gi"),
            ("nvidia.com/gpu", str(quota.gpus)),
            ("vpc.amazonaws.com/efa", str(quota.efa_devices)),
        ]
        cdk8s.ApiObject(
            self,
            "kueue-cluster-queue",
            api_version=KUEUE_API_VERSION,
            kind="ClusterQueue",
            metadata=cdk8s.ApiObjectMetadata(name=quota.cluster_queue),
        ).add_json_patch(
            cdk8s.JsonPatch.add(
                "/spec",
                {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                    "resourceGroups": [
                        {
                            "coveredResources": [name for name, _ in resources],
                            "flavors": [
                                {
                                    "name": quota.flavor,
                                    "resources": [
                                        {"name": name, "nominalQuota": value} for name, value in resources
                                    ],
                                }
                            ],
                        }
                    ],
                },
            )
        )
        local = cdk8s.ApiObject(
            self,
            "kueue-local-queue",
            api_version=KUEUE_API_VERSION,
            kind="LocalQueue",
            metadata=cdk8s.ApiObjectMetadata(name=quota.local_queue, namespace=namespace),
        )
        local.add_json_patch(cdk8s.JsonPatch.add("/spec", {"clusterQueue": quota.cluster_queue}))
        return local
