# syntax=docker/dockerfile:1.7
#
# The rendezvous store's image: Python, the CPU build of torch (its TCPStore), NVRx and the one module of
# the trainer package the store runs, `python -m nvrx_eks.training.resilience.control` (k8s/launcher.py NVRX_CONTROL).
# No CUDA, NCCL or EFA: the store serves a TCP socket on a system node.
#
# Build it with `nvrx-eks image build` (it builds this image beside the training image): it passes every
# ARG below from kitcore/pins.py STORE_IMAGE; the defaults here equal those pins (tests/images checks).

# The base by tag and digest (`nvrx-eks image pin` records the digest in kitcore/pins.py and here).
ARG BASE_IMAGE=docker.io/library/python:3.12-slim-trixie@sha256:d86b4c74b936c438cd4cc3a9f7256b9a7c27ad68c7caf8c205e18d9845af0164

FROM ${BASE_IMAGE} AS store
ARG BASE_IMAGE
ARG TORCH_VERSION=2.13.0
ARG TORCH_SHA256=unpublished
ARG NVRX_VERSION=0.7.0
ARG PYTHON_ABI=cp312
# wheel: PyTorch's CPU wheel, downloaded and checked below. base: the local image check's base
# already holds the CPU build of the same release (its network reaches no PyTorch index); only checked.
ARG TORCH_SOURCE=wheel
ARG GIT_REVISION=unknown
ARG SOURCE_URL=https://github.com/nvrx-eks/nvrx-eks
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# curl for the checksum script only, removed in the same layer: left unpinned (DL3008) because Debian's
# archive keeps only the current build of a package, so an exact pin breaks the build at the next update.
# hadolint ignore=DL3008
RUN --mount=type=bind,source=images/fetch-verified.sh,target=/usr/local/bin/fetch-verified \
    if [ "${TORCH_SOURCE}" = base ]; then \
        python -c "import importlib.metadata as m; v = m.version('torch'); assert v.split('+')[0] == '${TORCH_VERSION}', v"; \
    else \
        apt-get update \
        && apt-get install -y --no-install-recommends curl ca-certificates \
        && fetch-verified "https://download.pytorch.org/whl/cpu/torch-${TORCH_VERSION}%2Bcpu-${PYTHON_ABI}-${PYTHON_ABI}-manylinux_2_28_x86_64.whl" \
            "${TORCH_SHA256}" "/tmp/torch-${TORCH_VERSION}+cpu-${PYTHON_ABI}-${PYTHON_ABI}-manylinux_2_28_x86_64.whl" \
        && python -m pip install --no-cache-dir --no-deps /tmp/torch-*.whl \
        && rm -f /tmp/torch-*.whl \
        && apt-get purge -y --auto-remove curl \
        && rm -rf /var/lib/apt/lists/*; \
    fi

# NVRx at the pin and what it and torch import, with hashes (`nvrx-eks image lock` regenerates the lock).
# The local image check passes a lock of its own (Python 3.11 wheels, other hashes).
ARG REQUIREMENTS_LOCK=images/store-requirements.lock
COPY ${REQUIREMENTS_LOCK} /tmp/requirements.lock
RUN python -m pip install --no-cache-dir --require-hashes --no-deps -r /tmp/requirements.lock \
    && rm /tmp/requirements.lock \
    && python -c "import importlib.metadata as m; v = m.version('nvidia-resiliency-ext'); assert v == '${NVRX_VERSION}', v"

# Only what `python -m nvrx_eks.training.resilience.control` imports from this project (tests/images checks
# the list against the module's imports): the control module, the NVRx patches, the launcher beat they
# read and the pins, each at its path in the repository. pyproject.toml's package-dir, read by
# nvrx_eks/layout.py as in any checkout on the Python path, maps them under the kit's one name.
WORKDIR /app
COPY pyproject.toml ./
COPY nvrx_eks/__init__.py nvrx_eks/layout.py nvrx_eks/
COPY kitcore/__init__.py kitcore/lines.py kitcore/pins.py kitcore/
COPY training/__init__.py training/forks.py training/
COPY training/resilience/__init__.py training/resilience/control.py training/resilience/
COPY training/resilience/nvrx_compat.py training/resilience/launcher_liveness.py training/resilience/shrink.py training/resilience/

ENV PYTHONPATH=/app \
    PYTHONUNBUFFERED=1 \
    NVRX_EKS_NVRX_VERSION=${NVRX_VERSION} \
    NVRX_EKS_IMAGE_REVISION=${GIT_REVISION}

LABEL org.opencontainers.image.title="nvrx-eks rendezvous store" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.revision="${GIT_REVISION}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      io.nvrx-eks.nvrx-version="${NVRX_VERSION}" \
      io.nvrx-eks.torch="${TORCH_VERSION}+cpu"

# `nobody`: the store Deployment runs it as that uid with a read-only root filesystem (job_chart.py).
USER 65534:65534
CMD ["python", "-m", "nvrx_eks.training.resilience.control", "--help"]
