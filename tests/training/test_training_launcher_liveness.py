"""training/resilience/launcher_liveness.py: each launcher beats in the rendezvous store while it lives,
and a launcher whose watched peer stopped beating opens the next restart round."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nvrx_eks.training.resilience import launcher_liveness
from nvrx_eks.training.resilience.nvrx_compat import barrier_state

_BEATING_LAUNCHER = """
import sys, time
from nvrx_eks.training.resilience.launcher_liveness import LauncherBeat
alive = LauncherBeat(sys.argv[1], run_id="job", infra_rank=3, every_s=0.05).start()
sys.stdin.read()  # beats until the test closes its stdin, then exits as a launcher does
if sys.argv[2] == "done":
    alive.finish(done=True)  # what the launcher does when its workers finished training
"""


@pytest.mark.parametrize("ending", ["gone", "done"])
def test_a_launcher_beats_while_it_lives_and_its_beat_ages_once_it_is_gone(ending):
    from datetime import timedelta  # noqa: PLC0415

    from torch.distributed import TCPStore  # noqa: PLC0415

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    prefix = barrier_state(store, run_id="job").prefix
    launcher = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_BEATING_LAUNCHER), f"127.0.0.1:{store.port}", ending],
        stdin=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    try:
        deadline = time.monotonic() + 60
        while launcher_liveness.launcher_beat_age(store, prefix, 3) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        assert launcher_liveness.launcher_beat_age(store, prefix, 3) < 0.5  # written again and again
    finally:
        launcher.stdin.close()
        # A clean exit: the beat's store client is gone before the interpreter ends (no SIGABRT).
        assert launcher.wait(timeout=60) == 0
    time.sleep(0.3)
    if ending == "gone":
        assert launcher_liveness.launcher_beat_age(store, prefix, 3) >= 0.3
    else:  # a node whose training ended is never read as lost
        assert launcher_liveness.launcher_beat_age(store, prefix, 3) is None
    assert launcher_liveness.launcher_beat_age(store, prefix, 0) is None


def _beat(store, prefix: str, infra_rank: int, age_s: float | None) -> None:
    if age_s is not None:
        store.set(launcher_liveness.launcher_beat_key(prefix, infra_rank), repr(time.time() - age_s))


def test_a_launcher_opens_the_next_round_once_the_node_it_watches_stopped_beating(barrier_store):
    """Node ranks 0 and 1 (infra ranks 1 and 0) train, infra rank 2 stands by. Each active node watches
    the next one, wrapping: infra 1 watches infra 0. Without the watch, only the survivors' own workers
    failing open the next round (after the in-process restart's wait for the lost ranks' heartbeats)."""
    store, prefix = barrier_store
    gone = launcher_liveness.LAUNCHER_GONE_S + 1.0
    watch = launcher_liveness.LostPeerWatch(store, run_id="job", infra_rank=1, active_nodes=2)
    _beat(store, prefix, 0, 0.1)
    assert watch.check() is None  # alive
    assert not store.check([f"{prefix}:round_done_1"])
    _beat(store, prefix, 0, gone)
    opened, lost, age = watch.check()
    assert (opened, lost) == (1, 0)
    assert age >= gone
    assert store.get(f"{prefix}:round_done_1") == b"0"  # what every launcher polls for
    assert watch.check() is None  # the round is open: nothing more to do


def test_a_launcher_judges_its_peers_only_after_its_own_beats_went_out_on_time():
    """A store that stalls delays every beat: once it answers again, the peers' beats look old to a
    launcher whose own were just as late, and it would have restarted the job for nothing."""
    every, gone = 0.5, 2.0
    steady = launcher_liveness.SteadyBeats(every_s=every, gone_s=gone)
    assert [steady.wrote(t * every) for t in range(5)] == [False, False, False, False, True]
    assert steady.wrote(2.0 + 3.0) is False  # 3 s without a beat: the store (or this launcher) stalled
    assert [steady.wrote(5.0 + t * every) for t in range(1, 5)] == [False, False, False, True]  # 2 s on time
    steady.broke()  # a beat that could not be written
    assert steady.wrote(7.5) is False


@pytest.mark.parametrize(
    ("watcher", "watched_age"),
    [
        (2, "gone"),  # the spare watches no one
        (1, None),  # the watched launcher never beat (an older launcher): wait as NVRx does
        (1, "done"),  # the watched node finished training before this one
    ],
)
def test_a_launcher_opens_no_round_for_a_node_that_is_not_lost(barrier_store, watcher, watched_age):
    store, prefix = barrier_store
    if watched_age == "done":
        store.set(launcher_liveness.launcher_beat_key(prefix, 0), launcher_liveness.LAUNCHER_DONE)
    else:
        _beat(store, prefix, 0, None if watched_age is None else launcher_liveness.LAUNCHER_GONE_S + 1.0)
    _beat(store, prefix, 1, launcher_liveness.LAUNCHER_GONE_S + 1.0)  # node rank 0, watched by node rank 1
    watch = launcher_liveness.LostPeerWatch(store, run_id="job", infra_rank=watcher, active_nodes=2)
    assert watch.check() is None
    assert not store.check([f"{prefix}:round_done_1"])
