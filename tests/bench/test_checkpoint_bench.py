"""`nvrx-eks bench checkpoint`'s replicated row: two one-rank "nodes", the peer replica on."""

from __future__ import annotations

import pytest

from nvrx_eks.bench.checkpoint.bench import make_state, run_replicated_loop
from nvrx_eks.training.checkpoint.floor import state_bytes


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_every_snapshot_of_the_replicated_row_reaches_the_partner(tmp_path):
    nbytes = 8 << 20
    row = run_replicated_loop(
        root=tmp_path / "shm",
        disk=tmp_path / "disk",
        state_bytes=nbytes,
        kind="device",
        step_s=0.2,
        every=4,
        durable_every=8,
        checkpoints=4,
    )
    # Each snapshot went to the partner (the copy takes milliseconds against a 0.8 s interval), its
    # bytes are the whole flattened state, and the replica cost the loop nothing measurable.
    assert row.persisted.get("peer", 0) >= 3, row
    assert row.skipped.get("peer", 0) == 0, row
    assert row.peer_bytes == state_bytes(make_state(nbytes)), row
    assert row.peer_s is not None
    assert row.peer_s < row.interval_s, row
    assert 0.9 < row.efficiency <= 1.0, row
