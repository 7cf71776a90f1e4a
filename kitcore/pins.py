"""Every version the images are built from, in one place.

The training and store images' bases, torch, NVRx (whose launcher flags the job chart derives), the EFA
installer and aws-ofi-nccl. The images copy this file, and their tag is a hash of what they copy
(infra/revision.py): what the cluster runs beside them (Kubernetes, add-ons, Helm charts) is pinned in
infra/cluster_pins.py instead, so a bump there names the same images. Change a version here and
nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

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
# Why not 2.14.1 or 2.15.0 (released): one torch everywhere needs its CPU build for the local
# environment, the store image and the local image check, and where the kit is built and tested only
# the CUDA build of 2.14.1 is at hand (PyPI's Linux wheel, several GB installed; PyTorch's CPU index is
# out of reach): docs/measurements.md has the figures.
# Moving needs that CPU wheel, a `make test` run on it, and `nvrx-eks image lock`.
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
# Base: NVIDIA's CUDA 13.0.3 runtime image on Ubuntu 24.04 (glibc 2.39, Python 3.12 from Ubuntu): no
# compiler or headers in what ships (the image's aws-ofi-nccl stage adds the CUDA headers to itself
# only). torch at TORCH_VERSION from PyPI on top, its CUDA libraries as pip packages: 2.13.0's wheel is
# built for CUDA 13.0 (cuda-toolkit 13.0.3), the base's release. Why not NGC PyTorch: each NGC release
# carries its own pre-release build of torch (25.09: a 2.9 build), never the release the kit is tested
# with, and installing another torch over it breaks the NGC packages built against its own; a plain
# CUDA base with torch from the lock runs exactly TORCH_VERSION. The AWS Deep Learning Containers were
# considered too (EFA and aws-ofi-nccl preinstalled) but are Ubuntu 22.04 (glibc 2.35) or Amazon Linux
# 2023 (glibc 2.34) builds, on which no NVRx release newer than 0.4.1 installs; this kit needs 0.7
# (barrier rendezvous, current launcher). NVRx 0.7.0's README asks for PyTorch >= 2.8, CUDA >= 12.8 and
# an NCCL outside 2.28.3-2.28.8 (an in-process restart issue): torch 2.13.0 brings NCCL 2.29.7; the
# start-up self-check (training/node/selfcheck.py) refuses a node whose NCCL falls in the range.
# NVIDIA publishes it on Docker Hub (https://hub.docker.com/r/nvidia/cuda) as on NGC; the digest below
# is the one public Dockerfiles pin for this tag (found by code search, one of them read off Docker Hub
# on 2026-09-30, not read from the registry here): `nvrx-eks image pin` replaces it with the registry's
# answer.
# EFA installer 1.51.0, the newest release (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-changelog.html).
# aws-ofi-nccl 1.22.0, the newest release; each release lists the NCCL versions it was tested with, and
# 1.19.x is the first series listing NCCL 2.29, torch 2.13.0's (the 1.17 series stops at 2.28). Built
# from its release tarball so the version is ours, not whichever one the installer bundles; it links
# libfabric (the installer's) and libhwloc, which the image installs by name and the build checks.
# https://github.com/aws/aws-ofi-nccl/releases
#
# Digest and checksums (supply chain): `nvrx-eks image pin`, run once on a machine with internet,
# downloads both tarballs over TLS, asks the registry for the tag's digest, and writes the three
# values below (and the Dockerfile's ARG defaults). Until then the checksums hold UNPUBLISHED_SHA256 and
# `nvrx-eks image build` refuses to start, naming that command. After a version change here, run it again. A
# wrong digest fails the pull and a wrong checksum fails the build (closed).
IMAGE = ImagePins(
    base_repository="docker.io/nvidia/cuda",
    base_tag="13.0.3-runtime-ubuntu24.04",
    nvrx_version="0.7.0",
    efa_installer="1.51.0",
    aws_ofi_nccl="1.22.0",
    torch_version=TORCH_VERSION,
    base_digest="sha256:76f46f3e649824ebd3685d3d86c42b0ea62af04f59242f419f56cd5804a72efb",
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
