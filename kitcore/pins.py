"""Every version the kit deploys, in one place.

The CDK add-ons and Helm charts, the training image's base and libraries, and the NVRx release whose
launcher flags the job chart derives. Change a version here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

# What a digest or checksum pin holds until `nvrx-eks image pin` has recorded it: the image build
# refuses it (images/fetch-verified.sh and `nvrx-eks image build`), it never downloads unverified.
UNPUBLISHED_SHA256 = "unpublished"

# The user the training image runs as (images/Dockerfile creates it; the job chart's pods and the node
# check run as it whatever the image says). Above 10000: no clash with a host account's uid.
TRAINER_UID = 10001

# The one torch release the kit runs: the local environment (constraints.txt, the Makefile's CPU build),
# the training image (PyTorch's CUDA wheel from PyPI, images/torch-requirements.lock) and the store image
# (PyTorch's CPU wheel). TCPStore, DCP, FSDP2 and the process-group code change between releases, so the
# release that the tests exercise is the one that ships; tests/images checks every place against it.
# 2.13.0's Linux x86_64 wheel on PyPI is built for CUDA 13.0 (cuda-toolkit 13.0.3) with NCCL 2.29.7
# (outside NVRx 0.7.0's excluded 2.28.3-2.28.8), hence IMAGE's CUDA 13.0 base.
TORCH_VERSION = "2.13.0"


@dataclass(frozen=True)
class ImagePins:
    base_repository: str
    base_tag: str
    """The tag `nvrx-eks image pin` resolves to `base_digest`."""
    nvrx_version: str
    efa_installer: str
    aws_ofi_nccl: str
    torch_version: str = TORCH_VERSION
    """torch from PyPI (its CUDA build), installed over the base from images/torch-requirements.lock."""
    base_digest: str = UNPUBLISHED_SHA256
    """sha256:... of the tag's manifest (index) as the registry served it to `nvrx-eks image pin`."""
    efa_installer_sha256: str = UNPUBLISHED_SHA256
    """sha256 of aws-efa-installer-<efa_installer>.tar.gz."""
    aws_ofi_nccl_sha256: str = UNPUBLISHED_SHA256
    """sha256 of the aws-ofi-nccl-<aws_ofi_nccl>.tar.gz release asset."""
    python_abi: str = "cp312"
    """The base image's CPython ABI; NVRx 0.5+ publishes cp312 wheels only."""
    min_glibc: str = "2.39"
    """NVRx 0.5+ wheels are manylinux_2_39: the base must be Ubuntu 24.04 (glibc 2.39) or newer."""
    trainer_uid: int = TRAINER_UID
    """The image's non-root user and group id."""

    @property
    def base_image(self) -> str:
        """REPOSITORY:TAG@DIGEST (the engine pulls by the digest; the tag says which one it was), or
        REPOSITORY:TAG until the digest is recorded (the build refuses that)."""
        reference = f"{self.base_repository}:{self.base_tag}"
        return reference if self.base_digest == UNPUBLISHED_SHA256 else f"{reference}@{self.base_digest}"

    @property
    def efa_installer_url(self) -> str:
        return f"https://efa-installer.amazonaws.com/aws-efa-installer-{self.efa_installer}.tar.gz"

    @property
    def aws_ofi_nccl_url(self) -> str:
        return (
            f"https://github.com/aws/aws-ofi-nccl/releases/download/v{self.aws_ofi_nccl}/"
            f"aws-ofi-nccl-{self.aws_ofi_nccl}.tar.gz"
        )


# The training image (images/Dockerfile receives these as build args; `nvrx-eks image build` passes
# every field, and tests/images checks the Dockerfile's ARG defaults against them).
#
# Base: NVIDIA's CUDA 13.0.2 development image on Ubuntu 24.04 (glibc 2.39, Python 3.12 from Ubuntu),
# and torch at TORCH_VERSION from PyPI on top, its CUDA libraries as pip packages (CUDA 13.0, matching
# the base's toolkit that aws-ofi-nccl compiles against). Why not NGC PyTorch: each NGC release carries
# its own pre-release build of torch (25.09: a 2.9 build), never the release the kit is tested with, and
# installing another torch over it breaks the NGC packages built against its own; a plain CUDA base
# with torch from the lock runs exactly TORCH_VERSION. The AWS Deep Learning Containers were considered
# too (EFA and aws-ofi-nccl preinstalled) but are Ubuntu 22.04 (glibc 2.35) or Amazon Linux 2023 (glibc
# 2.34) builds, on which no NVRx release newer than 0.4.1 installs; this kit needs 0.7 (barrier
# rendezvous, current launcher). NVRx 0.7.0's README asks for PyTorch >= 2.8, CUDA >= 12.8 and an NCCL
# outside 2.28.3-2.28.8 (an in-process restart issue): torch 2.13.0 brings NCCL 2.29.7; the start-up
# self-check (training/node/selfcheck.py) refuses a node whose NCCL falls in the range.
# https://catalog.ngc.nvidia.com/orgs/nvidia/containers/cuda
# EFA installer 1.46.0 with aws-ofi-nccl 1.17.2 is the pairing AWS's own samples build on this CUDA
# generation (awsome-distributed-training); the plugin is built from its release tarball so the
# version is ours, not whichever one the installer bundles.
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-changelog.html
# https://github.com/aws/aws-ofi-nccl/releases/tag/v1.17.2
#
# Digest and checksums (supply chain): `nvrx-eks image pin`, run once on a machine with internet,
# downloads both tarballs over TLS, asks the registry for the tag's digest, and writes the three
# values below (and the Dockerfile's ARG defaults). Until then the checksums hold UNPUBLISHED_SHA256
# and `nvrx-eks image build` refuses to start, naming that command. The base digest below is the one
# several public x86_64 builds pin for this tag (found by code search, not read from the registry);
# `image pin` replaces it with the registry's answer. After a version change here, run it again. A
# wrong digest fails the pull and a wrong checksum fails the build (closed).
IMAGE = ImagePins(
    base_repository="nvcr.io/nvidia/cuda",
    base_tag="13.0.2-devel-ubuntu24.04",
    nvrx_version="0.7.0",
    efa_installer="1.46.0",
    aws_ofi_nccl="1.17.2",
    torch_version=TORCH_VERSION,
    base_digest="sha256:5dc1bca23d05bd37b011be68ec470c03b403a5da07ec3a86e41af9470e9d0cc6",
    efa_installer_sha256=UNPUBLISHED_SHA256,
    aws_ofi_nccl_sha256=UNPUBLISHED_SHA256,
)


@dataclass(frozen=True)
class StoreImagePins:
    """The rendezvous store's image (images/store.Dockerfile): NVRx's control process and torch's
    TCPStore on the CPU. The store runs on the system nodes; the training image (CUDA, NCCL, EFA, ~20 GB)
    would fill their root volumes and take minutes to pull before any launcher can rendezvous."""

    base_repository: str
    base_tag: str
    torch_version: str
    """The CPU build of torch at TORCH_VERSION, the training image's release (one TCPStore protocol)."""
    nvrx_version: str
    base_digest: str = UNPUBLISHED_SHA256
    torch_sha256: str = UNPUBLISHED_SHA256
    """sha256 of the CPU wheel at `torch_wheel_url`."""
    python_abi: str = "cp312"
    """NVRx publishes cp312 wheels only."""

    @property
    def base_image(self) -> str:
        reference = f"{self.base_repository}:{self.base_tag}"
        return reference if self.base_digest == UNPUBLISHED_SHA256 else f"{reference}@{self.base_digest}"

    @property
    def torch_wheel_url(self) -> str:
        # PyTorch's own index of CPU-only builds (PyPI's Linux x86_64 wheels are the CUDA ones).
        return (
            f"https://download.pytorch.org/whl/cpu/torch-{self.torch_version}%2Bcpu-"
            f"{self.python_abi}-{self.python_abi}-manylinux_2_28_x86_64.whl"
        )


# The store image. Base: the Python image of Debian 13 "trixie" (glibc 2.41 >= NVRx's manylinux_2_39,
# CPython 3.12 for its cp312 wheel), https://hub.docker.com/_/python ; its digest is one a public
# Dockerfile pins for this tag (found by code search, not read from the registry): `nvrx-eks image pin`
# replaces it with the registry's answer and records the torch wheel's checksum, which holds
# UNPUBLISHED_SHA256 until then (the build refuses it). torch at TORCH_VERSION, IMAGE's release, so
# the launchers' TCPStore clients and the store speak one release. https://download.pytorch.org/whl/cpu/torch/
STORE_IMAGE = StoreImagePins(
    base_repository="docker.io/library/python",
    base_tag="3.12-slim-trixie",
    torch_version=TORCH_VERSION,
    nvrx_version=IMAGE.nvrx_version,
    base_digest="sha256:d86b4c74b936c438cd4cc3a9f7256b9a7c27ad68c7caf8c205e18d9845af0164",
    torch_sha256=UNPUBLISHED_SHA256,
)

NVRX_SUPPORTED_SINCE = ".".join(IMAGE.nvrx_version.split(".")[:2])
"""The oldest NVRx the kit runs with: the pin's minor release (the launcher, the job chart and the trainer
rely on its barrier rendezvous, control process and hot spares)."""

# ---------------------------------------------------------------------------------------------
# Cluster side (owned by infra/): Kubernetes versions, EKS managed add-ons, Helm charts.
#
# Add-on versions are per Kubernetes minor where EKS publishes per-minor builds (kube-proxy tracks
# the control plane; coredns differs by minor). Before raising a version, list what EKS offers:
#   aws eks describe-addon-versions --kubernetes-version 1.34 --addon-name vpc-cni \
#     --query 'addons[].addonVersions[].addonVersion'
# A version missing from the maps below is refused at synth (infra/config.py), never guessed.
# ---------------------------------------------------------------------------------------------

# Kubernetes versions offered: only those in EKS standard support, with the day it ends (extended
# support costs more per cluster-hour and gets no new add-on builds). Dates from the EKS user guide's
# release calendar, https://docs.aws.amazon.com/eks/latest/userguide/kubernetes-versions.html ; as of
# PINS_REVIEWED: 1.34's standard support ends 2026-12-02 (not offered), 1.35 (EKS release 2026-01-28)
# runs to 2027-03-27. 1.36 (on EKS since 2026-06) is not offered until its add-on pins have a source
# and the app has a kubectl layer for it.
# The table is checked offline; `nvrx-eks preflight` asks EKS (DescribeClusterVersions) whether the
# config's version is still in standard support on the day of the deploy.
PINS_REVIEWED = date(2026, 12, 2)
STANDARD_SUPPORT_ENDS: dict[str, date] = {"1.35": date(2027, 3, 27)}
SUPPORTED_KUBERNETES_VERSIONS: tuple[str, ...] = tuple(STANDARD_SUPPORT_ENDS)
DEFAULT_KUBERNETES_VERSION = "1.35"
# aws-cdk.lambda-layer-kubectl-v35 (PyPI, 2.2.2): kubectl + helm for the cluster's kubectl provider
# (add_helm_chart, add_cdk8s_chart), within kubectl's +/-1 minor skew of every version above.
# https://kubernetes.io/releases/version-skew-policy/#kubectl
KUBECTL_LAYER_MINOR = "1.35"


@dataclass(frozen=True)
class AddonPin:
    """One EKS managed add-on: its version per supported Kubernetes minor, and where it was seen."""

    name: str
    versions: dict[str, str]
    source: str
    """The public place the version was read from, or why it is unconfirmed."""
    confirmed: bool
    """False: no public source lists this version for these Kubernetes versions; only
    `nvrx-eks preflight` (DescribeAddonVersions) settles it, and `cdk deploy` needs its pass."""

    def version_for(self, kubernetes_version: str) -> str:
        return self.versions[kubernetes_version]


def _same(version: str) -> dict[str, str]:
    return dict.fromkeys(SUPPORTED_KUBERNETES_VERSIONS, version)


# EKS managed add-ons (https://docs.aws.amazon.com/eks/latest/userguide/workloads-add-ons-available-eks.html).
# An add-on version must be listed by DescribeAddonVersions for the cluster's Kubernetes version, or
# CreateAddon fails and the stack rolls back. No AWS access where these were chosen, so each pin names
# its public source and whether that source ties it to Kubernetes 1.35; `nvrx-eks preflight` checks
# every pin against EKS for the config's version and lists the valid ones, and `cdk deploy` refuses to
# start without that preflight's recent pass (infra/deploy_gate.py). List what EKS offers with:
#   aws eks describe-addon-versions --kubernetes-version 1.35 --addon-name vpc-cni \
#     --query 'addons[].addonVersions[].addonVersion'
_TF_135 = "a public Terraform configuration of an EKS 1.35 cluster (found by code search; not an AWS table)"
EKS_ADDONS: dict[str, AddonPin] = {
    pin.name: pin
    for pin in (
        AddonPin("vpc-cni", _same("v1.21.1-eksbuild.3"), source=_TF_135, confirmed=True),
        AddonPin("coredns", _same("v1.13.2-eksbuild.1"), source=_TF_135, confirmed=True),
        AddonPin("kube-proxy", _same("v1.35.0-eksbuild.2"), source=_TF_135, confirmed=True),
        AddonPin("eks-pod-identity-agent", _same("v1.3.10-eksbuild.3"), source=_TF_135, confirmed=True),
        AddonPin(
            "amazon-cloudwatch-observability", _same("v5.3.0-eksbuild.1"), source=_TF_135, confirmed=True
        ),
        AddonPin(
            "eks-node-monitoring-agent",
            _same("v1.7.0-eksbuild.1"),
            # The agent image tag of AWS's own chart for the add-on (nodeAgent.image.tag); the add-on's
            # versions carry the same name, but no source ties this one to Kubernetes 1.35.
            source="https://github.com/aws/eks-node-monitoring-agent/blob/main/charts/eks-node-monitoring-agent/values.yaml",
            confirmed=False,
        ),
        # No public source ties an aws-fsx-csi-driver add-on version to Kubernetes 1.35: AWS's add-on
        # page names the add-on, not its builds; the public configurations found pin the upstream
        # driver image (v1.2.0 to v1.9.0, https://github.com/kubernetes-sigs/aws-fsx-csi-driver), whose
        # add-on builds carry an -eksbuild.N suffix, never an add-on version for 1.35. So it stays
        # unconfirmed: `nvrx-eks preflight` asks DescribeAddonVersions for it with every other pin (and
        # lists the valid ones when it is not offered), and `cdk deploy` needs that preflight's pass.
        AddonPin(
            "aws-fsx-csi-driver",
            _same("v1.6.0-eksbuild.1"),
            source="none found: unconfirmed for Kubernetes 1.35 (nvrx-eks preflight checks it against EKS)",
            confirmed=False,
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
    "kitcore/pins.py"
)
"""What synth's warning and preflight's failure say of a chart image whose digest is unpublished."""
HELM_CHARTS: dict[str, ChartPin] = {
    # https://github.com/NVIDIA/k8s-device-plugin (the AL2023 NVIDIA AMI ships the driver and the
    # container toolkit, not the device plugin). One image, "v" + appVersion, for every container: the
    # plugin's DaemonSet and the MPS control daemon's (its init container too); NFD and GFD stay off
    # (gfd.enabled: false).
    "nvidia-device-plugin": ChartPin(
        chart="nvidia-device-plugin",
        repository="https://nvidia.github.io/k8s-device-plugin",
        version="0.17.1",
        namespace="kube-system",
        images=(
            ChartImage(
                values_key="image",
                repository="nvcr.io/nvidia/k8s-device-plugin",
                tag="v0.17.1",
                digest="sha256:af31e2b7c7f89834c4e5219860def7ac2e49a207b3d4e8610d5a26772b7738e5",
                source="a public kind smoke test pins this tag by digest (code search, not the registry)",
            ),
        ),
    ),
    # >= v0.5.10: older releases count P6 NVLink devices as EFA. Chart v0.5.20 ships plugin v0.5.13.
    # https://github.com/aws/eks-charts/tree/master/stable/aws-efa-k8s-device-plugin
    # Its image is in the EKS add-on registry (private ECR, account 602401143452, us-west-2 as the
    # chart's default): the nodes pull it with their ECR read policy, and `nvrx-eks image pin` asks ECR
    # with the caller's AWS credentials (the registry offers no anonymous token).
    "aws-efa-k8s-device-plugin": ChartPin(
        chart="aws-efa-k8s-device-plugin",
        repository="https://aws.github.io/eks-charts",
        version="v0.5.20",
        namespace="kube-system",
        images=(
            ChartImage(
                values_key="image",
                repository="602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/aws-efa-k8s-device-plugin",
                tag="v0.5.13",
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
    # 0.19.3: the newest release with a public source here, a project that installs this chart version
    # (https://github.com/NVIDIA/aicr/pull/2598). Its objects are kueue.x-k8s.io/v1beta2
    # (k8s/cluster_chart.py): 0.15 introduced v1beta2 and announced the end of v1beta1
    # (https://github.com/kubernetes-sigs/kueue/issues/7626). From 0.19, WaitForPodsReady is on by
    # default (30 min timeout and recovery timeout): a job whose pods are not all ready within 30 minutes
    # is evicted and requeued (k8s/cluster_chart.py KUEUE_PODS_READY_TIMEOUT_S says what that bounds).
    # The released chart runs the manager image of its own version from registry.k8s.io (no
    # kube-rbac-proxy since 0.11); the KueueViz dashboard's two images stay off (enableKueueViz: false).
    "kueue": ChartPin(
        chart="kueue",
        repository="oci://registry.k8s.io/kueue/charts/kueue",  # OCI: the full chart path
        version="0.19.3",
        namespace="kueue-system",
        images=(
            ChartImage(
                values_key="controllerManager.manager.image",
                repository="registry.k8s.io/kueue/kueue",
                tag="v0.19.3",
                digest="sha256:0fc7cf6b1278bc6f20b7ce96d43f6973135b68aa3913005f1bb0c065faf26731",
                source="the v0.19.3 release issue, https://github.com/kubernetes-sigs/kueue/issues/14693",
            ),
        ),
    ),
}
