"""The Kubernetes API as a pod sees it, with the standard library only.

The training image has no Kubernetes client (its locked requirements are built inside the base image),
and the two callers need a handful of fixed REST requests: the node check (nodecheck.py: read, label,
taint its Node, create Events) and the trainer pod's topology init container (topology.py: read its
Node's labels).
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nvrx_eks.kitcore.configio import UserError

if TYPE_CHECKING:
    from collections.abc import Mapping


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
"""Where a pod's service account token and the cluster's CA are mounted (`token`, `ca.crt`)."""


class InClusterApi:
    """The API server as seen from a pod: its service account token (re-read each call: the kubelet
    rotates it) and CA; the address the kubelet gives every container (KUBERNETES_SERVICE_HOST/PORT)."""

    def __init__(
        self, env: Mapping[str, str] | None = None, sa_dir: Path = SA_DIR, *, timeout_s: float = 30.0
    ) -> None:
        env = env if env is not None else os.environ
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise UserError("KUBERNETES_SERVICE_HOST is unset: run inside a pod")
        self.base = f"https://{host}:{port}"
        self.sa_dir = sa_dir
        self.timeout_s = timeout_s
        self.context = ssl.create_default_context(cafile=str(sa_dir / "ca.crt"))

    def _call(self, method: str, path: str, body: dict[str, Any] | None, content_type: str) -> dict[str, Any]:
        token = (self.sa_dir / "token").read_text().strip()
        request = urllib.request.Request(  # noqa: S310 - https to the API server only
            self.base + path,
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": content_type,
                "Accept": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, context=self.context, timeout=self.timeout_s) as response:  # noqa: S310
                answer: dict[str, Any] = json.loads(response.read() or b"{}")
                return answer
        except urllib.error.HTTPError as exc:
            raise ApiError(exc.code, exc.read().decode(errors="replace")[:300]) from None

    @staticmethod
    def _node(name: str) -> str:
        return f"/api/v1/nodes/{urllib.parse.quote(name, safe='')}"

    def get_node(self, name: str) -> dict[str, Any]:
        return self._call("GET", self._node(name), None, "application/json")

    def patch_node(self, name: str, patch: dict[str, Any]) -> None:
        self._call("PATCH", self._node(name), patch, "application/merge-patch+json")

    def patch_node_status(self, name: str, patch: dict[str, Any]) -> None:
        self._call("PATCH", f"{self._node(name)}/status", patch, "application/strategic-merge-patch+json")

    def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        self._call("POST", f"/api/v1/namespaces/{namespace}/events", body, "application/json")
