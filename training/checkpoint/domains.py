"""Failure domains of the peer replica's nodes: what a domain is, and the file that carries it.

A node's domain is hierarchical, coarsest first: its zone, then the EC2 network nodes above it, layer 1
(the broadest) down to the one the instance attaches to (3 layers, or 4 on some instance types:
https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/how-ec2-instance-topology-works.html). A network
node's failure cuts off every instance below it, so nodes that share one are less apart than their
zone alone says. EKS labels every supported node with them, `topology.k8s.aws/network-node-layer-N`
(https://docs.aws.amazon.com/eks/latest/userguide/ml-workload-topology.html).

Both ends of the file are here: the trainer pod's topology init container (training/node/topology.py)
writes the node's labels with `write_labels`, and each rank takes its domain with `node_domain`; the
replica's ring (replica.py `node_ring`) splits the gathered domains into their `levels`. Standard library
only: the init container imports it without torch.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

ZONE_LABEL = "topology.kubernetes.io/zone"
NETWORK_NODE_LABELS = tuple(f"topology.k8s.aws/network-node-layer-{layer}" for layer in (1, 2, 3, 4))
"""EKS's network-node labels, broadest first; layer 4 only on the instance types with four layers."""
DOMAIN_LABELS = (ZONE_LABEL, *NETWORK_NODE_LABELS)
"""The labels of a node's failure domain, coarsest first: its zone (EC2's network layers lie within one
zone), then the network nodes above it, down to the one it attaches to."""
LEVEL_SEPARATOR = "/"
"""Joins a domain's levels (`domain`); no label value holds it (alphanumerics, `-`, `_`, `.`)."""

FAILURE_DOMAIN_ENV = "NVRX_EKS_FAILURE_DOMAIN"
"""The pod's zone from the downward API (the job chart sets it): the fallback when the file has no
labels. Unset or empty: one domain for every node."""
TOPOLOGY_FILE_ENV = "NVRX_EKS_TOPOLOGY_FILE"
"""The file the topology init container writes and the trainer reads (the job chart sets both ends)."""


def domain(labels: Mapping[str, str]) -> str:
    """A node's failure domain: the values of DOMAIN_LABELS coarsest first, joined by LEVEL_SEPARATOR,
    a missing one empty and trailing empty ones dropped (`use1-az4/nn-1/nn-2/nn-3`; no label: "")."""
    return LEVEL_SEPARATOR.join(labels.get(key, "") for key in DOMAIN_LABELS).rstrip(LEVEL_SEPARATOR)


def levels(node_domain: str) -> list[str]:
    """A domain's levels, coarsest first (a zone alone is one level; "" none)."""
    return node_domain.split(LEVEL_SEPARATOR) if node_domain else []


def write_labels(path: Path, *, node: str, labels: Mapping[str, str], error: str = "") -> None:
    """The init container's file: the node, its DOMAIN_LABELS, and why they are missing if they are.
    Replaced in one step, so the trainer never reads half of it."""
    record: dict[str, Any] = {"node": node, "labels": {k: labels[k] for k in DOMAIN_LABELS if labels.get(k)}}
    if error:
        record["error"] = error
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.tmp")
    partial.write_text(json.dumps(record, sort_keys=True) + "\n")
    partial.replace(path)


@dataclass(frozen=True)
class NodeDomain:
    """This node's failure domain as the trainer takes it, and where it came from."""

    domain: str
    source: str
    """"node labels" (the init container's file), "zone label" (the downward API) or "none"."""
    node: str = ""
    error: str = ""
    """Why the node's labels were not used (empty when they were, or when no file was asked for)."""


def node_domain(env: Mapping[str, str] | None = None) -> NodeDomain:
    """This node's domain: the labels in the init container's file (TOPOLOGY_FILE_ENV), the zone
    completed from FAILURE_DOMAIN_ENV where the file lacks it; without labels there, the zone alone;
    without a zone, "" (every node in one domain)."""
    env = os.environ if env is None else env
    zone = env.get(FAILURE_DOMAIN_ENV, "")
    path = env.get(TOPOLOGY_FILE_ENV, "")
    found: dict[str, Any] = {}
    if path:
        try:
            found = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            found = {"error": f"{path} unreadable ({type(exc).__name__}: {exc})"}
    raw = found.get("labels")
    labels = {
        k: str(v) for k, v in (raw if isinstance(raw, dict) else {}).items() if k in DOMAIN_LABELS and v
    }
    node = str(found.get("node", ""))
    if labels:
        if zone:
            labels.setdefault(ZONE_LABEL, zone)
        return NodeDomain(domain(labels), "node labels", node=node)
    error = str(found.get("error") or (f"{path}: no topology label" if path else ""))
    return NodeDomain(zone, "zone label" if zone else "none", node=node, error=error)
