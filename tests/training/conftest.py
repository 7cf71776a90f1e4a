"""Fixtures the tests of NVRx's barrier rendezvous share (nvrx_compat and the launcher beat)."""

from __future__ import annotations

import pytest


@pytest.fixture
def barrier_store():
    """A real TCPStore holding round 0 of a two-node barrier rendezvous, closed with infra ranks 0 and 1
    active and 2 standing by, written with NVRx's own formats."""
    from datetime import timedelta  # noqa: PLC0415

    from nvidia_resiliency_ext.fault_tolerance import ft_rendezvous_barrier as barrier  # noqa: PLC0415
    from torch.distributed import TCPStore  # noqa: PLC0415

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    state = barrier._RendezvousBarrierState(store=store, run_id="job")
    for slot, (infra, rank) in enumerate([(1, 0), (0, 1), (2, 2)], start=1):
        node = barrier._NodeDesc(addr=f"job-{infra}", pid=100 + infra, local_id=0)
        store.set(f"{state.prefix}:slot_{slot}", state._pack_participant_value(node, infra, "none", 0))
        store.set(f"{state.prefix}:slot_{slot}_rank", state._pack_rank_value(rank, 3, 0))
    store.set(f"{state.prefix}:round_done_0", b"1")
    return store, state.prefix
