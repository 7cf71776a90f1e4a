"""Which NVRx a job runs, and whether the kit supports it.

The job's NVRx comes from the image it runs (kitcore/pins.py `IMAGE.nvrx_version`), or from this
virtualenv when `image: local` (`make setup` installs the same pin), or from `nvrx_version` in the values
(a custom image). The kit supports one range: the pin's minor and newer. Older releases differ in what
the launcher and the job rely on (0.7's barrier rendezvous with NVRx's own control process, hot spares
counted in `--nnodes` max, restarts counted per rendezvous round), so a value asking for one is refused
at render rather than deployed with flags it would reject or misread.
"""

from __future__ import annotations

from importlib import metadata

from packaging.version import InvalidVersion, Version

from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.kitcore.pins import IMAGE, NVRX_SUPPORTED_SINCE

LOCAL_IMAGE = "local"
"""`image: local` means: no container image, run with this virtualenv (local executor)."""

SUPPORTED_SINCE = Version(NVRX_SUPPORTED_SINCE)


def installed_nvrx_version() -> str:
    try:
        return metadata.version("nvidia-resiliency-ext")
    except metadata.PackageNotFoundError:
        raise UserError(
            "image: local runs with this virtualenv, but nvidia-resiliency-ext is not installed in it: "
            "run `make setup`"
        ) from None


def resolve_nvrx_version(*, image: str, nvrx_version: str | None) -> str:
    """The NVRx version the job runs: explicit, else the venv (local) or the pin; refused if unsupported."""
    version = nvrx_version or (installed_nvrx_version() if image == LOCAL_IMAGE else IMAGE.nvrx_version)
    field = "nvrx_version" if nvrx_version else "the installed nvidia-resiliency-ext"
    check_supported(version, field=field)
    return version


def check_supported(version: str, *, field: str = "nvrx_version") -> None:
    try:
        parsed = Version(version)
    except InvalidVersion:
        raise UserError(f"{field} {version!r} is not a version number (e.g. {IMAGE.nvrx_version})") from None
    if parsed < SUPPORTED_SINCE:
        raise UserError(
            f"{field} {version}: the kit supports NVRx {SUPPORTED_SINCE} and newer (the image pins "
            f"{IMAGE.nvrx_version}); use an image with a supported NVRx, or `make setup` for local runs"
        )
