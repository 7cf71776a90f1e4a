"""Resilience layers composed around the training loop, selected by mode; the loop never asks which.

The loop sees one `Resilience` object and calls four things on it: `wrap(run)` once, `step_done(step)`
after each step, `atomic()` around the optimizer update, and `state_dict()/load_state_dict()` with the
checkpoint. Each layer implements what it needs:

- `InProcessLayer` (nvidia_resiliency_ext.inprocess.Wrapper): restarts `run` in the same process on every
  rank after an exception or a Python-visible hang; pings its progress watchdog per step; its own TCPStore
  on a port rank 0 picks per launcher round; `RetryController` with min world size = the full world,
  because the data order and bit-exact resume depend on the world size: a lost rank is ft_launcher's job,
  not a reason to continue with fewer ranks.
- `FtLauncherLayer` (RankMonitorClient): a heartbeat per step; after `calc_timeouts_after` steps the
  timeouts are calculated from observed intervals, raised to configured floors (a tiny model's calculated
  timeout is milliseconds) and persisted with the checkpoint, so a restarted rank is watched at once.

How the two combine (mode `both`): the launcher's minimum node count matches the in-process layer's
minimum world: both are "all of them" (--nnodes N:N+spares, min_world_size = world size), so in-process
restart never shrinks the job, and ft_launcher (restart policy `any-failed`, the only one NVRx >= 0.7 has)
restarts every node's workers as soon as one rank's process is gone (SIGKILL, a deadlock killed by the
heartbeat monitor, node loss). Soft faults never end a process, so the launcher never sees them.
A rank the in-process layer is restarting sends no step heartbeats, so the in-process layer beats for
it from the moment the restart is decided until its next step, and the launcher's heartbeat timeout
must exceed only a rank's silence before its restart is decided (training/resilience/config.py
`inprocess_recovery_silence_s`), however long the recovery takes: a Python-visible hang stays the
in-process layer's, and a deadlock below Python, whose rank holds the GIL and beats for nothing, is
ended that much sooner.

Why in-process restart stays on NVRx 0.7, which deprecates it for in-job restart: measured side by side
(the demo per mode, README.md and docs/measurements.md), the in-process layer recovers an exception, an
allocation failure, a hang and a skipped collective (the last two after the peers' collective timeout)
without losing a step and sooner than ft_launcher alone, which restarts the workers and replays a step.
The price is on hard faults, which take longer in mode `both`: a deadlock below Python is ended by the
launcher's heartbeat timeout, which must exceed a recovering rank's longest silence (ft_launcher alone
sees the peers' collective time out first), and a SIGKILL's survivors first start an in-process restart.
`both` stays the default because a soft fault then costs no step, where ft_launcher alone replays a step
and takes up to seconds; a fleet whose faults are mostly below Python (deadlocks, hung drivers) recovers
those faster with `mode: ft_launcher`, and `nvrx-eks plan` weighs the two against a fault mix.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import signal
import threading
import time
import typing
from typing import TYPE_CHECKING, Any

from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.training import parallel
from nvrx_eks.training.resilience import nvrx_compat
from nvrx_eks.training.resilience.modes import layers as mode_layers

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from nvrx_eks.kitcore.ports import ReservedPort
    from nvrx_eks.training.events import EventLog
    from nvrx_eks.training.resilience.config import ResilienceConfig


class Layer:
    """No-op defaults: the baseline."""

    def wrap(self, run: Callable[[], Any]) -> Callable[[], Any]:
        return run

    def step_done(self, step: int) -> None:  # noqa: ARG002
        return None

    def alive(self) -> None:
        """The rank takes no step but is alive: it waits on the kit's own work after its last step
        (`Resilience.kept_alive`). Called from a thread of its own."""

    def attempt_failed(self) -> None:
        """The training function raised a fault (not the script's bug): a restart follows. Called in the
        main thread as the exception leaves the attempt."""

    def finished_when(self, done: Callable[[], bool]) -> None:
        """From now on `done()` says whether every rank has finished training (the last persists
        committed, the final state written): a restart decided once it holds has nothing to redo."""

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        yield

    def within(self, atomic: Callable[[], contextlib.AbstractContextManager[None]]) -> None:
        """`atomic`: the composed layers' atomic section (`Resilience.atomic`), where no in-process
        restart interrupts the main thread; a layer that must finish what it starts there keeps it."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: ARG002
        return None

    def close(self) -> None:
        return None


class InProcessLayer(Layer):
    def __init__(
        self,
        cfg: ResilienceConfig,
        events: EventLog,
        *,
        store: Any,  # noqa: ANN401
        world: parallel.World,
        on_restart_decided: Callable[[], None] | None = None,
    ) -> None:
        self.cfg = cfg.inprocess
        self.events = events
        self.on_restart_decided = on_restart_decided
        self.run_returned = False
        self._done: Callable[[], bool] | None = None
        self._known_done = False
        self.call_wrapper: Any = None
        self.port = cfg.inprocess.store_port
        self._port_held: ReservedPort | None = None
        if self.port is None:
            # No restart count in the key: a replaced node's agent counts its restarts from 0. The
            # store is this launcher round's own (see parallel.base_store).
            self.port, self._port_held = parallel.shared_free_port(store, world, key="inprocess-store-port")

    def _wrapper(self) -> Any:  # noqa: ANN401
        import torch  # noqa: PLC0415
        from nvidia_resiliency_ext import inprocess  # noqa: PLC0415

        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        seconds = dt.timedelta
        c = self.cfg
        gpu = torch.cuda.is_available()
        nvrx_compat.initial_ranks_as_ints()  # before the Wrapper forks its monitor process
        return nvrx_compat.inprocess_wrapper(
            gpu=gpu,
            store_factory=nvrx_compat.host_first_store(),
            store_kwargs={"port": self.port},
            initialize=inprocess.initialize.RetryController(
                max_iterations=c.max_iterations, min_world_size=world_size, min_active_world_size=world_size
            ),
            finalize=self._finalize(),
            abort=self._abort(gpu=gpu),
            health_check=self._health_check(gpu=gpu),
            soft_timeout=seconds(seconds=c.soft_timeout_s),
            hard_timeout=seconds(seconds=c.hard_timeout_s),
            heartbeat_timeout=seconds(seconds=c.heartbeat_timeout_s),
            barrier_timeout=seconds(seconds=c.barrier_timeout_s),
            completion_timeout=seconds(seconds=c.completion_timeout_s),
            monitor_thread_interval=seconds(seconds=c.interval_s),
            monitor_process_interval=seconds(seconds=c.interval_s),
            heartbeat_interval=seconds(seconds=c.interval_s),
            progress_watchdog_interval=seconds(seconds=c.interval_s),
            last_call_wait=seconds(seconds=c.last_call_wait_s),
            termination_grace_time=seconds(seconds=2),
        )

    def _abort(self, *, gpu: bool) -> Any:  # noqa: ANN401
        from nvidia_resiliency_ext import inprocess  # noqa: PLC0415

        class _KeepGlooGroups(inprocess.abort.Abort):  # type: ignore[misc]  # NVRx ships no types: its base class is Any
            # The monitor thread runs `abort` before it interrupts the main thread. NVRx's default
            # destroys every process group, which on gloo blocks until the in-flight collective times
            # out (gloo cannot abort it), and with it the interrupt: up to a collective timeout per restart.
            # On CPU the main thread's wait is interruptible (parallel.wait), and the next attempt
            # retires the old group without waiting (parallel.retire_default_group): nothing to abort.
            def __call__(self, state: Any) -> Any:  # noqa: ANN401
                return state

        on_restart_decided = self.on_restart_decided
        finished, events = self.finished, self.events

        class _SignalRestartThenAbort(inprocess.abort.Abort):  # type: ignore[misc]  # NVRx ships no types: its base class is Any
            # The first thing the monitor thread does once a restart is decided, on every rank whose
            # interpreter can still run a thread: tell the outer layer (ft_launcher's heartbeat) that
            # this rank is alive and recovering, then abort as `inner` does. A rank that holds the GIL
            # in a native call (a deadlock below Python) runs no thread and stays silent.
            # Once every rank has finished training there is nothing to restart, and ranks that left
            # would never come back to the restart: the interrupt waits until the call has ended.
            def __init__(self, inner: Any) -> None:  # noqa: ANN401
                self.inner = inner

            def __call__(self, state: Any) -> Any:  # noqa: ANN401
                if finished():
                    events.emit("restart_declined", layer="inprocess", reason="every rank finished training")
                    nvrx_compat.hold_restart_until_call_ends()
                    return state
                if on_restart_decided is not None:
                    on_restart_decided()
                return self.inner(state)

        # NVRx's default abort on GPU, named: passing `abort=None` would turn aborting off, and a rank
        # waiting on a collective of a failed peer would wait out the NCCL timeout.
        inner = inprocess.abort.AbortTorchDistributed() if gpu else _KeepGlooGroups()
        return _SignalRestartThenAbort(inner)

    def _finalize(self) -> Any:  # noqa: ANN401
        from nvidia_resiliency_ext import inprocess  # noqa: PLC0415

        events = self.events

        class _Finalize(inprocess.finalize.Finalize):  # type: ignore[misc]  # NVRx ships no types: its base class is Any
            # Runs on every surviving rank once a restart is decided: the detection event.
            def __call__(self, state: Any) -> Any:  # noqa: ANN401
                events.emit("detected", layer="inprocess", cause=repr(state.fn_exception)[:300])
                return state

        return _Finalize()

    def _health_check(self, *, gpu: bool) -> Any:  # noqa: ANN401
        from nvidia_resiliency_ext import inprocess  # noqa: PLC0415

        class _InputIsFinal(inprocess.health_check.HealthCheck):  # type: ignore[misc]  # NVRx ships no types: its base class is Any
            # Input the user must fix (kitcore UserError: resuming another model's checkpoint, ...)
            # fails the same way on every attempt: end the wrapper (a failed health check) instead of
            # restarting until the budget is spent; wrap() hands the UserError on (exit 2).
            def __call__(self, state: Any) -> Any:  # noqa: ANN401
                if isinstance(state.fn_exception, UserError):
                    raise state.fn_exception
                return state

        checks: list[Any] = [
            _InputIsFinal(),
            inprocess.health_check.FaultCounter(max_rank_faults=self.cfg.max_rank_faults),
        ]
        if gpu:
            checks.insert(0, inprocess.health_check.CudaHealthCheck(timeout=dt.timedelta(seconds=10)))
        return inprocess.Compose(*checks)

    def wrap(self, run: Callable[[], Any]) -> Callable[[], Any]:
        from nvidia_resiliency_ext.inprocess import CallWrapper  # noqa: PLC0415

        def attempt(call_wrapper: Any = None) -> Any:  # noqa: ANN401
            self.call_wrapper = call_wrapper
            result = run()
            self.run_returned = True
            return result

        # The wrapper injects itself by the parameter's annotation, which must be a real type here
        # (this module uses postponed annotations).
        attempt.__annotations__["call_wrapper"] = typing.Optional[CallWrapper]  # noqa: UP045
        wrapped = self._wrapper()(attempt)
        nvrx_compat.on_monitor_thread_death(self._leave_without_inprocess_store)

        def call() -> Any:  # noqa: ANN401
            try:
                return wrapped()
            except Exception as exc:
                # NVRx re-raises its final exception `from None`: the UserError a health check stopped
                # on is then its context, not its cause.
                cause = exc.__cause__ or exc.__context__
                while cause is not None and not isinstance(cause, UserError):
                    cause = cause.__cause__ or cause.__context__
                if cause is not None:
                    raise cause from None
                raise
            finally:
                nvrx_compat.stop_progress_watchdog(getattr(self, "call_wrapper", None))

        return call

    def _leave_without_inprocess_store(self, exc: BaseException | None) -> None:
        """The Wrapper's monitor thread died (its store, hosted by rank 0, is gone: rank 0's node was
        lost): this rank can no longer be restarted in process, and its main thread would wait for that
        thread until the launcher's heartbeat timeout. End the process now; the launcher restarts the
        node's workers. Not once training has returned: rank 0 may leave first at the end of a run."""
        if not self.run_returned:
            leave_process(self.events, 1, layer="inprocess", cause=f"in-process store lost: {exc!r}"[:300])

    def attempt_failed(self) -> None:
        # NVRx's monitor decides the restart only once the rank's record has gone through its monitor
        # process and the store, and a rank blocked in a collective gets here only at the collective
        # timeout: on a loaded machine that has outlasted the launcher's heartbeat timeout, which then
        # killed a rank the in-process restart was about to recover. The recovery beats start here.
        if self.on_restart_decided is not None:
            self.on_restart_decided()

    def finished_when(self, done: Callable[[], bool]) -> None:
        self._done = done

    def finished(self) -> bool:
        """Every rank has finished training: this rank's run returned (it passed the last barrier), or
        the predicate `finished_when` gave holds. Once true, true for good."""
        if not self._known_done:
            try:
                self._known_done = self.run_returned or (self._done is not None and self._done())
            except Exception:  # noqa: BLE001 - the store unreachable: not known to be done, restart as usual
                return False
        return self._known_done

    def step_done(self, step: int) -> None:  # noqa: ARG002
        self.call_wrapper.ping()

    def alive(self) -> None:
        # The progress timestamp a step's ping sets: the monitor's soft timeout reads it.
        call_wrapper = getattr(self, "call_wrapper", None)
        if call_wrapper is not None:
            call_wrapper.ping()

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        # The restart machinery must not interrupt the optimizer update half-way.
        with self.call_wrapper.atomic():
            yield

    def close(self) -> None:
        if self._port_held is not None:
            self._port_held.release()


class FtLauncherLayer(Layer):
    def __init__(self, cfg: ResilienceConfig, events: EventLog) -> None:
        from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient  # noqa: PLC0415

        self.cfg = cfg.ft
        self.events = events
        self.recovery_beat_s = cfg.inprocess.interval_s
        # NVRx ends an in-process restart that outlasts its barrier timeout; so do the recovery beats.
        self.recovery_beats_for_s = cfg.inprocess.barrier_timeout_s
        self.client = RankMonitorClient()
        self.client.init_workload_monitoring(num_warmup_iters=cfg.ft.calc_timeouts_after)
        # The in-process Wrapper's monitor process is forked from this rank and outlives it.
        nvrx_compat.close_rank_monitor_socket_in_forks(self.client)
        self.steps_this_attempt = 0
        self.attempts = 0
        self.restored = False
        # One request on the launcher's socket at a time (a request and its reply), or the socket falls
        # out of step ("Unexpected reply", then a broken pipe) and every later heartbeat of the process
        # fails: the recovery beats come from the in-process monitor thread and a thread of their own,
        # while the main thread restores the launcher's timeouts with the checkpoint.
        self._sending = threading.Lock()
        self._beating = False
        # Set from a restart's decision until the rank's next step; beats are due until `_beats_until`.
        self._recovering = threading.Event()
        self._beats_until = 0.0
        self._beater: threading.Thread | None = None
        self._beater_lock = threading.Lock()
        self._atomic: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext

    def within(self, atomic: Callable[[], contextlib.AbstractContextManager[None]]) -> None:
        self._atomic = atomic

    @contextlib.contextmanager
    def _request(self) -> Iterator[None]:
        """The main thread's request and reply on the launcher's socket: one at a time (`_sending`), and
        inside the atomic section. An in-process restart is raised into the main thread wherever it is;
        landing between a request's length and its body, or before its reply is read, it left the
        socket out of step, and the launcher's side closed it ("invalid load key"): the next attempt's
        restore then failed on a broken pipe, twice, and the job failed as a bug in the script."""
        with self._atomic(), self._sending:
            yield

    def wrap(self, run: Callable[[], Any]) -> Callable[[], Any]:
        def attempt() -> Any:  # noqa: ANN401
            self.steps_this_attempt = 0
            self.attempts += 1
            if self.attempts > 1:
                # An in-process restart's new attempt: the rank is alive and about to restore.
                self.beat_while_recovering()
            result = run()
            self.training_done()  # also ends a recovery whose run returned before its first step
            return result

        return attempt

    def training_done(self) -> None:
        """Every step is done (the trainer's last store barrier passed on every rank): the launcher stops
        expecting heartbeats now. The teardown that follows -- the in-process Wrapper's completion and
        termination barriers, its monitor process's shutdown, the checkpointer's last persists --
        sends none, and may outlast the heartbeat timeout: the launcher would then kill every rank and
        restart a finished job."""
        self._recovering.clear()
        # Not in the atomic section: every rank has passed the last barrier, so a restart decided now
        # is declined and held in the monitor thread, which holds the section until the call ends.
        with self._sending:
            self._beating = False
            self.client.shutdown_workload_monitoring()

    def beat_while_recovering(self) -> None:
        """Heartbeats for an in-process recovery, from the moment a restart is decided (the in-process
        monitor thread calls this) until the rank's next step: one now, then one every in-process
        interval from a thread of their own, so that the launcher's heartbeat timeout needs to cover
        only a rank's silence before its restart is decided (the soft timeout), never how long the
        recovery takes. A recovery waits for its slowest rank -- one blocked in a gloo collective that
        cannot be aborted, or in a slow native call -- and on a loaded machine its barrier, health
        checks and the next attempt's start take seconds more: a launcher that saw that silence would
        kill ranks the in-process layer is restarting. Only once the rank has beaten from a step: the
        first heartbeat ends the launcher's initial timeout, which covers start-up and the checkpoint
        load. A rank deadlocked below Python holds the GIL, so its beating thread is silent too; the
        beats stop after the in-process barrier timeout, by when NVRx has ended the restart."""
        if not self._beating:
            return
        self._beats_until = time.monotonic() + self.recovery_beats_for_s
        self._recovering.set()
        self._beat_once()
        with self._beater_lock:  # the monitor thread and the main thread both call this
            if self._beater is None:
                self._beater = threading.Thread(
                    target=self._beat_in_recoveries, name="ft-recovery-beats", daemon=True
                )
                self._beater.start()

    def _beat_in_recoveries(self) -> None:
        """The beating thread: one heartbeat every in-process interval while a recovery is on."""
        while self._recovering.wait():
            time.sleep(self.recovery_beat_s)
            if self._recovering.is_set() and time.monotonic() < self._beats_until:
                self._beat_once()

    def _beat_once(self) -> None:
        """One heartbeat, never waiting: if the main thread is sending one right now, that one counts."""
        if not self._sending.acquire(blocking=False):
            return
        try:
            if self._beating:
                self.client.send_heartbeat()
        except Exception as exc:  # noqa: BLE001 - a lost beat costs at most a launcher restart
            self.events.emit("ft_heartbeat_failed", error=repr(exc)[:200])
        finally:
            self._sending.release()

    def alive(self) -> None:
        self._beat_once()

    def step_done(self, step: int) -> None:  # noqa: ARG002
        with self._request():
            self.client.send_heartbeat()
        self._recovering.clear()
        self._beating = True
        self.steps_this_attempt += 1
        # Same step count on every rank, so the collective inside the calculation lines up.
        if not self.restored and self.steps_this_attempt == self.cfg.calc_timeouts_after:
            with self._request():
                if self.client.calculate_and_set_hb_timeouts(skip_if_not_ready=True):
                    self._apply_floors(calculated=True)
            self.restored = True

    def _apply_floors(self, *, calculated: bool) -> None:
        """The configured floors under the heartbeat timeouts; a message to the launcher: call it holding
        `_sending`."""
        current = self.client.hb_timeouts
        initial = max(current.initial or 0.0, self.cfg.initial_timeout_floor_s)
        subsequent = max(current.subsequent or 0.0, self.cfg.heartbeat_timeout_floor_s)
        nvrx_compat.set_heartbeat_timeouts(self.client, initial=initial, subsequent=subsequent)
        self.events.emit("ft_timeouts", initial_s=initial, subsequent_s=subsequent, calculated=calculated)

    def state_dict(self) -> dict[str, Any]:
        return {"ft": dict(self.client.state_dict())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # Only calculated timeouts count: a checkpoint written before `calc_timeouts_after` steps holds
        # none, and applying the floors to the launcher's defaults would leave this attempt on them
        # (a deadlock then waited for the in-process hard timeout instead of the heartbeat timeout).
        if state.get("ft", {}).get(self.client.CURRENT_TIMEOUTS_STATE_KEY, {}).get("heartbeat"):
            with self._request():  # the recovery beats are still on: the restore precedes the next step
                self.client.load_state_dict(state["ft"])
                self._apply_floors(calculated=False)
            self.restored = True

    def close(self) -> None:
        self.training_done()


class Resilience(Layer):
    """The mode's layers, composed: the first wraps outermost."""

    def __init__(self, layers: list[Layer]) -> None:
        self.layers = layers
        for layer in layers:
            layer.within(self.atomic)

    def wrap(self, run: Callable[[], Any]) -> Callable[[], Any]:
        for layer in reversed(self.layers):
            run = layer.wrap(run)
        return run

    def step_done(self, step: int) -> None:
        # One atomic section for the step's end in every layer (the launcher's requests take it again:
        # FtLauncherLayer._request says why).
        with self.atomic():
            for layer in self.layers:
                layer.step_done(step)

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for layer in self.layers:
                stack.enter_context(layer.atomic())
            yield

    def attempt_failed(self) -> None:
        for layer in self.layers:
            layer.attempt_failed()

    def finished_when(self, done: Callable[[], bool]) -> None:
        for layer in self.layers:
            layer.finished_when(done)

    @contextlib.contextmanager
    def kept_alive(self, interval_s: float) -> Iterator[None]:
        """Every layer told that the rank is alive every `interval_s` while the block runs: the kit's
        own waits after the last step (the last persists, the last barrier, which waits for the slowest
        rank) send no step's ping or heartbeat, and on a loaded machine outlast the in-process soft
        timeout and the launcher's heartbeat timeout. Either would then restart ranks of a finished
        job, whose other ranks may have left already. From a thread, as the recovery beats are: a rank
        stuck below Python holds the GIL, so it still falls silent."""
        done = threading.Event()

        def beat() -> None:
            while not done.wait(interval_s):
                for layer in self.layers:
                    try:
                        layer.alive()
                    except Exception:  # noqa: BLE001, S112 - a lost beat: the wait's own timeout still ends it
                        continue

        beating = threading.Thread(target=beat, name="kit-kept-alive", daemon=True)
        beating.start()
        try:
            yield
        finally:
            done.set()
            beating.join()

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        for layer in self.layers:
            state.update(layer.state_dict())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for layer in self.layers:
            layer.load_state_dict(state)

    def close(self) -> None:
        for layer in self.layers:
            layer.close()


def for_mode(cfg: ResilienceConfig, events: EventLog, *, store: Any, world: parallel.World) -> Resilience:  # noqa: ANN401
    """The layers `cfg.mode` names; `store` is the process-group store (the in-process layer agrees on
    its own store's port through it)."""
    spec = mode_layers(cfg.mode)
    ft = FtLauncherLayer(cfg, events) if spec.heartbeats else None
    layers: list[Layer] = []
    if spec.inprocess:
        beat = ft.beat_while_recovering if ft is not None else None
        layers.append(InProcessLayer(cfg, events, store=store, world=world, on_restart_decided=beat))
    if ft is not None:
        layers.append(ft)
    return Resilience(layers)


_leaving = threading.Lock()


def leave_process(events: EventLog, exit_code: int, **terminated: Any) -> None:  # noqa: ANN401
    """Record why this worker ends (a `terminated` event), close the event log and exit at once, once:
    the paths that end a worker (a SIGTERM's handler and its watcher thread, a lost in-process store)
    may fire together, and only the first may write and close the log. The others return."""
    if not _leaving.acquire(blocking=False):
        return
    events.emit("terminated", **terminated)
    events.close()
    os._exit(exit_code)


def install_termination_handler(events: EventLog) -> None:
    """The launcher stops workers with SIGTERM (and the in-process monitor process on a hard timeout):
    record it -- the detection time of the outer layer -- and leave at once.

    At once even while the main thread waits in native code. A Python signal handler runs only in the
    main thread, between bytecodes: a rank blocked in a collective on a hung or dead peer, or in the
    in-process layer's store barrier, runs it only when that wait times out, and its launcher waits as
    long before it can restart anyone. So the handler also writes the signal to a wakeup pipe
    (`signal.set_wakeup_fd`, done by the interpreter's C-level handler the moment the signal arrives),
    and a daemon thread blocked on that pipe leaves for it: the waits it cuts short release the GIL. A
    rank holding the GIL in a native call is left to the launcher's SIGKILL.

    `os._exit`, not `sys.exit`: a SystemExit unwinds through the in-process wrapper's shutdown barriers,
    the checkpointer and the process group's teardown, which keep stopped workers alive for seconds
    while the launcher waits to restart them. Nothing is lost: a checkpoint counts only once committed
    (atomic rename), and events are flushed line by line.
    """

    def leave(signum: int) -> None:
        leave_process(events, 128 + signum, layer="ft_launcher", signal=signal.Signals(signum).name)

    def handler(signum: int, _frame: Any) -> None:  # noqa: ANN401
        leave(signum)

    read_fd, write_fd = os.pipe()  # not inherited across exec (PEP 446)
    os.set_blocking(write_fd, False)

    def watch() -> None:
        while True:
            for signum in os.read(read_fd, 64):  # blocks without the GIL
                if signum == signal.SIGTERM:
                    leave(signum)

    signal.signal(signal.SIGTERM, handler)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    # A child forked from this rank (no exec) would write its own signals into this rank's pipe.
    os.register_at_fork(after_in_child=lambda: signal.set_wakeup_fd(-1))
    threading.Thread(target=watch, name="termination-watch", daemon=True).start()
