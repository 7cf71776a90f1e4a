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
- Warm spares: 0.4.1 parks agents beyond `--nnodes` max in a redundancy list that every restart round
  draws from, so a spare stands by before its agent's first join (`gate_first_join`); 0.7's barrier
  rendezvous has hot spares of its own (max nodes = active + standby, previous actives first).
"""

from __future__ import annotations

import inspect
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

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


def mend_multiprocess_workers() -> None:
    """NVRx 0.4.1's ft_launcher with workers started by multiprocessing (training/launch.py's
    forkserver), mended where it breaks; on 0.7 (torch's own worker context, the final state set
    explicitly) neither mend applies. Read against both wheels' launcher.py.

    - 0.4.1 vendors torch.distributed.elastic's MultiprocessContext, which reads `e.pid` of torch's
      ProcessExitedException; torch >= 2.2 names it `error_pid`, so the first failed worker raised
      AttributeError in the agent and the launcher exited (a SIGKILL of one rank became a pod failure).
    - Out of restarts, 0.4.1's agent stops the workers and reports their state once more: a subprocess
      context then reports every worker failed (FAILED), a multiprocessing one only the first
      (UNHEALTHY, which `launch_agent` does not treat as failed), so the launcher exited 0 and the Job
      counted a success. `run()` returns only when the workers succeeded or the restarts ran out, so
      UNHEALTHY there is FAILED, as 0.7 returns it. And since a multiprocessing context reports one
      failure (the first exited process it happens to look at: often a peer whose collective failed
      when the faulty rank died), the failures are completed from every worker's exit code, as a
      subprocess context reports them: the launcher's last log line, which names the job's cause
      (k8s/termination.py), again lists the rank killed by a signal.
    """
    from torch.multiprocessing.spawn import ProcessException  # noqa: PLC0415

    if not hasattr(ProcessException, "pid"):
        ProcessException.pid = property(lambda self: self.error_pid)  # type: ignore[attr-defined]
    if version_tuple() >= (0, 6):
        return
    from nvidia_resiliency_ext.fault_tolerance import launcher  # noqa: PLC0415

    run_result, worker_state = launcher.RunResult, launcher.WorkerState  # 0.4.1's vendored copies
    agent = launcher.LocalElasticAgent
    if getattr(agent.run, "nvrx_eks_mended", False):
        return
    original = agent.run

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
        result = original(self, *args, **kwargs)
        if result is None or result.state not in {worker_state.UNHEALTHY, worker_state.FAILED}:
            return result
        return run_result(state=worker_state.FAILED, failures=_every_failure(self, result.failures))

    run.nvrx_eks_mended = True  # type: ignore[attr-defined]
    agent.run = run


def _every_failure(agent: Any, failures: dict[int, Any]) -> dict[int, Any]:  # noqa: ANN401
    """`failures` (global rank -> ProcessFailure) plus every other worker of the last round that exited
    non-zero, read from the multiprocessing context's processes (kept after it is closed)."""
    processes = getattr(getattr(agent, "_pcontext", None), "_pc", None)
    if processes is None or not failures:
        return failures
    failure_type = type(next(iter(failures.values())))
    error_files = agent._pcontext.error_files  # noqa: SLF001 - 0.4.1's context, read only
    every = dict(failures)
    for local_rank, proc in enumerate(processes.processes):
        if proc.exitcode in {0, None}:
            continue
        rank = agent._worker_group.workers[local_rank].global_rank  # noqa: SLF001
        every.setdefault(
            rank,
            failure_type(
                local_rank=local_rank,
                pid=proc.pid,
                exitcode=proc.exitcode,
                error_file=error_files[local_rank],
            ),
        )
    return dict(sorted(every.items()))


def gate_first_join(gate: Callable[[], str]) -> None:
    """Run `gate()` (training/rendezvous.py `Standby.wait`) once, right before this launcher's agent
    first joins NVRx 0.4.1's keep-alive rendezvous: the pod is then warm (NVRx imported, the agent and
    the forkserver up) yet outside the rendezvous. The hook is torch's public `RendezvousHandler`
    call, `next_rendezvous`, on NVRx's handler class; later calls (restart rounds) are not gated."""
    from nvidia_resiliency_ext.fault_tolerance._ft_rendezvous import FtRendezvousHandler  # noqa: PLC0415

    original = FtRendezvousHandler.next_rendezvous
    gated = False

    def next_rendezvous(self: Any) -> Any:  # noqa: ANN401
        nonlocal gated
        if not gated:
            gated = True
            try:
                reason = gate()
            except RuntimeError as exc:  # the state not understood: join as without the gate
                reason = f"without standing by ({exc})"
            print(f"standby: joining the rendezvous: {reason}", flush=True)
        return original(self)

    FtRendezvousHandler.next_rendezvous = next_rendezvous  # type: ignore[method-assign]


def set_rendezvous_poll(seconds: float) -> None:
    """How often an agent waiting in NVRx 0.4.1's rendezvous reads its state. Two hard-coded seconds
    set it there: the op executor sleeps `_delay(seconds=1)` whenever it can only wait for other agents,
    and the state holder serves its cached copy of the state for `cache_duration=1` s after each read.
    Every launcher restart waits up to one such period for the new round to open and one more to learn
    it is complete (`make demo`: 1.2-1.4 s from an agent's "attempts to join" to "has joined"). This
    sets both to `seconds`; the random start-up skew (`_delay` with a range) is kept. 0.7's barrier
    rendezvous polls on its own schedule: nothing to change there."""
    if version_tuple() >= (0, 6):
        return
    from nvidia_resiliency_ext.fault_tolerance import _ft_rendezvous  # noqa: PLC0415
    from nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.rendezvous.utils import (  # noqa: PLC0415
        _delay,
    )

    poll = seconds

    def delay(seconds: float | tuple[float, float]) -> None:  # called as `_delay(seconds=...)`
        _delay(seconds=poll if seconds == 1 else seconds)

    _ft_rendezvous._delay = delay  # noqa: SLF001
    holder = _ft_rendezvous._BackendRendezvousStateHolder  # noqa: SLF001
    init = getattr(holder.__init__, "nvrx_eks_original", holder.__init__)

    def __init__(self: Any, backend: Any, settings: Any, cache_duration: float = 1) -> None:  # noqa: ANN401, N807
        init(self, backend, settings, cache_duration=min(cache_duration, poll))

    __init__.nvrx_eks_original = init  # type: ignore[attr-defined]
    holder.__init__ = __init__  # type: ignore[method-assign]
