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


# The training image (images/Dockerfile receives these as build args).
IMAGE = ImagePins(
    base_image="nvcr.io/nvidia/pytorch:25.09-py3",
    nvrx_version="0.7.0",
    efa_installer="1.43.3",
    aws_ofi_nccl="1.17.1",
)

# Kubernetes version(s) the add-on pins below are known to support.
SUPPORTED_KUBERNETES_VERSIONS: tuple[str, ...] = ("1.32", "1.33")
