"""`nvrx-eks image pin`: record the base image's digest and the two tarballs' checksums.

Run once on a machine with internet. It downloads the EFA installer and the aws-ofi-nccl release
tarball at the versions in kitcore/pins.py (over TLS, from the URLs the Dockerfile fetches), hashes
them, asks the base image's registry which manifest its tag names (the OCI distribution API, with
the registry's anonymous bearer token where it asks for one), and writes the three values into
kitcore/pins.py `IMAGE` and the Dockerfile's ARG defaults. Nothing else in either file changes.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import re
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Protocol
from urllib.error import HTTPError, URLError

from kitcore.configio import UserError
from kitcore.pins import IMAGE, STORE_IMAGE, ImagePins, StoreImagePins

if TYPE_CHECKING:
    from collections.abc import Mapping
    from email.message import Message

PINS_FILE = Path(__file__).resolve().parent.parent / "kitcore" / "pins.py"
# The fields this command owns, and the Dockerfile ARGs that carry them (images/build.py BUILD_ARG_NAMES).
PINNED_FIELDS = ("base_digest", "efa_installer_sha256", "aws_ofi_nccl_sha256")
DOCKERFILE_ARGS = {"BASE_IMAGE": "base_image", **{f.upper(): f for f in PINNED_FIELDS[1:]}}
# The same for the store's image (kitcore/pins.py STORE_IMAGE, images/store.Dockerfile).
STORE_PINNED_FIELDS = ("base_digest", "torch_sha256")
STORE_DOCKERFILE_ARGS = {"BASE_IMAGE": "base_image", "TORCH_SHA256": "torch_sha256"}
# Both manifest lists (multi-platform tags, like NGC's) and single manifests: the digest recorded is the
# one `docker buildx imagetools inspect` prints for the tag.
MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
_CHUNK = 1 << 20
_TIMEOUT_S = 60.0
_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')


class Response(Protocol):
    headers: Message

    def read(self, amt: int = ..., /) -> bytes: ...


class Opener(Protocol):
    def __call__(self, request: urllib.request.Request, *, timeout: float) -> Response: ...


def _open(request: urllib.request.Request, *, timeout: float) -> Response:
    return urllib.request.urlopen(request, timeout=timeout)  # noqa: S310 - https URLs built from the pins


def _get(opener: Opener, url: str, **headers: str) -> Response:
    try:
        # https URLs built from the pins (a test's opener routes them to loopback).
        return opener(urllib.request.Request(url, headers=headers), timeout=_TIMEOUT_S)  # noqa: S310
    except HTTPError:
        raise
    except (URLError, TimeoutError, OSError) as error:
        raise UserError(
            f"cannot reach {url}: {getattr(error, 'reason', error)}. `nvrx-eks image pin` needs internet "
            "(run it where the image is built, then commit kitcore/pins.py)"
        ) from None


def sha256_of(url: str, *, opener: Opener = _open) -> str:
    """The sha256 of what `url` serves, read in chunks (the EFA installer is ~500 MB)."""
    try:
        response = _get(opener, url)
    except HTTPError as error:
        raise UserError(f"{url}: HTTP {error.code}; is the version in kitcore/pins.py published?") from None
    digest = hashlib.sha256()
    while chunk := response.read(_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def _bearer_token(challenge: str, *, opener: Opener, scheme: str) -> str:
    """The anonymous pull token a registry's `WWW-Authenticate: Bearer realm=...` challenge offers."""
    kind, _, params = challenge.partition(" ")
    fields = dict(_CHALLENGE_PARAM.findall(params))
    realm = fields.pop("realm", "")
    if kind.lower() != "bearer" or urllib.parse.urlsplit(realm).scheme != scheme:
        raise UserError(
            f"the registry asks for {challenge!r}; only an anonymous {scheme} bearer token is supported"
        )
    query = urllib.parse.urlencode({k: v for k, v in fields.items() if k in {"service", "scope"}})
    body = json.loads(_get(opener, f"{realm}?{query}" if query else realm).read())
    token = body.get("token") or body.get("access_token")
    if not token:
        raise UserError(f"the registry's token service {realm} returned no token")
    return token


def registry_digest(repository: str, tag: str, *, opener: Opener = _open, scheme: str = "https") -> str:
    """sha256:... of the manifest `repository:tag` names, as the registry serves it."""
    host, slash, path = repository.partition("/")
    if not slash or not ("." in host or ":" in host):
        raise UserError(f"base_repository {repository!r} must start with its registry (e.g. nvcr.io/...)")
    # Docker Hub's images are named docker.io/..., its registry API answers at registry-1.docker.io.
    host = {"docker.io": "registry-1.docker.io"}.get(host, host)
    url = f"{scheme}://{host}/v2/{path}/manifests/{tag}"
    headers = {"Accept": ", ".join(MANIFEST_TYPES)}
    try:
        response = _get(opener, url, **headers)
    except HTTPError as error:
        if error.code != 401 or "WWW-Authenticate" not in error.headers:  # noqa: PLR2004 - HTTP status
            raise UserError(f"{repository}:{tag}: the registry answered HTTP {error.code}") from None
        token = _bearer_token(error.headers["WWW-Authenticate"], opener=opener, scheme=scheme)
        try:
            response = _get(opener, url, Authorization=f"Bearer {token}", **headers)
        except HTTPError as again:
            raise UserError(f"{repository}:{tag}: the registry answered HTTP {again.code}") from None
    body = response.read()
    # The registry names the digest of what it stores; hashing the body we got is the same value when the
    # header is absent (the body is the manifest's canonical bytes).
    digest = response.headers.get("Docker-Content-Digest") or f"sha256:{hashlib.sha256(body).hexdigest()}"
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise UserError(f"{repository}:{tag}: the registry returned digest {digest!r}, not sha256:<64 hex>")
    return digest


def resolve(
    pins: ImagePins = IMAGE, *, opener: Opener | None = None, scheme: str = "https"
) -> dict[str, str]:
    """The values `pin` records for these pins' versions: field -> value."""
    opener = opener or _open
    return {
        "base_digest": registry_digest(pins.base_repository, pins.base_tag, opener=opener, scheme=scheme),
        "efa_installer_sha256": sha256_of(pins.efa_installer_url, opener=opener),
        "aws_ofi_nccl_sha256": sha256_of(pins.aws_ofi_nccl_url, opener=opener),
    }


def _offset(lines: list[str], line: int, col: int) -> int:
    # ast columns are UTF-8 byte offsets; pins.py is ASCII, so they are character offsets too.
    return sum(len(text) for text in lines[: line - 1]) + col


def resolve_store(
    pins: StoreImagePins = STORE_IMAGE, *, opener: Opener | None = None, scheme: str = "https"
) -> dict[str, str]:
    """The values `pin` records for the store image's versions: field -> value."""
    opener = opener or _open
    return {
        "base_digest": registry_digest(pins.base_repository, pins.base_tag, opener=opener, scheme=scheme),
        "torch_sha256": sha256_of(pins.torch_wheel_url, opener=opener),
    }


def rewrite_pins(source: str, values: Mapping[str, str], *, target: str = "IMAGE") -> str:
    """`source` (kitcore/pins.py) with the keyword arguments `values` names in `<target> = ...(...)`
    set to new string literals; every other character unchanged."""
    call = next(
        (
            node.value
            for node in ast.parse(source).body
            if isinstance(node, ast.Assign)
            and [getattr(t, "id", None) for t in node.targets] == [target]
            and isinstance(node.value, ast.Call)
        ),
        None,
    )
    if call is None:
        raise RuntimeError(f"kitcore/pins.py has no `{target} = ...(...)`")
    keywords = {k.arg: k.value for k in call.keywords}
    missing = [name for name in values if name not in keywords]
    if missing:
        raise RuntimeError(f"kitcore/pins.py {target} does not set {missing}: add them (any value) first")
    lines = source.splitlines(keepends=True)
    spans = sorted(
        (
            (
                _offset(lines, n.lineno, n.col_offset),
                _offset(lines, n.end_lineno or n.lineno, n.end_col_offset or 0),
            ),
            name,
        )
        for name, n in ((name, keywords[name]) for name in values)
    )
    for (start, end), name in reversed(spans):
        source = f"{source[:start]}{json.dumps(values[name])}{source[end:]}"
    return source


def rewrite_dockerfile(
    text: str, pins: ImagePins | StoreImagePins, args: Mapping[str, str] = DOCKERFILE_ARGS
) -> str:
    """Every `ARG NAME=default` line of the pinned ARGs set to the pins' value."""
    for arg, attribute in args.items():
        value = str(getattr(pins, attribute))
        text = re.sub(rf"^ARG {arg}=\S*[ \t]*$", f"ARG {arg}={value}", text, flags=re.MULTILINE)
    return text


def record(
    values: Mapping[str, str], *, pins: ImagePins = IMAGE, pins_file: Path | None = None, dockerfile: Path
) -> ImagePins:
    """Write `values` into kitcore/pins.py (or `pins_file`) and the Dockerfile; return the pins as now
    recorded."""
    pins_file = pins_file or PINS_FILE
    pinned = dataclasses.replace(pins, **values)
    pins_file.write_text(rewrite_pins(pins_file.read_text(), values))
    dockerfile.write_text(rewrite_dockerfile(dockerfile.read_text(), pinned))
    return pinned


def record_store(
    values: Mapping[str, str],
    *,
    pins: StoreImagePins = STORE_IMAGE,
    pins_file: Path | None = None,
    dockerfile: Path,
) -> StoreImagePins:
    """Write the store image's `values` into kitcore/pins.py STORE_IMAGE and images/store.Dockerfile."""
    pins_file = pins_file or PINS_FILE
    pinned = dataclasses.replace(pins, **values)
    pins_file.write_text(rewrite_pins(pins_file.read_text(), values, target="STORE_IMAGE"))
    dockerfile.write_text(rewrite_dockerfile(dockerfile.read_text(), pinned, STORE_DOCKERFILE_ARGS))
    return pinned
