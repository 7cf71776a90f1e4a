"""Is each pinned Helm chart version published where the stack installs it from?

The stack's kubectl handler pulls every chart (infra/cluster_pins.py HELM_CHARTS) during `cdk deploy`; a
version its repository does not hold fails there, late, and rolls the stack back. Preflight asks the
repository first, as Helm would:
- an HTTP repository serves `index.yaml`, whose `entries[CHART]` list every published version
  (https://helm.sh/docs/topics/chart_repository/#the-index-file);
- an OCI repository (`oci://HOST/PATH`) holds each version as a manifest tagged with it
  (https://helm.sh/docs/topics/registries/), read through the registry API with the anonymous pull
  token the registry's 401 challenge offers (https://distribution.github.io/distribution/spec/auth/token/).
"""

from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol
from urllib.error import HTTPError, URLError

import yaml

if TYPE_CHECKING:
    from collections.abc import Mapping

    from nvrx_eks.infra.cluster_pins import ChartPin

_TIMEOUT_S = 20.0
_OCI_MANIFESTS = (
    "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json, "
    "application/vnd.docker.distribution.manifest.v2+json"
)
_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')
NEWEST_LISTED = 5
"""Published versions a failure names (newest first)."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)


class Fetch(Protocol):
    def __call__(self, url: str, headers: Mapping[str, str]) -> Answer: ...


class ChartLookupError(Exception):
    """The repository could not be asked (network, an unexpected answer): the message says which."""


def http_get(url: str, headers: Mapping[str, str]) -> Answer:
    """GET `url` (https, from the pins); an HTTP error status is an answer, a network failure is not."""
    request = urllib.request.Request(url, headers=dict(headers))  # noqa: S310 - https URLs from the pins
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:  # noqa: S310
            return Answer(response.status, response.read(), dict(response.headers))
    except HTTPError as error:
        return Answer(error.code, error.read() or b"", dict(error.headers or {}))
    except (URLError, TimeoutError, OSError) as error:
        raise ChartLookupError(f"cannot reach {url}: {getattr(error, 'reason', error)}") from None


def published(pin: ChartPin, fetch: Fetch = http_get) -> tuple[bool, list[str]]:
    """(whether `pin.version` is published, the versions seen newest first; empty for OCI)."""
    if pin.repository.startswith("oci://"):
        return _oci_has(pin, fetch), []
    url = f"{pin.repository.rstrip('/')}/index.yaml"
    answer = fetch(url, {})
    if answer.status != 200:  # noqa: PLR2004 - HTTP OK
        raise ChartLookupError(f"{url} answered HTTP {answer.status}")
    try:
        index = yaml.safe_load(answer.body) or {}
        entries = index.get("entries", {}).get(pin.chart) or []
        versions = [str(entry["version"]) for entry in entries]
    except (yaml.YAMLError, AttributeError, KeyError, TypeError):
        raise ChartLookupError(f"{url} is not a Helm repository index") from None
    return pin.version in versions, versions[:NEWEST_LISTED]


def _oci_has(pin: ChartPin, fetch: Fetch) -> bool:
    host, _, path = pin.repository.removeprefix("oci://").partition("/")
    url = f"https://{host}/v2/{path}/manifests/{urllib.parse.quote(pin.version)}"
    headers = {"Accept": _OCI_MANIFESTS}
    answer = fetch(url, headers)
    if answer.status == 401:  # noqa: PLR2004 - the registry asks for a token
        challenge = {k.lower(): v for k, v in answer.headers.items()}.get("www-authenticate", "")
        headers["Authorization"] = f"Bearer {_anonymous_token(challenge, fetch)}"
        answer = fetch(url, headers)
    if answer.status == 200:  # noqa: PLR2004
        return True
    if answer.status == 404:  # noqa: PLR2004 - no manifest of that tag
        return False
    raise ChartLookupError(f"{url} answered HTTP {answer.status}")


def _anonymous_token(challenge: str, fetch: Fetch) -> str:
    kind, _, params = challenge.partition(" ")
    fields = dict(_CHALLENGE_PARAM.findall(params))
    realm = fields.pop("realm", "")
    if kind.lower() != "bearer" or not realm.startswith("https://"):
        raise ChartLookupError(f"the registry asks for {challenge!r}; only an anonymous https token is read")
    query = urllib.parse.urlencode({k: v for k, v in fields.items() if k in {"service", "scope"}})
    answer = fetch(f"{realm}?{query}" if query else realm, {})
    try:
        body = json.loads(answer.body)
        return str(body.get("token") or body["access_token"])
    except (ValueError, KeyError, AttributeError):
        raise ChartLookupError(f"{realm} gave no anonymous token (HTTP {answer.status})") from None
