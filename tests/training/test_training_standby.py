"""Warm spares standing by outside NVRx 0.4.1's rendezvous (training/rendezvous.py `Standby`).

Real parts: a TCPStore, torch's c10d rendezvous backend on it, and NVRx 0.4.1's own rendezvous state
objects, written as its agents write them. What a standby must do: take a place that is free for good
(a posted vacancy, a participant silent beyond the keep-alive), never one a restart round frees for a
moment, and one standby per vacancy.
"""

from __future__ import annotations

import pickle
import threading
import time
from datetime import datetime, timedelta

import pytest
from nvidia_resiliency_ext.fault_tolerance._ft_rendezvous import _NodeDesc, _RendezvousState
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

from training import rendezvous
from training.rendezvous import STALE, Standby, evict

RUN = "job"


@pytest.fixture
def store() -> TCPStore:
    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))


@pytest.fixture(autouse=True)
def _short_graces(monkeypatch):
    monkeypatch.setattr(rendezvous, "ROOM_GRACE_S", 0.6)
    monkeypatch.setattr(rendezvous, "OWN_VACANCY_GRACE_S", 0.4)


def _node(addr: str, pid: int = 1) -> _NodeDesc:
    return _NodeDesc(addr=addr, pid=pid, local_id=0)


def _write(store: TCPStore, *, round_: int, complete: bool, participants=(), waiting=(), ages=None) -> None:
    """The state as NVRx's agents leave it: members with their last keep-alive `ages` seconds ago."""
    backend = C10dRendezvousBackend(store, RUN)
    state = _RendezvousState()
    state.round, state.complete = round_, complete
    now = datetime.utcnow()  # noqa: DTZ003 - NVRx keeps naive UTC
    ages = ages or {}
    for rank, addr in enumerate(participants):
        state.participants[_node(addr)] = rank
        state.last_heartbeats[_node(addr)] = now - timedelta(seconds=ages.get(addr, 0.5))
    for addr in waiting:
        state.wait_list.add(_node(addr))
        state.last_heartbeats[_node(addr)] = now - timedelta(seconds=ages.get(addr, 0.5))
    current = backend.get_state()
    backend.set_state(pickle.dumps(state), current[1] if current else None)


def _standby(store: TCPStore, addr: str, *, index: int, active: int = 2) -> Standby:
    return Standby(
        store=store,
        backend=C10dRendezvousBackend(store, RUN),
        run_id=RUN,
        node_addr=addr,
        active_nodes=active,
        index=index,
    )


def _endpoint(store: TCPStore) -> str:
    return f"127.0.0.1:{store.port}"


def test_an_active_index_joins_while_the_first_round_forms_and_a_spare_index_waits(store):
    assert "first round" in _standby(store, "a", index=0).wait(deadline_s=1)  # no state yet
    _write(store, round_=0, complete=False, participants=["a"])
    assert "first round" in _standby(store, "b", index=1).wait(deadline_s=1)
    _write(store, round_=0, complete=True, participants=["a", "b"])
    with pytest.raises(TimeoutError):
        _standby(store, "spare", index=2).wait(deadline_s=1.5)


def test_a_restart_round_that_empties_for_a_moment_takes_no_spare(store):
    """A SIGKILL's restart: every agent leaves its round and joins the next within a second."""
    _write(store, round_=1, complete=True, participants=["a", "b"])
    spare = _standby(store, "spare", index=2)
    outcome: list[object] = []
    waiter = threading.Thread(target=lambda: outcome.append(_safe_wait(spare, 2.5)))
    waiter.start()
    time.sleep(0.3)
    _write(store, round_=2, complete=False, participants=[])  # both left (the room lasts < the grace)
    time.sleep(0.3)
    _write(store, round_=2, complete=False, participants=["a"], waiting=[])
    _write(store, round_=2, complete=True, participants=["a", "b"])
    waiter.join(timeout=10)
    assert outcome == ["timeout"], outcome


def test_an_evicted_predecessor_is_a_vacancy_one_spare_takes_before_the_replacement(store):
    _write(store, round_=3, complete=True, participants=["a", "b"])
    assert evict(endpoint=_endpoint(store), run_id=RUN, node_addr="b") == 1  # b's replacement pod
    assert evict(endpoint=_endpoint(store), run_id=RUN, node_addr="b") == 0  # its launcher: no repeat
    spares = [_standby(store, f"spare-{i}", index=2 + i) for i in range(2)]
    outcomes: list[object] = []
    threads = [threading.Thread(target=lambda s=s: outcomes.append(_safe_wait(s, 1.5))) for s in spares]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert sorted(map(str, outcomes)) == ["timeout", "took the place of b (vacancy 1)"], outcomes
    # The replacement itself stands by: its predecessor's place is taken.
    assert _safe_wait(_standby(store, "b", index=1), 1.0) == "timeout"


def test_the_replacement_takes_its_predecessors_place_itself_when_no_spare_does(store):
    _write(store, round_=3, complete=True, participants=["a", "b"])
    evict(endpoint=_endpoint(store), run_id=RUN, node_addr="b")
    started = time.monotonic()
    assert _standby(store, "b", index=1).wait(deadline_s=5) == "took the place of b (vacancy 1)"
    assert time.monotonic() - started >= rendezvous.OWN_VACANCY_GRACE_S - 0.05  # a spare went first


def test_a_participant_silent_beyond_the_keep_alive_is_evicted_and_its_place_taken(store):
    """A node lost with no replacement yet (on a cluster: minutes): its keep-alive goes silent."""
    silent = rendezvous.SILENT_AFTER.total_seconds() + 1
    _write(store, round_=4, complete=True, participants=["a", "b"], ages={"b": silent})
    assert _standby(store, "spare", index=2).wait(deadline_s=3) == "took the place of b (vacancy 1)"
    state = pickle.loads(C10dRendezvousBackend(store, RUN).get_state()[0])  # noqa: S301
    assert state.last_heartbeats[_node("b")] == STALE  # the agents' next sync drops it
    assert state.last_heartbeats[_node("a")] != STALE


def test_room_that_lasts_with_no_vacancy_takes_a_spare(store):
    """The fallback: an active pod that never joined (no predecessor, nothing to evict)."""
    _write(store, round_=0, complete=False, participants=["a"])
    started = time.monotonic()
    reason = _standby(store, "spare", index=2).wait(deadline_s=5)
    assert reason == "1 live nodes of 2 for 0.6 s"
    assert time.monotonic() - started >= rendezvous.ROOM_GRACE_S - 0.05


def _safe_wait(standby: Standby, deadline_s: float) -> str:
    try:
        return standby.wait(deadline_s=deadline_s, poll_s=0.05)
    except TimeoutError:
        return "timeout"
