"""Cluster add-ons behind one small contract, each pinned in infra/cluster_pins.py.

An add-on has a name, the names it depends on, and `deploy(ctx)`. `deploy_addons` checks the
dependencies at synth (a missing one is an `AddonError` naming both), deploys in dependency order
and wires CloudFormation dependencies so EKS installs them in that order too.
(After the add-on contract of aws-quickstart/cdk-eks-blueprints.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

from aws_cdk import Annotations, Duration
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam

from nvrx_eks.infra import cluster_pins, nag
from nvrx_eks.infra.addon_values import (
    CLOUDWATCH_CONFIGURATION,
    DCGM_EXPORTER_REMOTE_ENGINE,
    NODE_MONITORING_CONFIGURATION,
    VPC_CNI_CONFIGURATION,
)
from nvrx_eks.k8s import names
from nvrx_eks.kitcore import pins
from nvrx_eks.kitcore.configio import merge
from nvrx_eks.training.node.nodecheck import UNVERIFIED_TAINT

if TYPE_CHECKING:
    from collections.abc import Sequence

    from constructs import Construct, IConstruct


class AddonError(ValueError):
    """An add-on set that cannot be deployed (missing dependency, duplicate)."""


@dataclass
class AddonContext:
    """What add-ons may use: the cluster, its version, and constructs to depend on."""

    scope: Construct
    cluster: eks.Cluster
    kubernetes_version: str
    node_dependencies: Sequence[IConstruct]
    """Node groups that must exist before workloads are installed (coredns needs nodes to go ACTIVE)."""
    deployed: dict[str, IConstruct] = field(default_factory=dict)


class Addon(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def depends_on(self) -> tuple[str, ...]: ...

    def deploy(self, ctx: AddonContext) -> IConstruct: ...


def _gpu_scheduling(label: str, taints: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
    """Values that put a DaemonSet on (tainted) GPU nodes of this kit, and nowhere else.

    `taints`: (key, effect) of the taints a config adds to its GPU groups beside the kit's own; a
    device plugin kept off a node by one of them leaves that node's GPUs or EFA devices unadvertised,
    and every pod that requests them Pending.
    """
    tolerations = [
        {"key": key, "operator": "Exists", "effect": effect} for key, effect in _gpu_taints(taints)
    ]
    return {
        "tolerations": tolerations,
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": label, "operator": "In", "values": ["true"]}]}
                    ]
                }
            }
        },
    }


def _gpu_taints(taints: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The kit's GPU taint, the node check's and the config's own, each (key, effect) once, in order.

    The node check taints a node it has not verified (training/node/nodecheck.py); the device plugins
    and the DCGM exporter are what verifies it (the GPUs and EFA devices advertised, their health
    exported), so one re-created on such a node (a rollout, an eviction) must start there, or the node
    stays unverified for want of them."""
    kit = [(names.GPU_TAINT_KEY, names.GPU_TAINT_EFFECT), (UNVERIFIED_TAINT, "NoSchedule")]
    return list(dict.fromkeys([*kit, *taints]))


def pod_identity_principal(cluster: eks.ICluster, *, namespace: str, service_account: str) -> iam.IPrincipal:
    """EKS Pod Identity as the trusted principal, for one service account of this cluster only.

    EKS Pod Identity assumes the role with sts:AssumeRole and sts:TagSession, and tags the session with
    the pod's cluster, namespace and service account; the trust policy restricts the role with those
    request tags (https://docs.aws.amazon.com/eks/latest/userguide/pod-id-role.html, the tag names in
    https://docs.aws.amazon.com/eks/latest/userguide/pod-id-abac.html#pod-id-abac-tags). The guide
    names no aws:SourceArn / aws:SourceAccount condition for this principal: a SourceArn of the cluster
    would not match what Pod Identity sends, and every pod's AssumeRole would be denied.
    """
    return (
        iam.ServicePrincipal("pods.eks.amazonaws.com")
        .with_conditions(
            {
                "StringEquals": {
                    "aws:RequestTag/eks-cluster-arn": cluster.cluster_arn,
                    "aws:RequestTag/kubernetes-namespace": namespace,
                    "aws:RequestTag/kubernetes-service-account": service_account,
                }
            }
        )
        .with_session_tags()
    )


def _pod_identity_role(
    scope: Construct,
    id: str,  # noqa: A002
    *,
    cluster: eks.ICluster,
    namespace: str,
    service_account: str,
    statements: Sequence[iam.PolicyStatement],
) -> iam.Role:
    role = iam.Role(
        scope,
        id,
        assumed_by=pod_identity_principal(cluster, namespace=namespace, service_account=service_account),
    )
    for statement in statements:
        role.add_to_policy(statement)
    return role


@dataclass(frozen=True)
class ManagedAddon:
    """An EKS managed add-on at the pinned version for the cluster's Kubernetes minor."""

    name: str
    depends_on: tuple[str, ...] = ()
    needs_nodes: bool = False
    configuration: dict[str, Any] | None = None
    service_account: str | None = None
    namespace: str = "kube-system"
    """Where the add-on runs its service account (the Pod Identity association and the role's trust)."""
    policy: tuple[iam.PolicyStatement, ...] = ()
    managed_policies: tuple[str, ...] = ()
    wildcard_reason: str = ""
    """Why a statement of `policy` needs Resource '*' (required when one does)."""

    def deploy(self, ctx: AddonContext) -> IConstruct:
        pin = cluster_pins.EKS_ADDONS[self.name]
        associations = None
        if self.service_account is not None:
            role = _pod_identity_role(
                ctx.scope,
                f"{_camel(self.name)}Role",
                cluster=cast("eks.ICluster", ctx.cluster),  # one: eks_v2's stubs do not see it
                namespace=self.namespace,
                service_account=self.service_account,
                statements=self.policy,
            )
            for managed in self.managed_policies:
                role.add_managed_policy(iam.ManagedPolicy.from_aws_managed_policy_name(managed))
                nag.acknowledge(
                    role,
                    "IAM4",
                    f"the policy the {self.name} add-on documents for its service account",
                    finding=nag.managed_policy_finding(managed),
                )
            if any("*" in statement.resources for statement in self.policy):
                nag.acknowledge(role, "IAM5", self.wildcard_reason, finding="Resource::*")
            associations = [
                eks.CfnAddon.PodIdentityAssociationProperty(
                    role_arn=role.role_arn, service_account=self.service_account
                )
            ]
        addon = eks.CfnAddon(
            ctx.scope,
            _camel(self.name),
            addon_name=self.name,
            cluster_name=ctx.cluster.cluster_name,
            addon_version=pin.version_for(ctx.kubernetes_version),
            # Take over the copies EKS bootstraps (vpc-cni, coredns, kube-proxy) on create and update.
            resolve_conflicts="OVERWRITE",
            preserve_on_delete=False,
            configuration_values=json.dumps(self.configuration) if self.configuration else None,
            pod_identity_associations=associations,
        )
        if self.needs_nodes:
            for dependency in ctx.node_dependencies:
                addon.node.add_dependency(dependency)
        return addon


@dataclass(frozen=True)
class HelmAddon:
    """A Helm chart (where EKS has no managed add-on), installed by the cluster's kubectl handler."""

    name: str
    depends_on: tuple[str, ...] = ()
    values: dict[str, Any] = field(default_factory=dict)
    wait: bool = False
    """Helm --wait: the custom resource completes only once the release's pods are ready (and
    its webhooks have endpoints); what depends on the chart is applied after that."""
    timeout: Duration | None = None

    def deploy(self, ctx: AddonContext) -> IConstruct:
        pin = cluster_pins.HELM_CHARTS[self.name]
        chart = ctx.cluster.add_helm_chart(
            _camel(self.name),
            chart=pin.chart,
            repository=pin.repository,
            version=pin.version,
            namespace=pin.namespace,
            release=self.name,
            # The pinned images win over anything the kit's values say about them.
            values=merge(self.values, chart_image_values(pin)),
            wait=self.wait,
            timeout=self.timeout,
        )
        for image in pin.images:
            if image.digest == pins.UNPUBLISHED_SHA256:
                Annotations.of(chart).add_warning_v2(IMAGE_BY_TAG_WARNING, by_tag_message(self.name, image))
        for dependency in ctx.node_dependencies:
            chart.node.add_dependency(dependency)
        return chart


IMAGE_BY_TAG_WARNING = "nvrx-eks:image-by-tag"
"""The id of the synth warning for an image whose digest infra/cluster_pins.py does not hold yet."""


def chart_image_values(pin: cluster_pins.ChartPin) -> dict[str, Any]:
    """The chart values naming each of the chart's images: REPOSITORY and TAG@DIGEST, which its
    template joins to REPOSITORY:TAG@DIGEST; the tag alone while the digest is unpublished."""
    values: dict[str, Any] = {}
    for image in pin.images:
        node = values
        for key in image.values_key.split("."):
            node = node.setdefault(key, {})
        pinned = image.digest != pins.UNPUBLISHED_SHA256
        node.update(repository=image.repository, tag=f"{image.tag}@{image.digest}" if pinned else image.tag)
    return values


def by_tag_message(chart: str, image: cluster_pins.ChartImage) -> str:
    """What synth says of a chart image that is pulled by tag (preflight fails on it, naming the same fix)."""
    return (
        f"{chart}: {image.reference} is pulled by tag, its digest is not in infra/cluster_pins.py; "
        f"{cluster_pins.IMAGE_PIN_FIX}"
    )


# The FSx CSI controller only needs to describe file systems for a statically provisioned volume;
# dynamic provisioning (not used: the stack owns the file system) would need create/delete rights.
_FSX_CSI_POLICY = (
    iam.PolicyStatement(
        actions=["fsx:DescribeFileSystems", "fsx:DescribeDataRepositoryAssociations"], resources=["*"]
    ),
)


# Kueue's webhooks fail closed: its ResourceFlavor / ClusterQueue / LocalQueue can be applied only
# once the controller serves (kubernetes-sigs/kueue#3794). Two replicas (leader election) and a PDB
# keep it serving through a system-node drain; wait=True makes the Helm custom resource complete only
# when the pods are ready, and the cluster objects depend on it (infra/stacks/cluster_stack.py).
KUEUE_VALUES = {
    "controllerManager": {
        "replicas": 2,
        "podDisruptionBudget": {"enabled": True, "minAvailable": 1},
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": {"control-plane": "controller-manager"}},
            }
        ],
    }
}
KUEUE_WAIT_TIMEOUT = Duration.minutes(10)


def standard_addons(
    *, cloudwatch_observability: bool, kueue: bool, gpu_taints: Sequence[tuple[str, str]] = ()
) -> list[Addon]:
    """The kit's add-on set for GPU training; `gpu_taints`: (key, effect) the config's GPU groups add."""
    addons: list[Addon] = [
        ManagedAddon("vpc-cni", configuration=VPC_CNI_CONFIGURATION),
        ManagedAddon("kube-proxy"),
        ManagedAddon("eks-pod-identity-agent"),
        ManagedAddon("coredns", depends_on=("vpc-cni",), needs_nodes=True),
        ManagedAddon(
            "aws-fsx-csi-driver",
            depends_on=("eks-pod-identity-agent",),
            needs_nodes=True,
            service_account="fsx-csi-controller-sa",
            policy=_FSX_CSI_POLICY,
            wildcard_reason="fsx:Describe* calls support no resource-level permissions (Resource must be *)",
            # Its node DaemonSet tolerates all taints by default (chart value node.tolerateAllTaints),
            # so it runs on the tainted GPU nodes that mount the volume.
        ),
        # Reports GPU (XID, NVLink), kernel and network faults as node conditions; node auto-repair
        # on the GPU node groups acts on them.
        ManagedAddon(
            "eks-node-monitoring-agent", needs_nodes=True, configuration=NODE_MONITORING_CONFIGURATION
        ),
        HelmAddon("nvidia-device-plugin", values=_gpu_scheduling(names.GPU_NODE_LABEL, gpu_taints)),
        HelmAddon("aws-efa-k8s-device-plugin", values=_gpu_scheduling(names.EFA_NODE_LABEL, gpu_taints)),
        HelmAddon(
            "dcgm-exporter",
            depends_on=("nvidia-device-plugin", "eks-node-monitoring-agent"),
            values={
                **_gpu_scheduling(names.GPU_NODE_LABEL, gpu_taints),
                **DCGM_EXPORTER_REMOTE_ENGINE,
                "serviceMonitor": {"enabled": False},
            },
        ),
    ]
    if cloudwatch_observability:
        addons.append(
            ManagedAddon(
                "amazon-cloudwatch-observability",
                depends_on=("eks-pod-identity-agent",),
                needs_nodes=True,
                service_account="cloudwatch-agent",
                namespace="amazon-cloudwatch",
                configuration=CLOUDWATCH_CONFIGURATION,
                managed_policies=("CloudWatchAgentServerPolicy",),
            )
        )
    if kueue:
        addons.append(HelmAddon("kueue", values=KUEUE_VALUES, wait=True, timeout=KUEUE_WAIT_TIMEOUT))
    return addons


def deploy_addons(ctx: AddonContext, addons: Sequence[Addon]) -> dict[str, IConstruct]:
    """Deploy `addons` in dependency order; refuse unknown or missing dependencies at synth."""
    by_name: dict[str, Addon] = {}
    for addon in addons:
        if addon.name in by_name:
            raise AddonError(f"add-on {addon.name!r} is listed twice")
        by_name[addon.name] = addon
    for addon in addons:
        missing = [dep for dep in addon.depends_on if dep not in by_name]
        if missing:
            raise AddonError(
                f"add-on {addon.name!r} needs {', '.join(missing)}, which is not in the add-on set"
            )
    visiting: set[str] = set()

    def visit(name: str) -> IConstruct:
        if name in ctx.deployed:
            return ctx.deployed[name]
        if name in visiting:
            raise AddonError(f"add-on dependency cycle through {name!r}")
        visiting.add(name)
        addon = by_name[name]
        upstream = [visit(dep) for dep in addon.depends_on]
        construct = addon.deploy(ctx)
        for dep in upstream:
            construct.node.add_dependency(dep)
        ctx.deployed[name] = construct
        return construct

    for addon in addons:
        visit(addon.name)
    return dict(ctx.deployed)


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("-"))
