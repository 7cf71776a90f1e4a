"""Launcher command lines derived from one NVRx version.

The job chart never types a launcher flag by hand: `launcher_command(values)` builds the container
command from the NVRx version the image carries (kitcore/pins.py `IMAGE.nvrx_version`, or the version
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
  is the keep-alive based one that `training.rendezvous.evict` understands, so the replacement pod's
  hand-over (`--evict-predecessor`, training/launch.py) evicts only with the keep-alive rendezvous;
  with either it reopens a rendezvous that a launcher out of restarts closed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from k8s.nvrx_versions import nvrx_features

if TYPE_CHECKING:
    from k8s.values import JobValues


FT_LAUNCHER = ("python", "-m", "training.launch")
"""ft_launcher, through training/launch.py: the same flags, workers forked from a warm forkserver."""
NVRX_RDZV_POLL_S = 1.0
"""NVRx 0.4.1's own wait between rendezvous polls: rendered only when the values change it."""


def rdzv_conf(values: JobValues) -> str:
    """`--rdzv-conf`: the store lives in its own pod (is_host=0); join waits longer than a reschedule."""
    t = values.timeouts
    items = {
        "is_host": "0",
        "join_timeout": str(t.rdzv_join_s),
        "last_call_timeout": str(t.rdzv_last_call_s),
        "close_timeout": str(t.rdzv_close_s),
    }
    return ",".join(f"{k}={v}" for k, v in items.items())


def launcher_command(
    values: JobValues, *, store_endpoint: str, node_address: str, trainer_args: list[str]
) -> list[str]:
    """The training container's command: ft_launcher (torchrun for the baseline) and the trainer."""
    features = nvrx_features(values.resolved_nvrx_version)
    b, t = values.budgets, values.timeouts
    # Warm spares (k8s/values.py `spares`): counted in max with 0.7's barrier, beyond it with 0.4.1.
    max_nodes = values.num_nodes + (values.spares if features.spares_in_max_nodes else 0)
    common = [
        f"--nnodes={values.num_nodes}:{max_nodes}",
        f"--nproc-per-node={values.profile.workers_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={store_endpoint}",
        f"--rdzv-id={values.name}",
        f"--rdzv-conf={rdzv_conf(values)}",
        # The address this node joins with: its stable DNS name (also the workers' MASTER_ADDR when it
        # hosts rank 0, and how `training.rendezvous.evict` recognizes its predecessor).
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
        f"--ft-workload-check-interval={t.heartbeat_check_s:g}",
    ]
    if values.mode == "both" and features.has_min_healthy:
        ft.append("--ft-restart-policy=min-healthy")
    # The replacement's rendezvous hand-over (training/launch.py, training/rendezvous.py): evict the
    # dead predecessor (keep-alive rendezvous only), reopen a rendezvous a launcher out of restarts
    # closed. Every pod runs it; on a first start there is nothing to evict or reopen.
    rendezvous = "keep-alive" if features.keep_alive_rendezvous else "barrier"
    handover = [f"--evict-predecessor={rendezvous}", f"--evict-timeout={t.pod_reschedule_s:g}"]
    if features.keep_alive_rendezvous and t.rdzv_poll_s != NVRX_RDZV_POLL_S:
        handover.append(f"--rdzv-poll={t.rdzv_poll_s:g}")
    if values.spares and features.keep_alive_rendezvous:
        # Warm spares stand by outside 0.4.1's rendezvous until a node is lost (training/rendezvous.py
        # `Standby`); 0.7's barrier takes them in max_nodes and prefers previous actives itself.
        handover.append(f"--warm-spares={values.spares}")
    return [*FT_LAUNCHER, *handover, *common, *ft, "-m", "training", *trainer_args]
