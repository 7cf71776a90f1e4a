"""Shrink and grow back, the decisions alone: when the control process grows a shrunk job back, and what
the ranks' durable reports tell it (over a real TCPStore). The whole path runs in
tests/localrun/test_localrun_shrink.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from nvrx_eks.training.resilience import launcher_liveness as liveness
from nvrx_eks.training.resilience.shrink import ShrinkConfig

POLICY = ShrinkConfig(nodes=4, node_counts=[3, 2], after_s=5, grow_wait_s=30)


@pytest.fixture
def store() -> TCPStore:
    return TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=5))


def test_the_newest_durable_step_everywhere_is_the_least_over_the_shrunk_worlds_ranks(store) -> None:
    assert liveness.durable_everywhere(store, "p") is None
    for rank, step in enumerate([40, 30, 40, 50]):
        store.set(liveness.durable_key("p", rank), f"4:{step}")
    assert liveness.durable_everywhere(store, "p") == 30
    # A rank of another world (an earlier generation's report) is no report of this one.
    store.set(liveness.durable_key("p", 3), "8:60")
    assert liveness.durable_everywhere(store, "p") is None


def test_a_durable_report_writes_each_durable_commit_of_its_rank(store) -> None:
    report = liveness.DurableReport(f"127.0.0.1:{store.port}", run_id="job", rank=1, world_size=2)
    report({"kind": "checkpoint_committed", "tier": "local", "step": 7})
    report({"kind": "checkpoint_committed", "tier": "durable", "step": 10})
    prefix = liveness.barrier_state(store, run_id="job").prefix
    assert store.get(liveness.durable_key(prefix, 1)) == b"2:10"
    assert not store.check([liveness.durable_key(prefix, 0)])


class _Round:
    """The rendezvous as GrowBack reads it: the round trained in, its size, live launchers, durable."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, size: int | None, live: int) -> None:
        self.size, self.live, self.durable, self.opened = size, live, None, []
        monkeypatch.setattr(
            liveness, "barrier_state", lambda store, run_id: type("S", (), {"store": None, "prefix": "p"})()
        )
        monkeypatch.setattr(liveness, "training_round", lambda state: 3)
        monkeypatch.setattr(liveness, "round_size", lambda state, round_id: self.size)
        monkeypatch.setattr(
            liveness, "live_launchers", lambda store, prefix, max_nodes: set(range(self.live))
        )
        monkeypatch.setattr(liveness, "durable_everywhere", lambda store, prefix: self.durable)
        monkeypatch.setattr(
            liveness, "open_round_after", lambda state, round_id: self.opened.append(round_id) or round_id + 1
        )


def test_a_shrunk_job_grows_back_right_after_its_next_durable_step(monkeypatch) -> None:
    rdzv = _Round(monkeypatch, size=2, live=2)
    grow = liveness.GrowBack(None, run_id="job", policy=POLICY, max_nodes=4)
    assert grow.check(now=0.0) is None  # nobody new: trains on shrunk
    rdzv.live, rdzv.durable = 4, 30  # the replacements beat; step 30 was already durable
    assert grow.check(now=1.0) is None  # waits for a newer durable step
    assert grow.check(now=20.0) is None
    rdzv.durable = 40
    assert grow.check(now=21.0) == (4, 2, 4, "after durable step 40")
    assert rdzv.opened == [3]


def test_a_shrunk_job_without_a_new_durable_step_grows_back_when_the_wait_is_over(monkeypatch) -> None:
    rdzv = _Round(monkeypatch, size=2, live=3)  # one node back: 3 of 4 fill the size 3
    grow = liveness.GrowBack(None, run_id="job", policy=POLICY, max_nodes=4)
    assert grow.check(now=0.0) is None
    assert grow.check(now=29.0) is None
    assert grow.check(now=30.0) == (4, 2, 3, "no new durable step within 30 s")
    assert rdzv.opened == [3]


def test_a_job_at_full_size_or_without_more_nodes_never_grows(monkeypatch) -> None:
    rdzv = _Round(monkeypatch, size=None, live=4)  # the round closed at the full size
    grow = liveness.GrowBack(None, run_id="job", policy=POLICY, max_nodes=4)
    assert grow.check(now=0.0) is None
    rdzv.size, rdzv.live, rdzv.durable = 3, 3, 50  # shrunk to 3 and only 3 launchers
    assert grow.check(now=100.0) is None
    assert rdzv.opened == []
