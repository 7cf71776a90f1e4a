# syntax=docker/dockerfile:1.7
#
# A training project's image on the kit's training image: the project's dependencies and code added on
# top, nothing of the kit's changed. `nvrx-eks image build --project DIR --base KIT_IMAGE` builds it with
# the project folder as the build context (its .dockerignore applies); docs/your-script.md shows it.
#
# What the kit's image keeps: CUDA, EFA, aws-ofi-nccl, torch, NVRx and the kit (one package,
# nvrx_eks, so a project's own `training` package keeps its name), its unprivileged user and read-only
# root. The project's requirements are installed under a constraint file of everything the kit's image
# already has, so a requirement can add packages but never move torch, NVRx or what they need.

# The kit's training image, by digest (`nvrx-eks image push` prints it) or a local name:tag.
ARG KIT_IMAGE=unset
# hadolint ignore=DL3006
FROM ${KIT_IMAGE}
ARG TRAINER_UID=10001

USER root
WORKDIR /workspace
# The requirements first, so editing the code rebuilds only the last layer. `requirements.txt` must
# exist (it may be empty); pin what it names, with hashes where you can, as the kit pins its own.
COPY requirements.txt /tmp/project-requirements.txt
RUN python -m pip list --format=freeze > /tmp/kit-constraints.txt \
    && python -m pip install --no-cache-dir -c /tmp/kit-constraints.txt -r /tmp/project-requirements.txt \
    && python -m pip check \
    && rm /tmp/kit-constraints.txt /tmp/project-requirements.txt

COPY . /workspace/
# `python -m MODULE` finds the project's packages from its working folder; a script run by path, too.
ENV PYTHONPATH=/workspace
USER ${TRAINER_UID}:${TRAINER_UID}
