"""`python -m nvrx_eks.training.node.topology`, the trainer pod's topology init container, against a real
loopback API server (HTTPS with its own CA, a bearer token: localrun/node_api.py), and the partners its
labels give.

Each test also reads the domain back as the trainer does (`node_domain`), so the file's two ends are
tested together; a failure never fails the container, and the trainer falls back to the zone.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest

from nvrx_eks.localrun.node_api import LocalApiServer
from nvrx_eks.training.checkpoint.domains import (
    FAILURE_DOMAIN_ENV,
    TOPOLOGY_FILE_ENV,
    NodeDomain,
    levels,
    node_domain,
)
from nvrx_eks.training.checkpoint.replica import partner_ranks, source_ranks
from nvrx_eks.training.node import topology
from nvrx_eks.training.node.kubeapi import ApiError

if TYPE_CHECKING:
    from pathlib import Path

ZONE = "use1-az4"
# One zone, one layer-1 and one layer-2 network node, and the node under one of two layer-3 nodes: a
# p5 job's 8 nodes as EKS labels them, the first four (by rank) under one switch.
LAYER_1, LAYER_2 = "nn-e50490a237cb0f01a", "nn-9a8b7c6d5e4f3a2b1"
LAYER_3 = ("nn-0123456789abcdef0", "nn-0fedcba9876543210")


def _labels(node: int, nodes: int = 8) -> dict[str, str]:
    return {
        "topology.kubernetes.io/zone": ZONE,
        "topology.kubernetes.io/region": "us-east-1",  # not a failure domain label: not kept
        "topology.k8s.aws/network-node-layer-1": LAYER_1,
        "topology.k8s.aws/network-node-layer-2": LAYER_2,
        "topology.k8s.aws/network-node-layer-3": LAYER_3[2 * node // nodes],
        "node.kubernetes.io/instance-type": "p5.48xlarge",
    }


@pytest.fixture
def api(tmp_path):
    server = LocalApiServer(tmp_path / "api")
    server.start()
    yield server
    server.close()


def _token_dir(tmp_path: Path, api: LocalApiServer, *, token: str | None = None) -> Path:
    """The projected volume as the kubelet writes it: the pod's token and the cluster's CA."""
    folder = tmp_path / "token"
    folder.mkdir(exist_ok=True)
    (folder / "token").write_text(token if token is not None else api.token)
    (folder / "ca.crt").write_bytes(api.ca_pem)
    return folder


def _in_pod(api: LocalApiServer, node: str, **extra: str) -> dict[str, str]:
    return {
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(api.port),
        "NODE_NAME": node,
        **extra,
    }


def _run(out: Path, token_dir: Path, env: dict[str, str], **kwargs: Any) -> int:
    return topology.main([f"--out={out}", f"--token-dir={token_dir}"], env=env, **kwargs)


def test_the_init_container_writes_its_nodes_labels_and_the_trainer_takes_them_as_its_domain(tmp_path, api):
    api.nodes["ip-10-1-2-3.ec2.internal"] = _labels(5)
    out = tmp_path / "topology" / "node.json"
    env = _in_pod(api, "ip-10-1-2-3.ec2.internal")
    assert _run(out, _token_dir(tmp_path, api), env) == 0
    written = json.loads(out.read_text())
    assert written == {
        "node": "ip-10-1-2-3.ec2.internal",
        "labels": {
            "topology.kubernetes.io/zone": ZONE,
            "topology.k8s.aws/network-node-layer-1": LAYER_1,
            "topology.k8s.aws/network-node-layer-2": LAYER_2,
            "topology.k8s.aws/network-node-layer-3": LAYER_3[1],
        },
    }
    assert api.requests == ["ip-10-1-2-3.ec2.internal"]
    domain = node_domain({TOPOLOGY_FILE_ENV: str(out), FAILURE_DOMAIN_ENV: ZONE})
    assert domain == NodeDomain(
        f"{ZONE}/{LAYER_1}/{LAYER_2}/{LAYER_3[1]}", "node labels", node="ip-10-1-2-3.ec2.internal"
    )
    assert levels(domain.domain) == [ZONE, LAYER_1, LAYER_2, LAYER_3[1]]
    assert not list(out.parent.glob(".*.tmp"))


def test_within_one_zone_the_labels_give_every_node_a_partner_under_another_switch(tmp_path, api):
    """The module and the ring end to end: eight nodes of one zone, four (by rank) under each layer-3
    network node. The zone alone (what the trainer had before) makes them one domain, and every node's
    partner would be the next one in rank order, under the same switch for six of the eight."""
    names = [f"ip-10-1-0-{n}.ec2.internal" for n in range(8)]
    domains = []
    for node, name in enumerate(names):
        api.nodes[name] = _labels(node)
        out = tmp_path / name / "node.json"
        assert _run(out, _token_dir(tmp_path, api), _in_pod(api, name)) == 0
        domains.append(node_domain({TOPOLOGY_FILE_ENV: str(out), FAILURE_DOMAIN_ENV: ZONE}).domain)
    assert all(d.startswith(f"{ZONE}/") for d in domains)
    layout = {"world_size": 16, "ranks_per_node": 2, "replicas": 1, "domains": domains}
    held = dict.fromkeys(range(16), 0)
    for rank in range(16):
        (partner,) = partner_ranks(rank, **layout)
        assert levels(domains[partner // 2])[-1] != levels(domains[rank // 2])[-1], (rank, partner)
        assert partner % 2 == rank % 2
        assert rank in source_ranks(partner, **layout)
        held[partner] += 1
    assert set(held.values()) == {1}
    # What the zone alone gives: the next node in rank order, mostly under the same switch.
    zone_only = {**layout, "domains": [ZONE] * 8}
    same_switch = sum(partner_ranks(2 * n, **zone_only)[0] // 2 // 4 == n // 4 for n in range(8))
    assert same_switch == 6


def _failed(out: Path, caplog: pytest.LogCaptureFixture, env: dict[str, str]) -> tuple[str, NodeDomain]:
    """The file's error, the domain the trainer then takes (its zone from the downward API), and the
    warning the container logged."""
    error = json.loads(out.read_text())["error"]
    assert any(r.levelno == logging.WARNING and "fall back" in r.getMessage() for r in caplog.records)
    return error, node_domain({**env, TOPOLOGY_FILE_ENV: str(out)})


def test_a_refused_token_or_an_unknown_node_falls_back_to_the_zone(tmp_path, api, caplog):
    api.nodes["node-a"] = _labels(0)
    sleeps: list[float] = []
    for case, node, token, code in [("bad-token", "node-a", "stolen", 401), ("missing", "node-b", None, 404)]:
        out = tmp_path / case / "node.json"
        env = _in_pod(api, node, **{FAILURE_DOMAIN_ENV: ZONE})
        assert _run(out, _token_dir(tmp_path, api, token=token), env, sleep=sleeps.append) == 0
        error, domain = _failed(out, caplog, env)
        assert error.startswith(f"ApiError: HTTP {code}"), error
        assert domain == NodeDomain(ZONE, "zone label", node=node, error=error)
    assert sleeps == []  # an answer that would not change is not asked again
    assert api.requests == []


class _Refusing:
    """An API server that answers every read with `status`."""

    def __init__(self, status: int) -> None:
        self.status, self.calls = status, 0

    def get_node(self, name: str) -> dict[str, Any]:
        self.calls += 1
        raise ApiError(self.status, f"nodes {name!r} is forbidden")


def test_no_permission_says_which_grant_is_missing_and_a_busy_api_is_asked_again(tmp_path, caplog):
    forbidden = _Refusing(403)
    out = tmp_path / "forbidden.json"
    env = {"NODE_NAME": "node-a"}
    assert _run(out, tmp_path, env, api=forbidden) == 0
    error, domain = _failed(out, caplog, env)
    assert "`get` on nodes" in error
    assert forbidden.calls == 1
    assert domain == NodeDomain("", "none", node="node-a", error=error)  # no zone either: one domain
    busy, sleeps = _Refusing(503), []
    assert _run(tmp_path / "busy.json", tmp_path, env, api=busy, sleep=sleeps.append) == 0
    assert busy.calls == topology.ATTEMPTS
    assert sleeps == [1.0, 2.0]


def test_no_api_address_or_no_answer_falls_back_to_the_zone(tmp_path, api, caplog, reserve_port):
    outside = {"NODE_NAME": "node-a", FAILURE_DOMAIN_ENV: ZONE}
    assert _run(tmp_path / "outside.json", _token_dir(tmp_path, api), outside) == 0
    error, domain = _failed(tmp_path / "outside.json", caplog, outside)
    assert "KUBERNETES_SERVICE_HOST is unset" in error
    assert domain.domain == ZONE
    # Nothing listens there: refused at once, asked ATTEMPTS times.
    closed = {
        **outside,
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(reserve_port()),
    }
    sleeps: list[float] = []
    out = tmp_path / "closed.json"
    assert _run(out, _token_dir(tmp_path, api), closed, sleep=sleeps.append) == 0
    error, domain = _failed(out, caplog, closed)
    assert "Connection refused" in error, error
    assert len(sleeps) == topology.ATTEMPTS - 1
    assert domain == NodeDomain(ZONE, "zone label", node="node-a", error=error)


def test_a_node_without_topology_labels_and_a_missing_file_are_the_zone(tmp_path, api, caplog):
    api.nodes["plain"] = {"kubernetes.io/hostname": "plain"}
    out = tmp_path / "node.json"
    env = _in_pod(api, "plain", **{FAILURE_DOMAIN_ENV: ZONE})
    assert _run(out, _token_dir(tmp_path, api), env) == 0
    error, domain = _failed(out, caplog, env)
    assert "has none of the labels" in error
    assert domain.source == "zone label"
    # The file never written (its init container did not run): the zone, and why.
    gone = node_domain({TOPOLOGY_FILE_ENV: str(tmp_path / "absent.json"), FAILURE_DOMAIN_ENV: ZONE})
    assert (gone.domain, gone.source) == (ZONE, "zone label")
    assert "absent.json unreadable" in gone.error
    # No file asked for and no zone (a cluster without PodTopologyLabels): one domain, nothing to say.
    assert node_domain({}) == NodeDomain("", "none")


def test_the_module_path_the_manifest_runs_writes_the_file_and_logs_the_domain(tmp_path, api):
    api.nodes["node-a"] = _labels(0)
    out = tmp_path / "node.json"
    env = {**os.environ, **_in_pod(api, "node-a")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "nvrx_eks.training.node.topology",
            f"--out={out}",
            f"--token-dir={_token_dir(tmp_path, api)}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert f"failure domain {ZONE}/{LAYER_1}/{LAYER_2}/{LAYER_3[0]}" in done.stderr
    assert json.loads(out.read_text())["labels"]["topology.k8s.aws/network-node-layer-3"] == LAYER_3[0]
