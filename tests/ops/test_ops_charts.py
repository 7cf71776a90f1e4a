"""preflight's Helm chart rows: each pinned version published where the stack installs it from."""

from __future__ import annotations

import dataclasses
import json

import yaml

from nvrx_eks.infra import cluster_pins
from nvrx_eks.infra.ops import charts
from nvrx_eks.infra.ops.charts import Answer
from nvrx_eks.infra.ops.preflight import CHART_CHECK, Status, chart_version

HTTP_PIN = cluster_pins.ChartPin(
    chart="dcgm-exporter", repository="https://example.test/charts", version="4.1.1", namespace="x"
)
OCI_PIN = cluster_pins.ChartPin(
    chart="kueue", repository="oci://registry.test/kueue/charts/kueue", version="0.19.3", namespace="x"
)
MANIFEST = "https://registry.test/v2/kueue/charts/kueue/manifests/0.19.3"
REALM = "https://auth.registry.test/token"


def _index(*versions: str) -> Answer:
    entries = {HTTP_PIN.chart: [{"name": HTTP_PIN.chart, "version": v} for v in versions]}
    return Answer(200, yaml.safe_dump({"apiVersion": "v1", "entries": entries}).encode())


def _serve(monkeypatch, routes: dict[str, Answer], seen: list[tuple[str, dict]] | None = None) -> None:
    def fetch(url, headers):
        if seen is not None:
            seen.append((url, dict(headers)))
        return routes.get(url, Answer(404))

    monkeypatch.setattr(charts, "http_get", fetch)


def test_a_version_the_index_lists_passes(monkeypatch):
    _serve(monkeypatch, {"https://example.test/charts/index.yaml": _index("4.2.0", "4.1.1")})
    row = chart_version(HTTP_PIN)
    assert (row.check, row.subject, row.status) == (CHART_CHECK, "dcgm-exporter 4.1.1", Status.PASS)


def test_a_version_the_index_lacks_fails_naming_what_it_publishes(monkeypatch):
    _serve(monkeypatch, {"https://example.test/charts/index.yaml": _index("4.2.0", "4.1.0")})
    row = chart_version(HTTP_PIN)
    assert row.status is Status.FAIL
    assert row.detail == (
        "https://example.test/charts does not publish dcgm-exporter 4.1.1; it publishes 4.2.0, 4.1.0"
    )
    assert "infra/cluster_pins.py HELM_CHARTS" in row.fix


def test_an_oci_chart_is_read_with_the_registrys_anonymous_token(monkeypatch):
    challenge = f'Bearer realm="{REALM}",service="registry.test",scope="repository:kueue/charts/kueue:pull"'
    token_url = f"{REALM}?service=registry.test&scope=repository%3Akueue%2Fcharts%2Fkueue%3Apull"
    manifest = iter([Answer(401, b"", {"Www-Authenticate": challenge}), Answer(200, b"{}")])
    seen: list[tuple[str, dict]] = []

    def fetch(url, headers):
        seen.append((url, dict(headers)))
        if url == token_url:
            return Answer(200, json.dumps({"token": "t0k"}).encode())
        return next(manifest) if url == MANIFEST else Answer(404)

    monkeypatch.setattr(charts, "http_get", fetch)
    assert chart_version(OCI_PIN).status is Status.PASS
    assert [url for url, _ in seen] == [MANIFEST, token_url, MANIFEST]
    assert seen[-1][1]["Authorization"] == "Bearer t0k"
    assert "application/vnd.oci.image.manifest.v1+json" in seen[-1][1]["Accept"]


def test_an_oci_tag_the_registry_lacks_fails(monkeypatch):
    _serve(monkeypatch, {MANIFEST: Answer(404)})
    row = chart_version(OCI_PIN)
    assert row.status is Status.FAIL
    assert row.detail == "oci://registry.test/kueue/charts/kueue does not publish kueue 0.19.3"


def test_an_unreachable_repository_fails_the_row_not_the_run(monkeypatch):
    def fetch(url, headers):
        raise charts.ChartLookupError(f"cannot reach {url}: Name or service not known")

    monkeypatch.setattr(charts, "http_get", fetch)
    row = chart_version(dataclasses.replace(HTTP_PIN))
    assert row.status is Status.FAIL
    assert row.detail == "cannot reach https://example.test/charts/index.yaml: Name or service not known"
