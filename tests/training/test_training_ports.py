"""The standalone trainer (no launcher, no MASTER_PORT) binds a free port and says which."""

from __future__ import annotations

import contextlib
import socket

import torch

from training import parallel


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
