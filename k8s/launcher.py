"""The training container's launcher command and the store's control command, from the job's values.

The job chart never types a launcher flag by hand. Both commands come from NVRx (k8s/nvrx_versions.py: the
pin's minor and newer), the same for a p5 job and the local job: only sizes and timeouts differ.

- The rendezvous is NVRx's barrier rendezvous, coordinated by NVRx's own external control process
  (`nvrx-control` through training/resilience/control.py, the store Deployment): it hosts the TCPStore and
  closes every round, and every launcher connects as a client (`--rdzv-conf is_host=0`). No training pod
  hosts the store, so losing any node leaves the others and the rendezvous running.
- Hot spares count in `--nnodes=N:N+S`: each round selects N active nodes, previous actives first
  (for `rdzv_last_call_s`), and keeps the others standing by in the rendezvous.
- Restarts: ft_launcher restarts a node's workers on any failure (0.7 has only `any-failed`), and counts
  restarts per rendezvous round, job-wide: `--max-restarts` is the job's budget of restart rounds
  before the launchers give up and the Job's own budget (backoffLimitPerIndex) takes over.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nvrx_eks.training.resilience.launch import ENTRY_SEPARATOR
from nvrx_eks.training.resilience.modes import layers

if TYPE_CHECKING:
    from nvrx_eks.k8s.values import JobValues


FT_LAUNCHER = ("python", "-m", "nvrx_eks.training.resilience.launch")
"""ft_launcher, through training/resilience/launch.py: the same flags, workers forked from a warm
forkserver."""
NVRX_CONTROL = ("python", "-m", "nvrx_eks.training.resilience.control")
"""NVRx's external control process (`nvrx-control`, the same flags) through
training/resilience/control.py, run by the rendezvous store's Deployment."""


def _nnodes(values: JobValues) -> str:
    return f"--nnodes={values.num_nodes}:{values.num_nodes + values.spares}"


def rdzv_conf(values: JobValues, *, client: bool) -> str:
    """`--rdzv-conf`: the store lives in its own pod (launchers: is_host=0); join waits longer than a
    reschedule; the last call is how long a restart round waits for a previous active node."""
    t = values.timeouts
    items = {"is_host": "0"} if client else {}
    items |= {
        "join_timeout": str(t.rdzv_join_s),
        "last_call_timeout": str(t.rdzv_last_call_s),
        "close_timeout": str(t.rdzv_close_s),
    }
    return ",".join(f"{k}={v}" for k, v in items.items())


def control_command(values: JobValues, *, port: int) -> list[str]:
    """The store pod's command: `nvrx-control` serving the TCPStore on `port` for the job's rendezvous."""
    return [
        *NVRX_CONTROL,
        _nnodes(values),
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=0.0.0.0:{port}",
        f"--rdzv-id={values.name}",
        f"--rdzv-conf={rdzv_conf(values, client=False)}",
        # NVRx's log funnel (a gRPC server collecting the launchers' logs) is for shared-filesystem
        # logs; pods log to stdout, so it stays off and the store pod serves only the TCPStore.
        "--ft-enable-log-server=false",
    ]


def launcher_command(
    values: JobValues, *, store_endpoint: str, node_address: str, entry: list[str]
) -> list[str]:
    """The training container's command: the launcher the mode runs (training/resilience/modes.py) and
    its flags, then `entry`, what every rank runs (`-m MODULE ARGS` or `SCRIPT ARGS`). For ft_launcher,
    through training/resilience/launch.py, `--` marks where the launcher's flags end and the script
    begins: the wrapper never guesses it from the flags."""
    b, t = values.budgets, values.timeouts
    common = [
        _nnodes(values),
        f"--nproc-per-node={values.profile.workers_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={store_endpoint}",
        f"--rdzv-id={values.name}",
        f"--rdzv-conf={rdzv_conf(values, client=True)}",
        # The address this node joins with: its stable DNS name (also the workers' MASTER_ADDR when it
        # holds group rank 0).
        f"--local-addr={node_address}",
        f"--max-restarts={b.launcher_max_restarts}",
        f"--monitor-interval={t.monitor_interval_s:g}",
    ]
    if layers(values.mode).launcher == "torchrun":
        return ["torchrun", *common, *entry]
    ft = [
        f"--workers-stop-timeout={t.workers_stop_s:g}",
        f"--term-timeout={t.term_s:g}",
        f"--ft-initial-rank-heartbeat-timeout={t.launcher_initial_heartbeat_s:g}",
        f"--ft-rank-heartbeat-timeout={t.launcher_heartbeat_s:g}",
        f"--ft-workload-check-interval={t.heartbeat_check_s:g}",
    ]
    return [*FT_LAUNCHER, *common, *ft, ENTRY_SEPARATOR, *entry]
