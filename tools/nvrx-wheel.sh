#!/usr/bin/env bash
# NVRx at the image's pin, as a wheel this machine's Python can install: `make setup` runs it.
#
# Why: NVRx 0.5+ publishes a single wheel, tagged cp312 / manylinux_2_39, because of one optional compiled
# module, nvrx_cupti_module (the CUPTI-based straggler detector in nvidia_resiliency_ext.attribution.straggler,
# which needs a GPU). Every other file is Python that runs on 3.10+ (its metadata says Requires-Python >=3.10).
# So the local development install takes the published wheel, drops that one extension and retags the rest
# py3-none-any with pypa's `wheel` tool, which rewrites RECORD. The image (Python 3.12) installs the published
# wheel unchanged, extension included; nothing in this kit imports the straggler detector, and the start-up
# self-check reports whether the extension loads (training/node/selfcheck.py).
#
# Usage: tools/nvrx-wheel.sh PYTHON VERSION OUTDIR   (PYTHON must have pip and wheel installed)
set -euo pipefail
python=$1 version=$2 out=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_39_x86_64 -d "$work/published" "nvidia-resiliency-ext==$version"
"$python" -m wheel unpack -d "$work/unpacked" "$work"/published/nvidia_resiliency_ext-"$version"-*.whl
tree="$work/unpacked/nvidia_resiliency_ext-$version"
extensions=("$tree"/nvrx_cupti_module*.so)
[ -e "${extensions[0]}" ] || { echo "nvrx-wheel.sh: no nvrx_cupti_module in NVRx $version: check this script" >&2; exit 1; }
rm -f "${extensions[@]}"
# The remaining files are pure Python: one py3-none-any tag, installed as purelib.
sed -i -e 's/^Root-Is-Purelib: .*/Root-Is-Purelib: true/' -e '/^Tag: /d' "$tree/nvidia_resiliency_ext-$version.dist-info/WHEEL"
echo "Tag: py3-none-any" >>"$tree/nvidia_resiliency_ext-$version.dist-info/WHEEL"
mkdir -p "$out"
"$python" -m wheel pack -d "$out" "$tree"
