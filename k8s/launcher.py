"""Launcher command lines derived from one NVRx version.

The job chart never types a launcher flag by hand: `launcher_command(values)` builds the container
command from the NVRx version the image carries (infra/pins.py `IMAGE.nvrx_version`, or the version
installed in this virtualenv when `image: local`).

What differs between versions (shared README section 6, NVRx release notes):
- `--ft-<dash-name>` and `--ft-cfg-path` are accepted by 0.4.1 and 0.7; the `--ft-param-*` spellings and
  `--ignore-missing-fault-tol-cfg` are gone in 0.7. We only emit `--ft-<dash-name>` flags, and since the
  command always sets some `--ft-*` values, no "ignore missing config" flag is ever needed.
- The `min-healthy` restart policy (NVRx's recipe for combining in-process restart with ft_launcher:
  restart a node's workers only when too few healthy nodes remain) exists from 0.3 until 0.6; 0.7 has
  only `any-failed`. Mode `both` on 0.7 therefore keeps the in-process layer for soft faults (they never
  end a worker process, so ft_launcher does not see them) and lets ft_launcher restart the node's workers
  when a rank does exit: the documented 0.7 behaviour, not a silent downgrade.
- 0.7's rendezvous is the barrier implementation only (`--ft-rdzv-impl legacy` is rejected); 0.4.1's
  is the keep-alive based one that `training.rendezvous evict` understands, so the replacement pod's
  eviction step is rendered only for versions with the keep-alive rendezvous.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING

from packaging.version import InvalidVersion, Version

from infra.configio import UserError
from infra.pins import IMAGE

if TYPE_CHECKING:
    from k8s.values import JobValues

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
        """The rendezvous tracks nodes by keep-alive heartbeats that `training.rendezvous evict` edits."""
        return self.version < _BARRIER_ONLY_SINCE

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


def rdzv_conf(values: JobValues) -> str:
    """`--rdzv-conf`: the store lives in its own pod (is_host=0); join waits longer than a reschedule."""
    t = values.timeouts
    items = {
        "is_host": "0",
        "join_timeout": str(int(t.rdzv_join_s)),
        "last_call_timeout": str(int(t.rdzv_last_call_s)),
        "close_timeout": str(int(t.rdzv_close_s)),
    }
    return ",".join(f"{k}={v}" for k, v in items.items())


def launcher_command(
    values: JobValues, *, store_endpoint: str, node_address: str, trainer_args: list[str]
) -> list[str]:
    """The training container's command: ft_launcher (torchrun for the baseline) and the trainer."""
    features = nvrx_features(values.resolved_nvrx_version)
    b, t = values.budgets, values.timeouts
    common = [
        f"--nnodes={values.num_nodes}:{values.num_nodes}",
        f"--nproc-per-node={values.profile.workers_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={store_endpoint}",
        f"--rdzv-id={values.name}",
        f"--rdzv-conf={rdzv_conf(values)}",
        # The address this node joins with: its stable DNS name (also the workers' MASTER_ADDR when it
        # hosts rank 0, and how `training.rendezvous evict` recognizes its predecessor).
        f"--local-addr={node_address}",
        f"--max-restarts={b.launcher_max_restarts}",
        f"--monitor-interval={t.monitor_interval_s:g}",
    ]
    if values.mode == "baseline":
        return ["torchrun", *common, "-m", "training", *trainer_args]
    ft = [
        f"--workers-stop-timeout={t.workers_stop_s:g}",
        f"--term-timeout={t.term_s:g}",
        f"--ft-initial-rank-heartbeat-timeout={t.launcher_initial_heartbeat_s:g}",
        f"--ft-rank-heartbeat-timeout={t.launcher_heartbeat_s:g}",
    ]
    if values.mode == "both" and features.has_min_healthy:
        ft.append("--ft-restart-policy=min-healthy")
    return ["ft_launcher", *common, *ft, "-m", "training", *trainer_args]
