#!/usr/bin/env bash
# fetch-verified URL SHA256 DEST: download URL to DEST and check it against SHA256, or fail.
#
# The image build runs every third-party tarball through this (images/Dockerfile mounts it for
# the RUN steps that need it). It fails closed: a checksum that is not 64 hex digits (kitcore/pins.py
# holds a placeholder until `nvrx-eks image pin` records the checksum) stops the build before
# anything is downloaded, and a mismatch stops it before anything is unpacked.
set -euo pipefail

if [[ $# -ne 3 ]]; then
    echo "usage: fetch-verified URL SHA256 DEST" >&2
    exit 2
fi
url=$1
sha256=$2
dest=$3

if [[ ! ${sha256} =~ ^[0-9a-f]{64}$ ]]; then
    echo "refusing ${url}: its pinned sha256 is '${sha256}', not a checksum; run 'nvrx-eks image pin'" \
        "once on a machine with internet (it records the checksum in kitcore/pins.py), then build again" >&2
    exit 1
fi
curl -fsSL --proto '=https,file' -o "${dest}" "${url}"
if ! echo "${sha256}  ${dest}" | sha256sum --check --status -; then
    echo "refusing ${url}: sha256 $(sha256sum "${dest}" | cut -d' ' -f1) != pinned ${sha256}" >&2
    rm -f "${dest}"
    exit 1
fi
