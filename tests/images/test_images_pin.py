"""`nvrx-eks image pin` against a registry and download hosts served on loopback.

The server plays the hosts the command talks to (the EFA installer's, GitHub's release downloads, the
base image's registry with its anonymous bearer token service, each Helm chart image's registry, one of
them ECR with HTTP Basic); the command's real URLs are routed to it by the opener, so what is exercised
is the command's own HTTP code. ECR's credentials come from a stand-in for GetAuthorizationToken.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import re
import sys
import threading
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING
from urllib.error import URLError

import pytest
from typer.testing import CliRunner

from nvrx_eks.images import build
from nvrx_eks.images import pin as pinning
from nvrx_eks.infra.cluster_pins import HELM_CHARTS, ChartImage
from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.kitcore.pins import IMAGE, STORE_IMAGE, UNPUBLISHED_SHA256

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

EFA_BYTES = b"efa installer tarball " * 100_000  # > one read chunk
OFI_BYTES = b"aws-ofi-nccl release tarball\n"
TORCH_BYTES = b"torch cpu wheel\n"
MANIFEST = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json"}).encode()
MANIFEST_DIGEST = f"sha256:{hashlib.sha256(MANIFEST).hexdigest()}"
TOKEN = "anonymous-pull-token"  # noqa: S105 - the fake registry's token
ECR_TOKEN = base64.b64encode(b"AWS:ecr-password").decode()  # what GetAuthorizationToken returns
ECR_HOST = re.compile(r"\d{12}\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com")
CHART_IMAGES = {
    (name, image.values_key): image for name, chart in HELM_CHARTS.items() for image in chart.images
}


def _registry(repository: str) -> tuple[str, str]:
    """(registry host, path) of REPOSITORY, as the pin command asks it (Docker Hub at registry-1)."""
    host, _, path = repository.partition("/")
    return {"docker.io": "registry-1.docker.io"}.get(host, host), path


BASE_HOST, BASE_PATH = _registry(IMAGE.base_repository)


def _location(image: ChartImage) -> tuple[str, str]:
    """(host, path) where the registry serves the image's manifest."""
    host, _, path = image.repository.partition("/")
    return host, f"/v2/{path}/manifests/{image.tag}"


def _chart_manifest(image: ChartImage) -> bytes:
    # Each image its own bytes, so its own digest.
    return json.dumps(
        {"schemaVersion": 2, "annotations": {"ref": f"{image.repository}:{image.tag}"}}
    ).encode()


def _chart_digest(image: ChartImage) -> str:
    return f"sha256:{hashlib.sha256(_chart_manifest(image)).hexdigest()}"


CHART_MANIFESTS = {_location(image): _chart_manifest(image) for image in CHART_IMAGES.values()}


class _Registry(BaseHTTPRequestHandler):
    seen: list[tuple[str, str, str | None]]
    send_digest_header = True

    def log_message(self, *_: object) -> None:
        pass

    def _send(self, status: int, body: bytes = b"", **headers: str) -> None:
        self.send_response(status)
        for key, value in {"Content-Length": str(len(body)), **headers}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        host = self.headers["X-Original-Host"]
        self.seen.append((host, url.path, self.headers.get("Authorization")))
        tarballs = {
            ("efa-installer.amazonaws.com", f"/aws-efa-installer-{IMAGE.efa_installer}.tar.gz"): EFA_BYTES,
            (
                "github.com",
                f"/aws/aws-ofi-nccl/releases/download/v{IMAGE.aws_ofi_nccl}/aws-ofi-nccl-{IMAGE.aws_ofi_nccl}.tar.gz",
            ): OFI_BYTES,
        }
        tarballs[("download.pytorch.org", urllib.parse.urlsplit(STORE_IMAGE.torch_wheel_url).path)] = (
            TORCH_BYTES
        )
        store_manifest = f"/v2/library/python/manifests/{STORE_IMAGE.base_tag}"
        if (host, url.path) in tarballs:
            self._send(200, tarballs[host, url.path])
        elif host == BASE_HOST and url.path == f"/v2/{BASE_PATH}/manifests/{IMAGE.base_tag}":
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                challenge = (
                    f'Bearer realm="https://{BASE_HOST}/proxy_auth",scope="repository:{BASE_PATH}:pull"'
                )
                self._send(401, b"{}", **{"WWW-Authenticate": challenge})
            elif "application/vnd.oci.image.index.v1+json" not in self.headers.get("Accept", ""):
                self._send(406)
            else:
                digest = {"Docker-Content-Digest": MANIFEST_DIGEST} if self.send_digest_header else {}
                self._send(200, MANIFEST, **digest)
        elif (host, url.path) in CHART_MANIFESTS:
            ecr = ECR_HOST.fullmatch(host)
            if ecr and self.headers.get("Authorization") != f"Basic {ECR_TOKEN}":
                challenge = f'Basic realm="https://{host}/",service="ecr.amazonaws.com"'
                self._send(401, b"{}", **{"WWW-Authenticate": challenge})
            else:
                self._send(200, CHART_MANIFESTS[host, url.path])
        elif host == "registry-1.docker.io" and url.path == store_manifest:
            self._send(200, MANIFEST, **{"Docker-Content-Digest": MANIFEST_DIGEST})
        elif host == BASE_HOST and url.path == "/proxy_auth":
            query = urllib.parse.parse_qs(url.query)
            assert query == {"scope": [f"repository:{BASE_PATH}:pull"]}
            self._send(200, json.dumps({"token": TOKEN}).encode())
        else:
            self._send(404)


@pytest.fixture
def served() -> Iterator[tuple[pinning.Opener, list[tuple[str, str, str | None]]]]:
    seen: list[tuple[str, str, str | None]] = []
    handler = type("Handler", (_Registry,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]

    def opener(request: urllib.request.Request, *, timeout: float) -> pinning.Response:
        # Every https URL the command builds goes to the loopback server, its host in a header.
        url = urllib.parse.urlsplit(request.full_url)
        assert url.scheme == "https", request.full_url
        local = urllib.parse.urlunsplit(("http", f"127.0.0.1:{port}", url.path, url.query, ""))
        # http to loopback only
        routed = urllib.request.Request(local, headers={**request.headers, "X-Original-Host": url.netloc})  # noqa: S310
        return urllib.request.urlopen(routed, timeout=timeout)  # noqa: S310

    yield opener, seen
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def test_resolve_hashes_both_tarballs_and_asks_the_registry_with_its_token(served):
    opener, seen = served
    values = pinning.resolve(IMAGE, opener=opener)
    assert values == {
        "base_digest": MANIFEST_DIGEST,
        "efa_installer_sha256": hashlib.sha256(EFA_BYTES).hexdigest(),
        "aws_ofi_nccl_sha256": hashlib.sha256(OFI_BYTES).hexdigest(),
    }
    manifest = f"/v2/{BASE_PATH}/manifests/{IMAGE.base_tag}"
    # First anonymous, refused; then the token; then the manifest with it.
    assert [s for s in seen if s[0] == BASE_HOST and "library/python" not in s[1]] == [
        (BASE_HOST, manifest, None),
        (BASE_HOST, "/proxy_auth", None),
        (BASE_HOST, manifest, f"Bearer {TOKEN}"),
    ]


def test_without_the_digest_header_the_manifest_bytes_are_hashed(served, monkeypatch):
    opener, _ = served
    monkeypatch.setattr(_Registry, "send_digest_header", False)
    assert pinning.registry_digest(IMAGE.base_repository, IMAGE.base_tag, opener=opener) == MANIFEST_DIGEST


def _ecr(asked: list[str]) -> Callable[[str], str]:
    """A stand-in for ecr:GetAuthorizationToken that records the regions it is asked for."""

    def token(region: str) -> str:
        asked.append(region)
        return ECR_TOKEN

    return token


def test_each_chart_image_resolves_to_the_digest_its_registry_serves_ecr_with_aws_credentials(served):
    opener, seen = served
    asked: list[str] = []
    digests = pinning.resolve_charts(HELM_CHARTS, opener=opener, ecr=_ecr(asked))
    assert digests == {key: _chart_digest(image) for key, image in CHART_IMAGES.items()}
    ecr_hosts = sorted({h for h, _ in map(_location, CHART_IMAGES.values()) if ECR_HOST.fullmatch(h)})
    assert ecr_hosts, "no chart image is in ECR any more: this test no longer covers ECR's Basic auth"
    # ECR offers no anonymous token: refused, then asked again with the registry region's credentials.
    assert asked == [ECR_HOST.fullmatch(h).group(1) for h in ecr_hosts]  # type: ignore[union-attr]
    assert [auth for host, _, auth in seen if host in ecr_hosts] == [None, f"Basic {ECR_TOKEN}"] * len(
        ecr_hosts
    )


def test_ecr_credentials_are_getauthorizationtokens_in_the_registrys_region(aws_credentials):
    from moto import mock_aws  # noqa: PLC0415

    with mock_aws():
        token = pinning.ecr_token("us-west-2")
    user, _, password = base64.b64decode(token).decode().partition(":")
    assert (user, bool(password)) == ("AWS", True)


def test_a_chart_image_in_ecr_without_aws_credentials_is_one_message(served, aws_credentials, monkeypatch):
    opener, _ = served
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var)
    (image,) = [i for i in CHART_IMAGES.values() if ECR_HOST.fullmatch(_location(i)[0])]
    with pytest.raises(UserError, match="no AWS credentials found"):
        pinning.registry_digest(image.repository, image.tag, opener=opener)


def _load(path: Path) -> object:
    spec = importlib.util.spec_from_file_location("recorded_pins", path)
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through it
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


REAL_FILES = (pinning.PINS_FILE, pinning.CLUSTER_PINS_FILE, build.DOCKERFILE, build.STORE_DOCKERFILE)


@pytest.fixture
def copies(tmp_path, monkeypatch) -> Iterator[tuple[Path, Path]]:
    """Copies of the image pins, the cluster pins and both Dockerfiles, which `pin` writes instead."""
    real = [path.read_text() for path in REAL_FILES]
    names = ("pins.py", "cluster_pins.py", "Dockerfile", "store.Dockerfile")
    for name, text in zip(names, real, strict=True):
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(pinning, "PINS_FILE", tmp_path / "pins.py")
    monkeypatch.setattr(pinning, "CLUSTER_PINS_FILE", tmp_path / "cluster_pins.py")
    monkeypatch.setattr(build, "DOCKERFILE", tmp_path / "Dockerfile")
    monkeypatch.setattr(build, "STORE_DOCKERFILE", tmp_path / "store.Dockerfile")
    yield tmp_path / "pins.py", tmp_path / "Dockerfile"
    assert [path.read_text() for path in REAL_FILES] == real, "the test wrote the real files"


def _changed_lines(before: str, after: str) -> list[tuple[str, str]]:
    old, new = before.splitlines(), after.splitlines()
    assert len(old) == len(new)
    return [(a, b) for a, b in zip(old, new, strict=True) if a != b]


def test_pin_records_the_three_values_in_the_pins_and_the_dockerfile_and_nothing_else(
    image_app, served, copies, monkeypatch
):
    opener, _ = served
    pins_file, dockerfile = copies
    cluster_file = pins_file.with_name("cluster_pins.py")
    pins_before, docker_before = pins_file.read_text(), dockerfile.read_text()
    cluster_before = cluster_file.read_text()
    monkeypatch.setattr(pinning, "_open", opener)
    monkeypatch.setattr(pinning, "ecr_token", _ecr([]))
    result = CliRunner().invoke(image_app, ["image", "pin"])
    assert result.exit_code == 0, result.output
    efa = hashlib.sha256(EFA_BYTES).hexdigest()
    assert f"efa_installer_sha256: {efa}" in result.stdout
    # The recorded module: the three values, every other pin as it was.
    recorded = _load(pins_file).IMAGE
    assert recorded.base_digest == MANIFEST_DIGEST
    assert recorded.efa_installer_sha256 == efa
    assert recorded.aws_ofi_nccl_sha256 == hashlib.sha256(OFI_BYTES).hexdigest()
    for field in (
        "base_repository",
        "base_tag",
        "nvrx_version",
        "efa_installer",
        "aws_ofi_nccl",
        "trainer_uid",
    ):
        assert getattr(recorded, field) == getattr(IMAGE, field), field
    # ... and the store image's base digest and torch wheel checksum.
    store = _load(pins_file).STORE_IMAGE
    assert (store.base_digest, store.torch_sha256) == (
        MANIFEST_DIGEST,
        hashlib.sha256(TORCH_BYTES).hexdigest(),
    )
    assert (store.base_repository, store.torch_version) == (
        STORE_IMAGE.base_repository,
        STORE_IMAGE.torch_version,
    )
    # ... and each chart image's digest, the registry named as its source; nothing else of the charts.
    charts = _load(cluster_file).HELM_CHARTS
    for (name, key), image in CHART_IMAGES.items():
        (recorded_image,) = [i for i in charts[name].images if i.values_key == key]
        assert recorded_image.digest == _chart_digest(image)
        assert recorded_image.source == pinning.REGISTRY_SOURCE
        assert (recorded_image.repository, recorded_image.tag) == (image.repository, image.tag)
        assert charts[name].version == HELM_CHARTS[name].version
    # Three training-image values and two store values; a digest and a source line per chart image.
    assert len(_changed_lines(pins_before, pins_file.read_text())) == 5
    assert len(_changed_lines(cluster_before, cluster_file.read_text())) == 2 * len(CHART_IMAGES)
    store_dockerfile = dockerfile.with_name("store.Dockerfile")
    assert f"ARG TORCH_SHA256={store.torch_sha256}" in store_dockerfile.read_text()
    assert f"ARG BASE_IMAGE={STORE_IMAGE.base_repository}:{STORE_IMAGE.base_tag}@{MANIFEST_DIGEST}" in (
        store_dockerfile.read_text()
    )
    # The Dockerfile's defaults follow (tests/images/test_images_dockerfile.py checks them equal).
    changed = _changed_lines(docker_before, dockerfile.read_text())
    assert {new for _, new in changed} == {
        f"ARG BASE_IMAGE={IMAGE.base_repository}:{IMAGE.base_tag}@{MANIFEST_DIGEST}",
        f"ARG EFA_INSTALLER_SHA256={efa}",
        f"ARG AWS_OFI_NCCL_SHA256={recorded.aws_ofi_nccl_sha256}",
    }
    # Recorded, the build no longer refuses.
    build.check_verifiable(recorded, store)
    # The base changed: the lock must be resolved in it again.
    assert "nvrx-eks image lock" in result.stderr


def test_pin_dry_run_prints_and_writes_nothing(image_app, served, copies, monkeypatch):
    opener, _ = served
    pins_file, dockerfile = copies
    before = pins_file.read_text(), dockerfile.read_text()
    monkeypatch.setattr(pinning, "_open", opener)
    monkeypatch.setattr(pinning, "ecr_token", _ecr([]))
    result = CliRunner().invoke(image_app, ["image", "pin", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert f"base_digest: {MANIFEST_DIGEST}" in result.stdout
    for (name, key), image in CHART_IMAGES.items():
        assert f"HELM_CHARTS[{name}] {key}: {_chart_digest(image)}" in result.stdout
    assert (pins_file.read_text(), dockerfile.read_text()) == before
    assert pins_file.with_name("cluster_pins.py").read_text() == pinning.CLUSTER_PINS_FILE.read_text()


def test_pin_placeholders_are_overwritten_too():
    source = pinning.PINS_FILE.read_text()
    unpinned = pinning.rewrite_pins(source, {"base_digest": UNPUBLISHED_SHA256})
    assert 'base_digest="unpublished"' in unpinned
    assert pinning.rewrite_pins(unpinned, {"base_digest": MANIFEST_DIGEST}).count(MANIFEST_DIGEST) == 1


def test_a_chart_image_pins_py_does_not_list_is_refused_by_name():
    with pytest.raises(RuntimeError, match=r"HELM_CHARTS\['kueue'\] has no ChartImage\(values_key='image'\)"):
        pinning.rewrite_chart_images(
            pinning.CLUSTER_PINS_FILE.read_text(), {("kueue", "image"): MANIFEST_DIGEST}
        )


def test_without_internet_pin_is_one_message(image_app, copies, monkeypatch):
    def offline(request: urllib.request.Request, *, timeout: float) -> pinning.Response:
        raise URLError("[Errno -3] Temporary failure in name resolution")

    pins_file, _ = copies
    before = pins_file.read_text()
    monkeypatch.setattr(pinning, "_open", offline)
    result = CliRunner().invoke(image_app, ["image", "pin"])
    assert isinstance(result.exception, UserError)
    assert "needs internet" in str(result.exception)
    assert "cannot reach https://" in str(result.exception)
    assert pins_file.read_text() == before
