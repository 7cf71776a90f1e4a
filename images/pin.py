"""`nvrx-eks image pin`: record the base images' digests, the tarballs' checksums and the charts' digests.

Run once on a machine with internet. It downloads the EFA installer and the aws-ofi-nccl release
tarball at the versions in kitcore/pins.py (over TLS, from the URLs the Dockerfile fetches), hashes
them, asks the base image's registry which manifest its tag names (the OCI distribution API, with
the registry's anonymous bearer token where it asks for one), and writes the three values into
kitcore/pins.py `IMAGE` and the Dockerfile's ARG defaults; the same for the store image. It asks each
Helm chart image's registry the same way for its tag's digest (ECR, which offers no anonymous token,
with the caller's AWS credentials) and writes it, with the registry as its source, into that image's
entry in infra/cluster_pins.py `HELM_CHARTS`. Nothing else in these files changes.
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

from nvrx_eks.infra.cluster_pins import HELM_CHARTS, ChartPin
from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.kitcore.pins import IMAGE, STORE_IMAGE, ImagePins, StoreImagePins

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from email.message import Message

PINS_FILE = Path(__file__).resolve().parent.parent / "kitcore" / "pins.py"
CLUSTER_PINS_FILE = Path(__file__).resolve().parent.parent / "infra" / "cluster_pins.py"
"""Where the charts' image digests are recorded (`HELM_CHARTS`)."""
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
# A private ECR registry's host; its region is where GetAuthorizationToken is asked.
_ECR_HOST = re.compile(r"\d{12}\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?")
# What `pin` writes as a chart image's source beside the digest it read.
REGISTRY_SOURCE = "read from the registry by `nvrx-eks image pin`"
ChartImageKey = tuple[str, str]
"""(chart name in HELM_CHARTS, the image's values_key)."""


class Response(Protocol):
    headers: Message

    def read(self, amt: int = ..., /) -> bytes: ...


class Opener(Protocol):
    def __call__(self, request: urllib.request.Request, *, timeout: float) -> Response: ...


def _open(request: urllib.request.Request, *, timeout: float) -> Response:
    response: Response = urllib.request.urlopen(request, timeout=timeout)  # noqa: S310 - https URLs built from the pins
    return response


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
    return str(token)


def ecr_token(region: str) -> str:
    """ECR's registry credentials in `region` (ecr:GetAuthorizationToken with the caller's AWS
    credentials): base64 `AWS:<password>`, which the registry takes as HTTP Basic."""
    from nvrx_eks.infra.ops.aws import AwsSession, ServiceError, aws_errors  # noqa: PLC0415 - boto3 only for ECR

    try:
        with aws_errors("ecr:GetAuthorizationToken"):
            data = AwsSession(region=region).client("ecr").get_authorization_token()["authorizationData"]
    except ServiceError as error:
        raise UserError(str(error)) from None
    return str(data[0]["authorizationToken"])


def _authorization(
    challenge: str, *, host: str, opener: Opener, scheme: str, ecr: Callable[[str], str]
) -> str:
    """The Authorization header that answers a registry's `WWW-Authenticate` challenge."""
    ecr_host = _ECR_HOST.fullmatch(host)
    if challenge.partition(" ")[0].lower() == "basic" and ecr_host:
        return f"Basic {ecr(ecr_host.group(1))}"
    return f"Bearer {_bearer_token(challenge, opener=opener, scheme=scheme)}"


def registry_digest(
    repository: str,
    tag: str,
    *,
    opener: Opener = _open,
    scheme: str = "https",
    ecr: Callable[[str], str] | None = None,
) -> str:
    """sha256:... of the manifest `repository:tag` names, as the registry serves it (`ecr`: region -> ECR's
    Basic credentials, for a private ECR registry; default `ecr_token`)."""
    host, slash, path = repository.partition("/")
    if not slash or not ("." in host or ":" in host):
        raise UserError(f"image repository {repository!r} must start with its registry (e.g. nvcr.io/...)")
    # Docker Hub's images are named docker.io/..., its registry API answers at registry-1.docker.io.
    host = {"docker.io": "registry-1.docker.io"}.get(host, host)
    url = f"{scheme}://{host}/v2/{path}/manifests/{tag}"
    headers = {"Accept": ", ".join(MANIFEST_TYPES)}
    try:
        response = _get(opener, url, **headers)
    except HTTPError as error:
        if error.code != 401 or "WWW-Authenticate" not in error.headers:  # noqa: PLR2004 - HTTP status
            raise UserError(f"{repository}:{tag}: the registry answered HTTP {error.code}") from None
        authorization = _authorization(
            error.headers["WWW-Authenticate"], host=host, opener=opener, scheme=scheme, ecr=ecr or ecr_token
        )
        try:
            response = _get(opener, url, Authorization=authorization, **headers)
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
    downloads = {"efa_installer_sha256": pins.efa_installer_url, "aws_ofi_nccl_sha256": pins.aws_ofi_nccl_url}
    return _base_digest_and_checksums(pins, downloads, opener=opener, scheme=scheme)


def _offset(lines: list[str], line: int, col: int) -> int:
    # ast columns are UTF-8 byte offsets; pins.py is ASCII, so they are character offsets too.
    return sum(len(text) for text in lines[: line - 1]) + col


def resolve_store(
    pins: StoreImagePins = STORE_IMAGE, *, opener: Opener | None = None, scheme: str = "https"
) -> dict[str, str]:
    """The values `pin` records for the store image's versions: field -> value."""
    downloads = {"torch_sha256": pins.torch_wheel_url}
    return _base_digest_and_checksums(pins, downloads, opener=opener, scheme=scheme)


def _base_digest_and_checksums(
    pins: ImagePins | StoreImagePins, downloads: Mapping[str, str], *, opener: Opener | None, scheme: str
) -> dict[str, str]:
    """`base_digest` of the pins' base image tag, and the sha256 of each download (field -> URL)."""
    opener = opener or _open
    digest = registry_digest(pins.base_repository, pins.base_tag, opener=opener, scheme=scheme)
    return {"base_digest": digest} | {
        field: sha256_of(url, opener=opener) for field, url in downloads.items()
    }


def resolve_charts(
    charts: Mapping[str, ChartPin] = HELM_CHARTS,
    *,
    opener: Opener | None = None,
    scheme: str = "https",
    ecr: Callable[[str], str] | None = None,
) -> dict[ChartImageKey, str]:
    """The digest each chart image's tag names now: (chart, values_key) -> sha256:..."""
    opener = opener or _open
    return {
        (name, image.values_key): registry_digest(
            image.repository, image.tag, opener=opener, scheme=scheme, ecr=ecr
        )
        for name, chart in charts.items()
        for image in chart.images
    }


def rewrite_pins(source: str, values: Mapping[str, str], *, target: str = "IMAGE") -> str:
    """`source` (kitcore/pins.py) with the keyword arguments `values` names in `<target> = ...(...)`
    set to new string literals; every other character unchanged."""
    match _assigned(ast.parse(source), target):
        case ast.Call() as call:
            return _apply(source, _keyword_edits(source, call, values, target))
    raise RuntimeError(f"kitcore/pins.py has no `{target} = ...(...)`")


def _assigned(tree: ast.Module, name: str) -> ast.expr | None:
    """The value a top-level `name = ...` (or `name: T = ...`) assigns."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [name]:
            return node.value
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == name:
            return node.value
    return None


def _chart_image_call(tree: ast.Module, chart: str, values_key: str) -> ast.Call:
    """The `ChartImage(...)` of `values_key` in `HELM_CHARTS[chart]`'s `images`."""
    charts = _assigned(tree, "HELM_CHARTS")
    entries = zip(charts.keys, charts.values, strict=True) if isinstance(charts, ast.Dict) else ()
    for key, pin in entries:
        if not (isinstance(key, ast.Constant) and key.value == chart and isinstance(pin, ast.Call)):
            continue
        images = next((k.value for k in pin.keywords if k.arg == "images"), None)
        for image in images.elts if isinstance(images, ast.Tuple) else []:
            if not isinstance(image, ast.Call):
                continue
            named = {k.arg: k.value for k in image.keywords}.get("values_key")
            if isinstance(named, ast.Constant) and named.value == values_key:
                return image
    raise RuntimeError(
        f"infra/cluster_pins.py HELM_CHARTS[{chart!r}] has no ChartImage(values_key={values_key!r})"
    )


def rewrite_chart_images(source: str, digests: Mapping[ChartImageKey, str]) -> str:
    """`source` (infra/cluster_pins.py) with each named chart image's `digest` set, and its `source`
    naming the registry; every other character unchanged."""
    tree = ast.parse(source)
    calls = [(_chart_image_call(tree, *key), digest) for key, digest in digests.items()]
    edits = [
        edit
        for call, digest in calls
        for edit in _keyword_edits(source, call, {"digest": digest, "source": REGISTRY_SOURCE}, "ChartImage")
    ]
    return _apply(source, edits)


def _keyword_edits(
    source: str, call: ast.Call, values: Mapping[str, str], where: str
) -> list[tuple[int, int, str]]:
    """(start, end, new text) replacing the value of each keyword of `call` that `values` names."""
    keywords = {k.arg: k.value for k in call.keywords}
    missing = [name for name in values if name not in keywords]
    if missing:
        raise RuntimeError(f"the pins' {where} does not set {missing}: add them (any value) first")
    lines = source.splitlines(keepends=True)
    return [
        (
            _offset(lines, node.lineno, node.col_offset),
            _offset(lines, node.end_lineno or node.lineno, node.end_col_offset or 0),
            json.dumps(values[name]),
        )
        for name, node in ((name, keywords[name]) for name in values)
    ]


def _apply(source: str, edits: list[tuple[int, int, str]]) -> str:
    for start, end, text in sorted(edits, reverse=True):
        source = f"{source[:start]}{text}{source[end:]}"
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
    pinned = dataclasses.replace(pins, **values)  # type: ignore[arg-type]  # each a str field of the pins
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


def record_charts(digests: Mapping[ChartImageKey, str], *, pins_file: Path | None = None) -> None:
    """Write each chart image's digest (and the registry as its source) into infra/cluster_pins.py
    HELM_CHARTS."""
    pins_file = pins_file or CLUSTER_PINS_FILE
    pins_file.write_text(rewrite_chart_images(pins_file.read_text(), digests))
