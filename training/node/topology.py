"""`python -m nvrx_eks.training.node.topology`: this node's zone and network nodes, for the peer replica's
partners.

The peer replica chooses partners in other failure domains: the zone, and inside a zone the EC2
network nodes above each node (training/checkpoint/domains.py). Kubernetes copies only a node's zone
and region labels onto its pods (the PodTopologyLabels admission plugin), so the downward API gives the
zone and not EKS's `topology.k8s.aws/network-node-layer-N` labels, and a p5 job, in one zone for EFA,
differs only there. The job chart (k8s/job_chart.py `topology_init`) runs this module as an init
container of each trainer pod: it reads its own Node (`GET /api/v1/nodes/$NODE_NAME`, the name from
the downward API's spec.nodeName) with a service account token projected into this container alone, and
writes the labels it found to a small file on an emptyDir the trainer mounts read-only.

It never fails the pod: without an answer (no API address, no token, no permission, a timeout) it
says why in its log line and in the file, and exits 0; the trainer then falls back to the zone the
downward API gave, else to one domain for every node, and says so in its `checkpoint_peer_domain`
event.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from nvrx_eks.kitcore.configio import UserError, exit_with
from nvrx_eks.training.checkpoint.domains import DOMAIN_LABELS, domain, write_labels
from nvrx_eks.training.node.kubeapi import SA_DIR, ApiError, InClusterApi

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

log = logging.getLogger("topology")

NODE_NAME_ENV = "NODE_NAME"

ATTEMPTS = 3
"""Reads of the Node before giving up: an API server briefly unavailable answers a second call."""
TIMEOUT_S = 5.0
"""Per read: the pod's start waits at most about ATTEMPTS x this (plus 3 s between attempts)."""
_FINAL = frozenset({401, 403, 404})
"""Answers a second call would get again (no token, no permission, no such node)."""


class NodeReader(Protocol):
    def get_node(self, name: str) -> dict[str, Any]: ...


def read_labels(api: NodeReader, node: str, *, sleep: Callable[[float], None] = time.sleep) -> dict[str, str]:
    """The node's DOMAIN_LABELS that it has. Raises the last error once ATTEMPTS reads failed (at once
    for an answer that would not change)."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            labels = api.get_node(node).get("metadata", {}).get("labels") or {}
            return {key: str(labels[key]) for key in DOMAIN_LABELS if labels.get(key)}
        except ApiError as exc:
            if exc.status in _FINAL or attempt == ATTEMPTS:
                raise
        except Exception:  # a refused or broken connection, a timeout: the next read may get through
            if attempt == ATTEMPTS:
                raise
        sleep(float(attempt))
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def _why(exc: Exception) -> str:
    why = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, ApiError) and exc.status == 403:  # noqa: PLR2004 - HTTP Forbidden
        why += (
            " (the pod's service account needs `get` on nodes: the cluster chart's ClusterRole "
            "binds it for the training service account)"
        )
    return why


def parse_args(argv: Sequence[str] | None, env: Mapping[str, str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m nvrx_eks.training.node.topology", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, required=True, help="the file to write (the trainer reads it)")
    parser.add_argument(
        "--node", default=env.get(NODE_NAME_ENV, ""), help=f"this node's name (default ${NODE_NAME_ENV})"
    )
    parser.add_argument(
        "--token-dir", type=Path, default=SA_DIR, help="the projected service account token and CA"
    )
    return parser.parse_args(argv)


def _read(
    args: argparse.Namespace, env: Mapping[str, str], api: NodeReader | None, sleep: Callable[[float], None]
) -> dict[str, str]:
    if not args.node:
        raise UserError(f"no node name (--node, or ${NODE_NAME_ENV} from the downward API)")
    return read_labels(api or InClusterApi(env, args.token_dir, timeout_s=TIMEOUT_S), args.node, sleep=sleep)


def main(
    argv: Sequence[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    api: NodeReader | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Write the node's topology labels to --out; 0 whatever happened (the file says what did)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    env = os.environ if env is None else env
    args = parse_args(argv, env)
    labels: dict[str, str] = {}
    error = ""
    try:
        labels = _read(args, env, api, sleep)
    except Exception as exc:  # noqa: BLE001 - never fails the pod: the file and the log line say why
        error = _why(exc)
    if not labels and not error:
        error = f"node {args.node} has none of the labels {', '.join(DOMAIN_LABELS)}"
    write_labels(args.out, node=args.node, labels=labels, error=error)
    if error:
        log.warning(
            "node %s: topology labels not read (%s); the peer replica's partners fall back to the "
            "pod's zone label",
            args.node or "?",
            error,
        )
    else:
        found = ", ".join(f"{key}={value}" for key, value in labels.items())
        log.info("node %s: %s -> failure domain %s", args.node, found, domain(labels))
    return 0


if __name__ == "__main__":
    exit_with(main)
