"""What a result ran with: recorded in every result file beside its figures."""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version


def runtime_versions() -> dict[str, str]:
    """What a result ran with: every result file (summary.json, peer.json, the bench JSON) records it, so
    figures measured with different NVRx, torch or Python releases are never compared unknowingly."""

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return {
        "nvrx": installed("nvidia-resiliency-ext"),
        "torch": installed("torch"),
        "python": platform.python_version(),
    }
