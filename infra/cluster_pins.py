"""Every version the cluster runs, in one place: Kubernetes versions, EKS managed add-ons, Helm charts.

Beside the images' pins (kitcore/pins.py), not in them: the images copy kitcore/ and are tagged by a
hash of what they copy (infra/revision.py), so a chart or add-on bump here names the same images and
asks for no new push. Change a version here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

from nvrx_eks.kitcore.pins import UNPUBLISHED_SHA256

# ---------------------------------------------------------------------------------------------
# Add-on versions are per Kubernetes minor where EKS publishes per-minor builds (kube-proxy tracks
# the control plane; coredns differs by minor). Before raising a version, list what EKS offers:
#   aws eks describe-addon-versions --kubernetes-version 1.34 --addon-name vpc-cni \
#     --query 'addons[].addonVersions[].addonVersion'
# A version missing from the maps below is refused at synth (infra/config.py), never guessed.
# ---------------------------------------------------------------------------------------------

# Kubernetes versions offered: only those in EKS standard support, with the day it ends (extended
# support costs more per cluster-hour and gets no new add-on builds). Dates from the EKS user guide's
# release calendar, https://docs.aws.amazon.com/eks/latest/userguide/kubernetes-versions.html ; as of
# PINS_REVIEWED: 1.34's standard support ended 2026-12-02 (not offered), 1.35 (EKS release 2026-01-28)
# runs to 2027-03-27, 1.36 (EKS release 2026-06-02) to 2027-08-02, 14 months after its release as the
# guide's rule says. 1.36's dates as that calendar's table states them, read through endoflife.date's
# copy of it (https://github.com/endoflife-date/endoflife.date/blob/master/products/amazon-eks.md,
# whose amazon-eks releases are taken from that table's "End of standard support" column).
# The table is checked offline; `nvrx-eks preflight` asks EKS (DescribeClusterVersions) whether the
# config's version is still in standard support on the day of the deploy.
PINS_REVIEWED = date(2026, 12, 5)
STANDARD_SUPPORT_ENDS: dict[str, date] = {"1.35": date(2027, 3, 27), "1.36": date(2027, 8, 2)}
SUPPORTED_KUBERNETES_VERSIONS: tuple[str, ...] = tuple(STANDARD_SUPPORT_ENDS)
# The newest offered version whose add-on pins are confirmed at least as far as every older one's:
# 1.36 (only aws-fsx-csi-driver is unconfirmed, as on 1.35), and its standard support outlasts 1.35's
# by four months, which a cluster made under the default `upgrade` policy would otherwise spend
# being upgraded by EKS on 2027-03-27.
DEFAULT_KUBERNETES_VERSION = "1.36"
# aws-cdk.lambda-layer-kubectl-v36 (PyPI, 2.0.1: kubectl 1.36.3, Helm 4.2.3): kubectl + helm for the
# cluster's kubectl provider (add_helm_chart, add_cdk8s_chart). kubectl 1.36 is within kubectl's +/-1
# minor skew of both offered versions (1.35 and 1.36) and stays within it of the next pair (1.36 and
# 1.37) once 1.35 leaves standard support; the v35 layer would fall out of skew with 1.37.
# https://kubernetes.io/releases/version-skew-policy/#kubectl
KUBECTL_LAYER_MINOR = "1.36"


@dataclass(frozen=True)
class AddonVersion:
    """One EKS managed add-on version for one Kubernetes minor, and where it was seen."""

    version: str
    source: str
    """The public place the version was read from, or why it is unconfirmed."""
    confirmed: bool
    """False: no public source lists this version for this Kubernetes version; only
    `nvrx-eks preflight` (DescribeAddonVersions) settles it, and `cdk deploy` needs its pass."""


@dataclass(frozen=True)
class AddonPin:
    """One EKS managed add-on: its version per supported Kubernetes minor."""

    name: str
    versions: dict[str, AddonVersion]

    def version_for(self, kubernetes_version: str) -> str:
        return self.versions[kubernetes_version].version


# EKS managed add-ons (https://docs.aws.amazon.com/eks/latest/userguide/workloads-add-ons-available-eks.html).
# An add-on version must be listed by DescribeAddonVersions for the cluster's Kubernetes version, or
# CreateAddon fails and the stack rolls back. No AWS access where these were chosen, so each version
# names its public source and whether that source ties it to its Kubernetes minor; `nvrx-eks preflight`
# checks every pin against EKS for the config's version and lists the valid ones, and `cdk deploy`
# refuses to start without that preflight's recent pass (infra/deploy_gate.py). List what EKS offers:
#   aws eks describe-addon-versions --kubernetes-version 1.36 --addon-name vpc-cni \
#     --query 'addons[].addonVersions[].addonVersion'
# Every source below was found by code search in public repositories, none is an AWS table.
_TF_135 = "a public Terraform configuration of an EKS 1.35 cluster (found by code search; not an AWS table)"
# A public lab write-up of an EKS 1.36 cluster (eksctl reports Kubernetes "1.36", its nodes v1.36.3):
# its `eksctl get addon` lists what the cluster runs, and its DescribeAddonVersions for 1.36 the default.
_LAB_136 = "a public lab write-up of an EKS 1.36 cluster running it (found by code search; not an AWS table)"
# A public compatibility matrix records what a 1.36 deploy resolved the EKS default add-ons to, and
# public Terraform configurations set Kubernetes 1.36 with the add-ons that cluster runs.
_RUN_136 = (
    "public records of EKS 1.36 clusters running it: a lab write-up, a compatibility matrix of a 1.36 "
    "deploy, Terraform configurations (found by code search; not an AWS table)"
)
_NODE_MONITORING_CHART = (
    "https://github.com/aws/eks-node-monitoring-agent/blob/main/charts/eks-node-monitoring-agent/values.yaml"
)
EKS_ADDONS: dict[str, AddonPin] = {
    pin.name: pin
    for pin in (
        AddonPin(
            "vpc-cni",
            {
                "1.35": AddonVersion("v1.21.1-eksbuild.3", _TF_135, confirmed=True),
                "1.36": AddonVersion("v1.22.4-eksbuild.3", _RUN_136, confirmed=True),
            },
        ),
        AddonPin(
            "coredns",
            {
                "1.35": AddonVersion("v1.13.2-eksbuild.1", _TF_135, confirmed=True),
                # The default the lab's 1.36 cluster was created with, and the one the matrix's 1.36
                # deploy resolved to.
                "1.36": AddonVersion("v1.14.3-eksbuild.16", _RUN_136, confirmed=True),
            },
        ),
        AddonPin(
            "kube-proxy",
            {
                "1.35": AddonVersion("v1.35.0-eksbuild.2", _TF_135, confirmed=True),
                # The lab's 1.36 cluster runs it with no newer build on offer; a Terraform configuration
                # pins it too.
                "1.36": AddonVersion("v1.36.0-eksbuild.25", _RUN_136, confirmed=True),
            },
        ),
        AddonPin(
            "eks-pod-identity-agent",
            {
                "1.35": AddonVersion("v1.3.10-eksbuild.3", _TF_135, confirmed=True),
                # A Terraform configuration pinning "the defaults AWS reports for 1.36" (its
                # describe-addon-versions --kubernetes-version 1.36), and the matrix's 1.36 deploy.
                "1.36": AddonVersion("v1.3.10-eksbuild.3", _RUN_136, confirmed=True),
            },
        ),
        AddonPin(
            "amazon-cloudwatch-observability",
            {
                "1.35": AddonVersion("v5.3.0-eksbuild.1", _TF_135, confirmed=True),
                # The lab's DescribeAddonVersions --kubernetes-version 1.36 lists it as the default
                # (v6.4.0 and v6.5.0 also offered), and its 1.36 cluster runs it.
                "1.36": AddonVersion("v6.6.0-eksbuild.1", _LAB_136, confirmed=True),
            },
        ),
        AddonPin(
            "eks-node-monitoring-agent",
            {
                # The agent image tag of AWS's own chart for the add-on (nodeAgent.image.tag); the
                # add-on's versions carry the same name, but no source ties this one to Kubernetes 1.35.
                "1.35": AddonVersion("v1.7.0-eksbuild.1", _NODE_MONITORING_CHART, confirmed=False),
                # A public Terraform configuration installs it beside kube-proxy v1.36.0-eksbuild.25,
                # a build EKS lists for 1.36 only, so on a 1.36 cluster; AWS's chart runs this tag.
                "1.36": AddonVersion(
                    "v1.7.2-eksbuild.1",
                    "a public Terraform configuration of an EKS 1.36 cluster (its kube-proxy is a 1.36 "
                    f"build; found by code search, not an AWS table); the tag of {_NODE_MONITORING_CHART}",
                    confirmed=True,
                ),
            },
        ),
        # No public source ties an aws-fsx-csi-driver add-on version to a Kubernetes minor: AWS's
        # add-on page names the add-on, not its builds; the public configurations found pin the
        # upstream driver image (v1.2.0 to v1.9.0, https://github.com/kubernetes-sigs/aws-fsx-csi-driver)
        # or an add-on version without a Kubernetes version beside it. So it stays unconfirmed:
        # `nvrx-eks preflight` asks DescribeAddonVersions for it with every other pin (and lists the
        # valid ones when it is not offered), and `cdk deploy` needs that preflight's pass.
        AddonPin(
            "aws-fsx-csi-driver",
            {
                "1.35": AddonVersion(
                    "v1.6.0-eksbuild.1",
                    "none found: unconfirmed for Kubernetes 1.35 (nvrx-eks preflight checks it against EKS)",
                    confirmed=False,
                ),
                # The newest add-on build found pinned in public code (a copy of gco/stacks/constants.py
                # of https://github.com/awslabs/global-capacity-orchestrator-on-aws), with no Kubernetes
                # version beside it.
                "1.36": AddonVersion(
                    "v1.10.0-eksbuild.1",
                    "none found: unconfirmed for Kubernetes 1.36 (nvrx-eks preflight checks it against EKS)",
                    confirmed=False,
                ),
            },
        ),
    )
}


@dataclass(frozen=True)
class ChartImage:
    """One container image a pinned Helm chart runs, and the chart value that names it.

    Every pinned chart version's template joins the value as `REPOSITORY:TAG` (read at that version), so
    the stack passes the digest on the tag, `TAG@sha256:...`: the kubelet pulls by the digest and the
    tag says which one it was (infra/addons.py).
    """

    values_key: str
    """The chart value holding `repository` and `tag`, dotted (e.g. "controllerManager.manager.image")."""
    repository: str
    tag: str
    """The tag the chart version runs by default (its values.yaml, else its appVersion)."""
    digest: str = UNPUBLISHED_SHA256
    """sha256:... of the tag's manifest (index); UNPUBLISHED_SHA256 until a source or `nvrx-eks image pin`
    gives it: the stack then passes the tag alone, warns, and preflight fails (infra/ops/preflight.py)."""
    source: str = ""
    """Where the digest was read, or why there is none."""

    @property
    def reference(self) -> str:
        """REPOSITORY:TAG@DIGEST, or REPOSITORY:TAG while the digest is unpublished."""
        reference = f"{self.repository}:{self.tag}"
        return reference if self.digest == UNPUBLISHED_SHA256 else f"{reference}@{self.digest}"


@dataclass(frozen=True)
class ChartPin:
    """A Helm chart installed where no EKS managed add-on exists, and every image it runs as installed."""

    chart: str
    repository: str
    version: str
    namespace: str
    images: tuple[ChartImage, ...] = ()
    """Each image the chart's objects run with the kit's values: its containers, init containers and
    sidecars; an optional component the kit leaves off (e.g. Kueue's dashboard) is not listed."""


# The charts' images by digest (a scanner's "image by tag" finding, and a tag moved upstream would
# change what runs): each digest beside its public source, as found by code search, not read from the
# registry. Where no public source names one, `nvrx-eks image pin` (run once with internet; the EFA
# plugin's ECR registry also needs AWS credentials) asks each registry for its tag's digest and writes it
# here, naming the registry as the source. After a chart version change here, check the chart's images at
# that version and run it again.
_UNPUBLISHED_DIGEST = "none found: `nvrx-eks image pin` reads it from the registry"
IMAGE_PIN_FIX = (
    "run `nvrx-eks image pin` once with internet (AWS credentials too for an image in ECR) and commit "
    "infra/cluster_pins.py"
)
"""What synth's warning and preflight's failure say of a chart image whose digest is unpublished."""
HELM_CHARTS: dict[str, ChartPin] = {
    # https://github.com/NVIDIA/k8s-device-plugin (the AL2023 NVIDIA AMI ships the driver and the
    # container toolkit, not the device plugin). One image, "v" + appVersion, for every container: the
    # plugin's DaemonSet and the MPS control daemon's (its init container too); NFD and GFD stay off
    # (gfd.enabled: false). 0.20.0: the newest release NVIDIA/deepops#1382 read off the project's
    # releases (2026-08-27), and the GPU Operator 26.7.0 bundle ships it.
    "nvidia-device-plugin": ChartPin(
        chart="nvidia-device-plugin",
        repository="https://nvidia.github.io/k8s-device-plugin",
        version="0.20.0",
        namespace="kube-system",
        images=(
            ChartImage(
                values_key="image",
                repository="nvcr.io/nvidia/k8s-device-plugin",
                tag="v0.20.0",
                digest="sha256:a61ba9fd8efb82f3a79f877f7580e02c1e8e7593f62473644bc9c79e315c3312",
                source="a public manifest and the GPU Operator 26.7.0 bundle (code search, not the registry)",
            ),
        ),
    ),
    # >= v0.5.10: older releases count P6 NVLink devices as EFA. Chart v0.5.30 ships plugin v0.5.20
    # (its Chart.yaml appVersion and values.yaml image.tag, read 2026-08-01 by a public review of the
    # chart; the chart's releases: https://github.com/aws/eks-charts/pull/1338 for v0.5.29).
    # https://github.com/aws/eks-charts/tree/master/stable/aws-efa-k8s-device-plugin
    # Its image is in the EKS add-on registry (private ECR, account 602401143452, us-west-2 as the
    # chart's default): the nodes pull it with their ECR read policy, and `nvrx-eks image pin` asks ECR
    # with the caller's AWS credentials (the registry offers no anonymous token).
    "aws-efa-k8s-device-plugin": ChartPin(
        chart="aws-efa-k8s-device-plugin",
        repository="https://aws.github.io/eks-charts",
        version="v0.5.30",
        namespace="kube-system",
        images=(
            ChartImage(
                values_key="image",
                repository="602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/aws-efa-k8s-device-plugin",
                tag="v0.5.20",
                digest=UNPUBLISHED_SHA256,
                source=_UNPUBLISHED_DIGEST,
            ),
        ),
    ),
    # https://github.com/NVIDIA/dcgm-exporter (GPU health and utilisation as Prometheus metrics). Chart
    # 4.1.1 is the exporter's release 4.2.3-4.1.1; its DaemonSet runs the one exporter container.
    "dcgm-exporter": ChartPin(
        chart="dcgm-exporter",
        repository="https://nvidia.github.io/dcgm-exporter/helm-charts",
        version="4.1.1",
        namespace="kube-system",
        images=(
            ChartImage(
                values_key="image",
                repository="nvcr.io/nvidia/k8s/dcgm-exporter",
                tag="4.2.3-4.1.1-ubuntu22.04",
                digest=UNPUBLISHED_SHA256,
                source=_UNPUBLISHED_DIGEST,
            ),
        ),
    ),
    # Optional gang admission for multi-node jobs. https://kueue.sigs.k8s.io/docs/installation/
    # 0.19.4: the newest 0.19 release (https://github.com/kubernetes-sigs/kueue/issues/15122, promoted to
    # registry.k8s.io by https://github.com/kubernetes/k8s.io/pull/9917, chart and image digests checked
    # there with `crane digest`). Its objects are kueue.x-k8s.io/v1beta2
    # (k8s/cluster_chart.py): 0.15 introduced v1beta2 and announced the end of v1beta1
    # (https://github.com/kubernetes-sigs/kueue/issues/7626). From 0.19, WaitForPodsReady is on by
    # default (30 min timeout and recovery timeout): a job whose pods are not all ready within 30 minutes
    # is evicted and requeued (k8s/cluster_chart.py KUEUE_PODS_READY_TIMEOUT_S says what that bounds).
    # The released chart runs the manager image of its own version from registry.k8s.io (no
    # kube-rbac-proxy since 0.11); the KueueViz dashboard's two images stay off (enableKueueViz: false).
    "kueue": ChartPin(
        chart="kueue",
        repository="oci://registry.k8s.io/kueue/charts/kueue",  # OCI: the full chart path
        version="0.19.4",
        namespace="kueue-system",
        images=(
            ChartImage(
                values_key="controllerManager.manager.image",
                repository="registry.k8s.io/kueue/kueue",
                tag="v0.19.4",
                digest="sha256:cc980ec83c698369d55f3b9105fb602ba85a558cb1bf3cafa02ce38a6a695c26",
                source="its promotion, crane-checked: https://github.com/kubernetes/k8s.io/pull/9917",
            ),
        ),
    ),
}
