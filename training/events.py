"""One JSONL event stream per rank: `<run_dir>/events/rank-<R>.jsonl`, appended by every process that
holds rank R (restarts append; the global rank of a node can change across ft_launcher restarts).

Every line: `{"t": unix seconds, "kind": str, "rank": int, "pid": int, "restart": int, "node": str, ...}`
(`restart` is the launcher's TORCHELASTIC_RESTART_COUNT, `node` the pod's JOB_COMPLETION_INDEX).
Kinds and their extra fields (training/metrics.py and localrun/summary.py read them):

- `process_start`: mode, world_size, local_rank, created_t (when the OS created the process), and the
  script's `Job(meta=...)` facts (the reference trainer's: model)
- `process_ready`: setup_s -- process start -> torch preloaded, stores and layers built (the part of a
  launcher restart spent before the first attempt); its parts: preload_s (torch._dynamo), layers_s
  (process-group store, resilience layers), trainer_s (data, checkpointer, metrics), gc_s; cpu_s: CPU
  seconds this process used until then (imports included; unlike wall time, not inflated by load)
- `attempt_start`: attempt (0 for a fresh process, +1 per in-process restart)
- `loop_start`: attempt, steps (the loop's length), first_step -- the script entered `Attempt.steps`
- `startup_done`: attempt, restored_step (-1: none), tier ("memory", "local", "durable", "inprocess", "none"),
  startup_s (attempt start -> ready), load_s, state_bytes, num_parameters (the tracked modules'),
  memcpy_gbps, imported_since_fork (the
  modules a forked worker imported itself before this attempt's first step; None when not forked)
- `step`: step, step_s (forward/backward/update), ckpt_s (time in save() plus the update's fence()), loss;
  once per step whose update landed: `cut` when an in-process restart stopped the rank between its
  update and the step's end (written as the next attempt resumes after it; ckpt_s 0, loss NaN)
- `checkpoint_<what>`: forwarded from the checkpointer (committed, skipped, failed, restored, ...)
- `checkpoint_peer_domain`: domain, source ("node labels", "zone label", "none"), node, error -- the
  failure domain the peer replica's partners are chosen by (training/checkpoint/domains.py), and why the
  node's labels were not used when they were not
- `checkpoint_peer_partners`: domains (every node's, by node rank), targets, sources -- the partners chosen
  when the replication group was made
- `fault_injected`: class, step, target_rank, expected_layer, index
- `caught_up`: source, from_step, to_step -- after an in-process restart this rank was a step behind
  and took the state of rank `source`, a step ahead (training/api.py `Attempt._in_memory_source`)
- `detected`: layer ("inprocess"), cause -- the in-process wrapper started a restart on this rank
- `terminated`: layer ("ft_launcher"), signal -- the launcher is stopping this worker; or layer
  ("inprocess"), cause -- this worker ends itself: its in-process store is gone, so only its launcher
  can restart it
- `ft_timeouts`: initial_s, subsequent_s, calculated -- heartbeat timeouts in force
- `user_code_error`: step, error (type, message, place), traceback -- this rank failed the same way in
  two attempts at the same step: a bug, not a fault; the job ends (training/failures.py)
- `end`: steps, final_params_sha256 (rank 0), wall_s
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping


def process_created_at(pid: int | None = None) -> float:
    """When the OS created the process, in Unix seconds, to the kernel's clock tick (10 ms).

    Not psutil's `create_time`: it adds the start (clock ticks since boot, /proc/PID/stat) to the boot time
    in /proc/stat, which the kernel gives in whole seconds, so every creation time comes out up to 1 s
    early, and a restart's worker-start phase takes that second from the rendezvous phase before it. Here
    the boot instant comes from the clocks themselves: now (realtime) minus the time since boot
    (CLOCK_BOOTTIME, which the start tick count also counts). Elsewhere than Linux: psutil's figure.
    """
    stat = Path(f"/proc/{pid or os.getpid()}/stat")
    if not stat.exists() or not hasattr(time, "CLOCK_BOOTTIME"):
        import psutil  # noqa: PLC0415

        return psutil.Process(pid).create_time()
    # Fields after the command name (which may hold spaces and parentheses); starttime is field 22.
    fields = stat.read_text().rpartition(")")[2].split()
    started_after_boot_s = int(fields[19]) / os.sysconf("SC_CLK_TCK")
    booted_at = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    return booted_at + started_after_boot_s


_modules_at_fork: frozenset[str] | None = None


def _remember_modules_at_fork() -> None:
    global _modules_at_fork  # noqa: PLW0603 - one record per process, taken in the fork's child
    _modules_at_fork = frozenset(sys.modules)


# Registered when the forkserver imports this module (training/resilience/launch.py `WARM_MODULES`), so
# every worker forked from it knows what it inherited.
os.register_at_fork(after_in_child=_remember_modules_at_fork)


def imported_since_fork() -> list[str] | None:
    """The modules this process imported after it was forked, each package once (its outermost new
    module), or None for a process that was not forked from one that had imported this module.

    A worker forked from the launcher's warm forkserver should import nothing before its first step:
    every import here is paid again on every restart, by every rank at once."""
    if _modules_at_fork is None:
        return None
    new = set(sys.modules) - _modules_at_fork
    return sorted(name for name in new if name.rpartition(".")[0] not in new)


def event_line(kind: str, fields: Mapping[str, Any]) -> str:
    """One event as one readable console line, `kind key=value ...`: each value as JSON writes it (a
    string bare unless it has spaces), never a Python repr. The one way an event reads in a log."""
    parts = [kind]
    for key, value in fields.items():
        plain = isinstance(value, str) and value and not any(c.isspace() or c == '"' for c in value)
        text = value if plain else json.dumps(value, default=str, separators=(",", ":"))
        parts.append(f"{key}={text}")
    return " ".join(parts)


def events_dir(run_dir: Path) -> Path:
    return run_dir / "events"


class EventLog:
    """Append-only JSONL writer; each line is flushed so a SIGKILL loses nothing already emitted."""

    def __init__(self, *, run_dir: Path, rank: int) -> None:
        self.rank = rank
        self.path = events_dir(run_dir) / f"rank-{rank}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", buffering=1, encoding="utf-8")
        self._lock = threading.Lock()  # the in-process monitor thread and signal handlers emit too
        self._base = {
            "rank": rank,
            "pid": os.getpid(),
            "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
            "node": os.environ.get("JOB_COMPLETION_INDEX", "0"),
        }
        self._listeners: list[Callable[[dict[str, Any]], None]] = []

    def subscribe(self, listener: Callable[[dict[str, Any]], None]) -> None:
        """Call `listener` with every event emitted from now on (the Prometheus metrics)."""
        self._listeners.append(listener)

    def emit(self, kind: str, **fields: Any) -> None:  # noqa: ANN401
        event = {"t": time.time(), "kind": kind, **self._base, **fields}
        line = json.dumps(event, default=str)
        with self._lock:
            if not self._file.closed:
                self._file.write(line + "\n")
            for listener in self._listeners:
                try:
                    listener(event)
                except Exception:
                    logging.getLogger("training").exception("event listener failed on %s", kind)

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """Every rank's events, time-ordered; a torn last line (a killed writer) is skipped."""
    events: list[dict[str, Any]] = []
    for path in sorted(events_dir(run_dir).glob("rank-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    events.sort(key=lambda e: e["t"])
    return events
