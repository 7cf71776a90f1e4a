#!/usr/bin/env bash
# install-efa VERSION SHA256: the EFA userspace (libfabric, rdma-core) from AWS's installer at VERSION,
# checked against SHA256 by fetch-verified (which images/Dockerfile mounts beside this).
#
# Both stages that need EFA run it: the plugin's build stage (to build against libfabric) and the
# runtime's CUDA stage. --skip-kmod: the kernel module is the node's, from its AMI.
# --skip-limit-conf: the locked-memory limit is the container runtime's. --no-verify: the check
# needs an EFA device, which no build machine has (the start-up self-check runs it on every node).
set -euo pipefail

if [[ $# -ne 2 ]]; then
    echo "usage: install-efa VERSION SHA256" >&2
    exit 2
fi
mkdir -p /tmp/efa
cd /tmp/efa
fetch-verified "https://efa-installer.amazonaws.com/aws-efa-installer-$1.tar.gz" "$2" /tmp/efa.tar.gz
tar -xzf /tmp/efa.tar.gz --strip-components=1
./efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify
cd /
rm -rf /tmp/efa /tmp/efa.tar.gz /var/lib/apt/lists/*
