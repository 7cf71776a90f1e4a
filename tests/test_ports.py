"""kitcore/ports.py: a held port is taken for every other socket and free for its own server."""

from __future__ import annotations

import errno
import http.server
import os
import socket
from datetime import timedelta

import pytest

from nvrx_eks.kitcore.ports import ReservedPort


def _plain_bind(port: int) -> None:
    """Bind as any other socket would that does not share ports: raises EADDRINUSE on a taken port."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", port))


def test_a_held_port_refuses_every_other_socket_and_takes_its_server_with_address_reuse():
    with ReservedPort() as held:
        with pytest.raises(OSError) as refused:
            _plain_bind(held.port)
        assert refused.value.errno == errno.EADDRINUSE
        server = http.server.HTTPServer(("127.0.0.1", held.port), http.server.BaseHTTPRequestHandler)
        server.server_close()
    _plain_bind(held.port)  # released: free again


def test_a_held_port_is_not_held_twice():
    """A second hold binds without address reuse first, so it never shares a port another hold has."""
    with ReservedPort() as first:
        with pytest.raises(OSError, match="in use"):
            _plain_bind(first.port)
        seconds = [ReservedPort() for _ in range(50)]
        try:
            assert first.port not in {second.port for second in seconds}
        finally:
            for second in seconds:
                second.release()


def test_a_run_of_ports_is_consecutive_and_each_one_is_held():
    with ReservedPort(count=3) as held:
        for port in range(held.port, held.port + 3):
            with pytest.raises(OSError, match="in use"):
                _plain_bind(port)


def test_torchs_store_binds_a_held_port():
    import torch.distributed as dist  # noqa: PLC0415

    with ReservedPort() as held:
        store = dist.TCPStore(
            "127.0.0.1", held.port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
        )
        store.set("k", "v")
        client = dist.TCPStore("127.0.0.1", held.port, is_master=False, timeout=timedelta(seconds=10))
        assert client.get("k") == b"v"


def test_a_process_forked_from_the_holder_does_not_keep_the_port():
    held = ReservedPort()
    started_r, started_w = os.pipe()
    end_r, end_w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child: fork's hooks have run when os.fork returns here
        os.write(started_w, b"x")
        os.read(end_r, 1)  # lives until the parent has released and bound the port
        os._exit(0)
    try:
        assert os.read(started_r, 1) == b"x"
        held.release()
        _plain_bind(held.port)  # the fork's copy was closed at the fork
    finally:
        os.write(end_w, b"x")
        os.waitpid(child, 0)
        for end in (started_r, started_w, end_r, end_w):
            os.close(end)


def test_rank_0_holds_the_in_process_stores_port_until_the_layer_closes(tmp_path):
    """The in-process store's port, chosen by rank 0, is held from the moment it is chosen: a port only
    found free was taken, now and then, by another socket before NVRx's store bound it."""
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    from nvrx_eks.training import parallel  # noqa: PLC0415

    store = dist.FileStore(str(tmp_path / "store"), 1)
    world = parallel.World(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    port, held = parallel.shared_free_port(store, world, key="port")
    assert held is not None
    assert held.port == port
    with pytest.raises(OSError, match="in use"):
        _plain_bind(port)
    held.release()
    _plain_bind(port)
