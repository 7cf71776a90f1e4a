"""Which NVRx a job runs, and what that version can do.

The job's NVRx comes from the image it runs (kitcore/pins.py `IMAGE.nvrx_version`), or from this
virtualenv when `image: local`, or from `nvrx_version` in the values (a custom image). Everything that
differs between NVRx releases is a property of `NvrxFeatures`, so the values' checks and the launcher's
flags (k8s/launcher.py) read one table.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

from packaging.version import InvalidVersion, Version

from kitcore.configio import UserError
from kitcore.pins import IMAGE

LOCAL_IMAGE = "local"
"""`image: local` means: no container image, run with this machine's virtualenv (local executor)."""

# In-process restart (nvidia_resiliency_ext.inprocess.Wrapper) first shipped in NVRx 0.2.0;
# ft_launcher's --ft-restart-policy min-healthy in 0.3.0 and removed in 0.7.0.
_INPROCESS_SINCE = Version("0.2.0")
_MIN_HEALTHY_SINCE = Version("0.3.0")
_BARRIER_ONLY_SINCE = Version("0.7.0")


@dataclass(frozen=True, kw_only=True)
class NvrxFeatures:
    version: Version

    @property
    def has_inprocess(self) -> bool:
        return self.version >= _INPROCESS_SINCE

    @property
    def has_min_healthy(self) -> bool:
        return _MIN_HEALTHY_SINCE <= self.version < _BARRIER_ONLY_SINCE

    @property
    def keep_alive_rendezvous(self) -> bool:
        """The rendezvous tracks nodes by keep-alive heartbeats that `training.rendezvous.evict` edits."""
        return self.version < _BARRIER_ONLY_SINCE

    @property
    def spares_in_max_nodes(self) -> bool:
        """Warm spares count in `--nnodes=min:max` (0.7's barrier: max = active + standby, a node
        beyond max is refused); with the keep-alive rendezvous `--nnodes=N:N` admits N and a spare
        stands by outside it (`--warm-spares`, training/rendezvous.py `Standby`)."""
        return not self.keep_alive_rendezvous

    def check_mode(self, mode: str) -> None:
        if mode in {"inprocess", "both"} and not self.has_inprocess:
            raise UserError(
                f"mode {mode!r} needs NVRx in-process restart (since {_INPROCESS_SINCE}); "
                f"NVRx {self.version} lacks it: use mode ft_launcher or baseline, or a newer image"
            )


def installed_nvrx_version() -> str:
    try:
        return metadata.version("nvidia-resiliency-ext")
    except metadata.PackageNotFoundError:
        raise UserError(
            "image: local runs with this virtualenv, but nvidia-resiliency-ext is not installed in it"
        ) from None


def resolve_nvrx_version(*, image: str, nvrx_version: str | None) -> str:
    """The NVRx version the job's launcher comes from: explicit, else the venv (local) or the pin."""
    if nvrx_version:
        return nvrx_version
    return installed_nvrx_version() if image == LOCAL_IMAGE else IMAGE.nvrx_version


def nvrx_features(version: str) -> NvrxFeatures:
    try:
        return NvrxFeatures(version=Version(version))
    except InvalidVersion:
        raise UserError(f"nvrx_version {version!r} is not a version number (e.g. 0.7.0)") from None
