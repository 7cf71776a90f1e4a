"""Every version the kit deploys, in one place.

The CDK add-ons and Helm charts, the training image's base and libraries, and the NVRx release whose
launcher flags the job chart derives. Change a version here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ImagePins:
    base_image: str
    nvrx_version: str
    efa_installer: str
    aws_ofi_nccl: str
    python_abi: str = "cp312"
    """The base image's CPython ABI; NVRx 0.5+ publishes cp312 wheels only."""
    min_glibc: str = "2.39"
    """NVRx 0.5+ wheels are manylinux_2_39: the base must be Ubuntu 24.04 (glibc 2.39) or newer."""


# The training image (images/Dockerfile receives these as build args; `nvrx-eks image build` passes
# every field, and tests/images checks the Dockerfile's ARG defaults against them).
#
# Base: NGC PyTorch 25.09 (Ubuntu 24.04 -> glibc 2.39, Python 3.12, CUDA 13.0, PyTorch 2.9). The AWS
# Deep Learning Containers for PyTorch training were considered first (EFA and aws-ofi-nccl come
# preinstalled) but are Ubuntu 22.04 (glibc 2.35) or Amazon Linux 2023 (glibc 2.34) builds, on which no
# NVRx release newer than 0.4.1 installs; this kit needs 0.7 (barrier rendezvous, current launcher).
# NVRx 0.7.0's README asks for PyTorch >= 2.8, CUDA >= 12.8 and an NCCL outside 2.28.3-2.28.8 (an
# in-process restart issue). Check a newer tag's NCCL against that range before raising the base; the
# start-up self-check (training/selfcheck.py) refuses a node whose NCCL falls in it.
# https://docs.nvidia.com/deeplearning/frameworks/pytorch-release-notes/
# EFA installer 1.46.0 with aws-ofi-nccl 1.17.2 is the pairing AWS's own samples build on the 25.09
# NGC generation (awsome-distributed-training, NCCL 2.27.7); the plugin is built from its release
# tarball so the version is ours, not whichever one the installer bundles.
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-changelog.html
# https://github.com/aws/aws-ofi-nccl/releases/tag/v1.17.2
IMAGE = ImagePins(
    base_image="nvcr.io/nvidia/pytorch:25.09-py3",
    nvrx_version="0.7.0",
    efa_installer="1.46.0",
    aws_ofi_nccl="1.17.2",
)

# ---------------------------------------------------------------------------------------------
# Cluster side (owned by infra/): Kubernetes versions, EKS managed add-ons, Helm charts.
#
# Add-on versions are per Kubernetes minor where EKS publishes per-minor builds (kube-proxy tracks
# the control plane; coredns differs by minor). Before raising a version, list what EKS offers:
#   aws eks describe-addon-versions --kubernetes-version 1.34 --addon-name vpc-cni \
#     --query 'addons[].addonVersions[].addonVersion'
# A version missing from the maps below is refused at synth (infra/config.py), never guessed.
# ---------------------------------------------------------------------------------------------

# Kubernetes version(s) the add-on pins below are known to support. The kubectl Lambda layer
# (KUBECTL_LAYER_MINOR) is within kubectl's +/-1 minor skew of each of them.
# https://kubernetes.io/releases/version-skew-policy/#kubectl
SUPPORTED_KUBERNETES_VERSIONS: tuple[str, ...] = ("1.33", "1.34")
DEFAULT_KUBERNETES_VERSION = "1.34"
# aws-cdk.lambda-layer-kubectl-v34: kubectl + helm for the cluster's kubectl provider (add_helm_chart,
# add_cdk8s_chart). Python package pinned in the project's dependencies.
KUBECTL_LAYER_MINOR = "1.34"


@dataclass(frozen=True)
class AddonPin:
    """One EKS managed add-on: its name and the version per supported Kubernetes minor."""

    name: str
    versions: dict[str, str]

    def version_for(self, kubernetes_version: str) -> str:
        return self.versions[kubernetes_version]


def _same(version: str) -> dict[str, str]:
    return dict.fromkeys(SUPPORTED_KUBERNETES_VERSIONS, version)


# EKS managed add-ons (https://docs.aws.amazon.com/eks/latest/userguide/workloads-add-ons-available-eks.html).
EKS_ADDONS: dict[str, AddonPin] = {
    pin.name: pin
    for pin in (
        AddonPin("vpc-cni", _same("v1.20.0-eksbuild.1")),
        AddonPin("coredns", {"1.33": "v1.12.1-eksbuild.2", "1.34": "v1.12.3-eksbuild.1"}),
        AddonPin("kube-proxy", {"1.33": "v1.33.0-eksbuild.2", "1.34": "v1.34.0-eksbuild.2"}),
        AddonPin("eks-pod-identity-agent", _same("v1.3.8-eksbuild.2")),
        AddonPin("aws-fsx-csi-driver", _same("v1.6.0-eksbuild.1")),
        AddonPin("eks-node-monitoring-agent", _same("v1.4.0-eksbuild.2")),
        AddonPin("amazon-cloudwatch-observability", _same("v4.3.0-eksbuild.1")),
    )
}


@dataclass(frozen=True)
class ChartPin:
    """A Helm chart installed where no EKS managed add-on exists."""

    chart: str
    repository: str
    version: str
    namespace: str


HELM_CHARTS: dict[str, ChartPin] = {
    # https://github.com/NVIDIA/k8s-device-plugin (the AL2023 NVIDIA AMI ships the driver and the
    # container toolkit, not the device plugin).
    "nvidia-device-plugin": ChartPin(
        chart="nvidia-device-plugin",
        repository="https://nvidia.github.io/k8s-device-plugin",
        version="0.17.1",
        namespace="kube-system",
    ),
    # >= v0.5.10: older releases count P6 NVLink devices as EFA. Chart v0.5.20 ships plugin v0.5.13.
    # https://github.com/aws/eks-charts/tree/master/stable/aws-efa-k8s-device-plugin
    "aws-efa-k8s-device-plugin": ChartPin(
        chart="aws-efa-k8s-device-plugin",
        repository="https://aws.github.io/eks-charts",
        version="v0.5.20",
        namespace="kube-system",
    ),
    # https://github.com/NVIDIA/dcgm-exporter (GPU health and utilisation as Prometheus metrics).
    "dcgm-exporter": ChartPin(
        chart="dcgm-exporter",
        repository="https://nvidia.github.io/dcgm-exporter/helm-charts",
        version="4.1.1",
        namespace="kube-system",
    ),
    # Optional gang admission for multi-node jobs. https://kueue.sigs.k8s.io/docs/installation/
    "kueue": ChartPin(
        chart="kueue",
        repository="oci://registry.k8s.io/kueue/charts/kueue",  # OCI: the full chart path
        version="0.13.4",
        namespace="kueue-system",
    ),
}
