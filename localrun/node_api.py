"""The local "cluster"'s API server: `GET /api/v1/nodes/<name>`, over HTTPS on loopback.

The trainer pod's topology init container reads its own Node through the API (training/node/topology.py)
with a projected service account token and the cluster's CA. The local executor plays the kubelet for
it (localrun/executor.py): it writes this server's token and CA into the pod's projected volume and
gives every container KUBERNETES_SERVICE_HOST/PORT, as the kubelet does; this server plays the API
server, answering with the local node's labels. So a local run takes the cluster's path: TLS checked
against the CA, the bearer token checked, the same JSON.

It serves what the job's pods call and nothing more: a GET of one Node by name. A missing or wrong
token is 401, any other path or an unknown node 404, any other method 501. The CA and the server's
certificate (for 127.0.0.1) are made per server; the server's key never touches the disk for longer
than loading it takes.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import json
import re
import secrets
import ssl
import threading
import urllib.parse
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

if TYPE_CHECKING:
    from pathlib import Path

LOOPBACK = "127.0.0.1"
_NODE_PATH = re.compile(r"/api/v1/nodes/([^/?#]+)")
_VALID = timedelta(days=1)


def _certificates() -> tuple[bytes, bytes, bytes]:
    """(CA certificate, server certificate, server key), PEM: a CA of its own signs the server's
    certificate for 127.0.0.1, as a cluster's CA signs its API server's."""
    now = datetime.now(UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nvrx-eks local cluster CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + _VALID)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, LOOPBACK)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + _VALID)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(LOOPBACK))]), critical=False
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    pem = serialization.Encoding.PEM
    return ca.public_bytes(pem), server.public_bytes(pem), key_pem


class LocalApiServer:
    """Serves the local nodes (`nodes`: name -> labels) to holders of `token`; `ca_pem` verifies it."""

    def __init__(self, folder: Path) -> None:
        """`folder`: where the server's certificate and (briefly) its key are written to be loaded."""
        self.token = secrets.token_urlsafe(32)
        self.nodes: dict[str, dict[str, str]] = {}
        self.requests: list[str] = []
        """The nodes read, in order (what the job's pods asked for)."""
        self.ca_pem, cert_pem, key_pem = _certificates()
        folder.mkdir(parents=True, exist_ok=True)
        cert, key = folder / "apiserver.crt", folder / "apiserver.key"
        cert.write_bytes(cert_pem)
        key.touch(mode=0o600)
        key.write_bytes(key_pem)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            context.load_cert_chain(cert, key)
        finally:
            key.unlink()
        self._server = ThreadingHTTPServer((LOOPBACK, 0), _Handler)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._server.api = self  # type: ignore[attr-defined]  # read by the handler
        # A short poll: `close` waits for the loop to see it, at the end of every run.
        serve = functools.partial(self._server.serve_forever, poll_interval=0.05)
        self._thread = threading.Thread(target=serve, name="local-api", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        api: LocalApiServer = self.server.api  # type: ignore[attr-defined]
        if not hmac.compare_digest(self.headers.get("Authorization", ""), f"Bearer {api.token}"):
            self._send(401, _status(401, "Unauthorized", "a valid bearer token is required"))
            return
        match = _NODE_PATH.fullmatch(self.path)
        name = urllib.parse.unquote(match.group(1)) if match else ""
        if name not in api.nodes:
            self._send(404, _status(404, "NotFound", f"{self.path} not found"))
            return
        api.requests.append(name)
        node = {"kind": "Node", "apiVersion": "v1", "metadata": {"name": name, "labels": api.nodes[name]}}
        self._send(200, node)

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002, ANN401 - the base class's signature
        """Quiet: `requests` records what was read."""


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    """The API server's error body (a Status object)."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "reason": reason,
        "code": code,
        "message": message,
    }
