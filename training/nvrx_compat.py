"""The one place that knows NVRx versions differ: 0.4.1 runs here, the image pins 0.7.0.

Read against both wheels' sources:
- `inprocess.Wrapper`: 0.7 dropped `rank_filter` (deprecated in 0.4) and added
  `monitor_process_pidfile`; the timeout ordering checks are the same. 0.6 deprecates the in-process
  layer in favour of ft_launcher; this kit keeps it (soft faults lose <= 1 step only in process).
- `RankMonitorClient.init_workload_monitoring`: 0.7 takes `num_warmup_iters`.
- Setting heartbeat timeouts with floors: both versions expose only the private
  `_set_calculated_timeouts(HeartbeatTimeouts, SectionTimeouts)`; it is used here and nowhere else.
- ft_launcher: mode `both` runs under `--ft-restart-policy min-healthy` on 0.3-0.6 (NVRx's integration
  guide; k8s/launcher.py emits it) and `any-failed` on 0.7, where min-healthy is gone. The trainer works
  under either: with --nnodes N:N and the in-process layer never shrinking the world, both restart every
  node's workers once a rank's process is gone (training/resilience.py).
"""

from __future__ import annotations

import inspect
from importlib.metadata import version
from typing import Any

NVRX_VERSION = version("nvidia-resiliency-ext")


def version_tuple(text: str = NVRX_VERSION) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:3] if part.isdigit())


def _accepted(callable_: Any, kwargs: dict[str, Any]) -> dict[str, Any]:  # noqa: ANN401
    params = inspect.signature(callable_).parameters
    return {key: value for key, value in kwargs.items() if key in params and value is not None}


def make_wrapper(**kwargs: Any) -> Any:  # noqa: ANN401
    """`inprocess.Wrapper(**kwargs)` keeping only the arguments this NVRx version accepts."""
    from nvidia_resiliency_ext import inprocess  # noqa: PLC0415 - heavy import, only in NVRx modes

    return inprocess.Wrapper(**_accepted(inprocess.Wrapper.__init__, kwargs))


def init_monitoring(client: Any, *, num_warmup_iters: int | None = None) -> None:  # noqa: ANN401
    kwargs = _accepted(client.init_workload_monitoring, {"num_warmup_iters": num_warmup_iters})
    client.init_workload_monitoring(**kwargs)


def set_heartbeat_timeouts(client: Any, *, initial: float, subsequent: float) -> None:  # noqa: ANN401
    """Install heartbeat timeouts as if calculated (so `state_dict` persists them)."""
    from nvidia_resiliency_ext.fault_tolerance.data import HeartbeatTimeouts  # noqa: PLC0415

    timeouts = HeartbeatTimeouts(initial=initial, subsequent=subsequent, were_calculated=True)
    client._set_calculated_timeouts(new_hb_timeouts=timeouts, new_section_timeouts=None)  # noqa: SLF001
