"""Fail the image build, with a message, when its base cannot take the pinned NVRx wheel.

NVRx 0.5+ publishes cp312 manylinux_2_39 wheels only (an Ubuntu 22.04 base has glibc 2.35): better
this message than pip's "no matching distribution". images/Dockerfile runs it as
`python check_base.py PYTHON_ABI MIN_GLIBC NVRX_VERSION` (a script, not a RUN heredoc: podman's builder
on Debian 12 has no heredocs). Standard library only.
"""

from __future__ import annotations

import platform
import sys


def _as_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def main(python_abi: str, min_glibc: str, nvrx_version: str) -> None:
    abi = f"cp{sys.version_info.major}{sys.version_info.minor}"
    glibc = platform.libc_ver()[1]
    if abi != python_abi or _as_tuple(glibc) < _as_tuple(min_glibc):
        needs = f"{python_abi} / glibc >= {min_glibc}"
        sys.exit(f"base image has {abi} / glibc {glibc}; NVRx {nvrx_version} needs {needs}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
