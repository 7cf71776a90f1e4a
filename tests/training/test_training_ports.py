"""Store ports: the standalone trainer (no launcher, no MASTER_PORT) binds a free port and says which;
a store client whose host is not listening yet connects once it is."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from nvrx_eks.training import parallel


def test_standalone_store_binds_a_free_port_when_29500_is_taken(monkeypatch, capsys):
    monkeypatch.delenv("MASTER_PORT", raising=False)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    with socket.socket() as busy:
        with contextlib.suppress(OSError):  # already taken by someone else: the same situation
            busy.bind(("", 29500))
            busy.listen()
        world = parallel.World(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
        store = parallel.base_store(world, timeout_s=5)
    store.set("k", "v")
    assert store.get("k") == b"v"
    port = store.port
    assert port != 29500
    assert f"127.0.0.1:{port}" in capsys.readouterr().out


def _host_after(port: int, delay_s: float, started: list[float]) -> threading.Thread:
    def host() -> None:
        time.sleep(delay_s)
        started.append(time.monotonic())
        store = dist.TCPStore(
            "127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
        )
        store.set("from-host", "1")
        hosts.append(store)

    hosts: list[dist.TCPStore] = []
    thread = threading.Thread(target=host, daemon=True)
    thread.hosts = hosts  # type: ignore[attr-defined] - kept alive until the test ends
    thread.start()
    return thread


def test_waiting_for_a_store_host_returns_once_it_listens_and_not_before(reserve_port):
    port, started = reserve_port(), []
    host = _host_after(port, 0.3, started)
    parallel.wait_until_listening("127.0.0.1", port, timeout_s=10)
    returned = time.monotonic()
    host.join(timeout=10)
    assert started, "the host never started"
    assert returned >= started[0]
    # The probe's connection, closed unused, leaves the store working for the real client.
    client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
    assert client.get("from-host") == b"1"


def test_waiting_for_a_store_host_that_never_comes_ends_in_a_timeout(reserve_port):
    with pytest.raises(TimeoutError, match=r"nothing listens on 127\.0\.0\.1"):
        parallel.wait_until_listening("127.0.0.1", reserve_port(), timeout_s=0.3)


@pytest.mark.parametrize("rank", ["0", "1"])
def test_the_in_process_store_waits_for_its_host_only_on_client_ranks(monkeypatch, rank, reserve_port):
    # Every rank's in-process store is built at once after a restart; a client that tried to connect
    # before rank 0 listened waited out torch's reconnect backoff (0.3-0.8 s here), so a client first
    # waits until the host listens. The host rank binds at once, as NVRx's store does.
    from nvrx_eks.training.resilience import nvrx_compat  # noqa: PLC0415

    port, started = reserve_port(), []
    waited: list[tuple[str, int]] = []
    real_wait = parallel.wait_until_listening

    def recording_wait(host: str, port: int, timeout_s: float) -> None:
        waited.append((host, port))
        real_wait(host, port, timeout_s)

    monkeypatch.setattr(parallel, "wait_until_listening", recording_wait)
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    store_type = nvrx_compat.host_first_store()
    if rank == "0":
        store = store_type(port=port, wait_for_workers=False, timeout=timedelta(seconds=10))
        assert waited == []
        assert store.port == port  # it hosts
        return
    host = _host_after(port, 0.3, started)
    store = store_type(port=port, timeout=timedelta(seconds=10))
    host.join(timeout=10)
    assert waited == [("127.0.0.1", port)]
    assert store.get("from-host") == b"1"
