"""Command lines that build, lock and push the training image (docker or finch).

Everything here returns argv lists; `images/commands.py` runs them. Versions come only from
kitcore/pins.py (passed as build args), the tag only from the images' inputs (infra/revision.py), and
the registry only from the stack output `ImageRepositoryUri` (or an explicit URI), so nothing is typed twice.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nvrx_eks.infra.revision import source_revision
from nvrx_eks.k8s.names import STORE_IMAGE_TAG_SUFFIX
from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.kitcore.pins import IMAGE, STORE_IMAGE, ImagePins, StoreImagePins

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = Path(__file__).resolve().parent / "Dockerfile"
LOCK_FILE = Path(__file__).resolve().parent / "requirements.lock"
TORCH_LOCK_FILE = Path(__file__).resolve().parent / "torch-requirements.lock"
STORE_DOCKERFILE = Path(__file__).resolve().parent / "store.Dockerfile"
STORE_LOCK_FILE = Path(__file__).resolve().parent / "store-requirements.lock"
USER_DOCKERFILE = Path(__file__).resolve().parent / "user.Dockerfile"
"""A training project's image on the kit's (`nvrx-eks image build --project`)."""
STORE_TAG_SUFFIX = STORE_IMAGE_TAG_SUFFIX
ENGINES = ("docker", "finch", "podman")
DEFAULT_NAME = "nvrx-eks-training"
# The GPU instance types in kitcore/profiles.py are all x86_64.
PLATFORM = "linux/amd64"

# ImagePins attribute -> Dockerfile ARG. A new pin without an ARG fails tests/images. The base's
# repository, tag and digest reach the Dockerfile as one reference, `base_image`.
BASE_PARTS = frozenset({"base_repository", "base_tag", "base_digest"})
BUILD_ARG_NAMES: dict[str, str] = {
    "base_image": "BASE_IMAGE",
    "nvrx_version": "NVRX_VERSION",
    "torch_version": "TORCH_VERSION",
    "efa_installer": "EFA_INSTALLER_VERSION",
    "aws_ofi_nccl": "AWS_OFI_NCCL_VERSION",
    "efa_installer_sha256": "EFA_INSTALLER_SHA256",
    "aws_ofi_nccl_sha256": "AWS_OFI_NCCL_SHA256",
    "python_abi": "PYTHON_ABI",
    "min_glibc": "MIN_GLIBC",
    "trainer_uid": "TRAINER_UID",
}
# StoreImagePins attribute -> store.Dockerfile ARG (the base again as one reference).
STORE_BUILD_ARG_NAMES: dict[str, str] = {
    "base_image": "BASE_IMAGE",
    "torch_version": "TORCH_VERSION",
    "torch_sha256": "TORCH_SHA256",
    "nvrx_version": "NVRX_VERSION",
    "python_abi": "PYTHON_ABI",
}
# What the trainer imports beyond torch and numpy (images/torch-requirements.lock), with the ranges
# pyproject.toml tests; NVRx is pinned exactly from kitcore/pins.py.
IMAGE_DEPENDENCIES = ("pydantic", "pyyaml", "typer", "rich", "prometheus-client", "boto3")

# Installed from images/torch-requirements.lock (torch, what it pulls, numpy): never in requirements.lock.
TORCH_PROVIDED = re.compile(
    r"^(torch|triton|numpy|setuptools|sympy|mpmath|networkx|jinja2|markupsafe|fsspec|filelock|typing-extensions|"
    r"cuda-.*|nvidia-(?!resiliency-ext$|ml-py$).*)$"
)
_ECR_URI = re.compile(
    r"^(?P<registry>\d{12}\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com(\.cn)?)/(?P<repo>[a-z0-9._/-]+)$"
)
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
# The OCI distribution spec's repository name: lower-case path components joined by `/`, each
# alphanumerics with `.`, `_`, `__` or dashes between; a registry host (with a port) may come first.
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY = re.compile(rf"^(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
MAX_IMAGE_NAME = 255
"""Registries (ECR, Docker Hub) refuse a longer repository name, host included."""


def build_args(
    *,
    git_revision: str,
    pins: ImagePins | StoreImagePins = IMAGE,
    arg_names: Mapping[str, str] = BUILD_ARG_NAMES,
) -> dict[str, str]:
    """Every Dockerfile ARG the build sets: all pins (each needs an ARG in `arg_names`), and the source
    revision for the labels."""
    missing = {f.name for f in fields(pins)} - BASE_PARTS - arg_names.keys()
    if missing:
        raise RuntimeError(f"{type(pins).__name__} without a Dockerfile ARG: {sorted(missing)}")
    args = {arg: str(getattr(pins, name)) for name, arg in arg_names.items()}
    args["GIT_REVISION"] = git_revision
    return args


def store_build_args(*, git_revision: str, pins: StoreImagePins = STORE_IMAGE) -> dict[str, str]:
    """Every store.Dockerfile ARG the build sets."""
    return build_args(git_revision=git_revision, pins=pins, arg_names=STORE_BUILD_ARG_NAMES)


_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
MAX_IMAGE_NAME = 255
"""Registries (ECR, Docker Hub) refuse a longer repository name, host included."""


def check_verifiable(pins: ImagePins = IMAGE, store: StoreImagePins = STORE_IMAGE) -> None:
    """Refuse a build whose bases are not pinned by digest or whose downloads have no checksum."""
    problems = []
    for prefix, pinned, checksums in (
        ("", pins, ("efa_installer_sha256", "aws_ofi_nccl_sha256")),
        ("STORE_IMAGE.", store, ("torch_sha256",)),
    ):
        if not _DIGEST.match(pinned.base_digest):
            problems.append(f"{prefix}base_digest is {pinned.base_digest!r}, not sha256:<64 hex digits>")
        for name in checksums:
            value = getattr(pinned, name)
            if not _SHA256.match(value):
                problems.append(f"{prefix}{name} is {value!r}, not a sha256")
    if problems:
        raise UserError(
            "the images would install unverified downloads ("
            + "; ".join(problems)
            + "). Run `nvrx-eks image pin` once on a machine with internet: it downloads the EFA "
            "installer and aws-ofi-nccl tarballs and the store's torch wheel, asks the registries for the "
            "base images' digests and records them in kitcore/pins.py; then commit it and build again"
        )


def git_revision(root: Path = REPO_ROOT) -> str:
    """The tag for an image built from `root`: the short commit, `-dirty` when the tree has changes."""
    revision = source_revision(root)
    if revision is None:
        raise UserError(
            f"{root} is not a git checkout with a commit: the image tag comes from the git revision "
            "(commit first, or pass --tag)"
        )
    return revision


def check_tag(tag: str) -> str:
    if not _TAG.match(tag):
        raise UserError(f"tag {tag!r} is not a valid image tag (letters, digits, '_', '.', '-'; <= 128)")
    return tag


def find_engine(preferred: str | None = None) -> str:
    """The container engine to run: the one asked for, else the first of ENGINES on PATH."""
    candidates = (preferred,) if preferred else ENGINES
    for engine in candidates:
        if engine not in ENGINES:
            raise UserError(f"engine {engine!r} is not supported; use one of: {', '.join(ENGINES)}")
        if shutil.which(engine):
            return engine
    raise UserError(
        f"no container engine found ({' or '.join(candidates)} on PATH): install Docker, Finch or Podman, "
        "or build on a machine that has one"
    )


def build_argv(
    *,
    engine: str,
    image: str,
    args: dict[str, str],
    dockerfile: Path = DOCKERFILE,
    context: Path = REPO_ROOT,
    platform: str = PLATFORM,
) -> list[str]:
    """`<engine> build` with every build arg, for `platform`, tagged `image` (name:tag)."""
    argv = [engine, "build", "--file", str(dockerfile), "--platform", platform, "--tag", image]
    if engine == "podman":
        # Podman writes OCI images by default, which have no SHELL: the Dockerfiles' `pipefail` would be
        # dropped with a warning. Docker's format keeps it.
        argv += ["--format", "docker"]
    for key, value in sorted(args.items()):
        argv += ["--build-arg", f"{key}={value}"]
    return [*argv, str(context)]


def parse_repository_uri(uri: str) -> tuple[str, str]:
    """(registry, repository) of an ECR repository URI; anything else is a UserError."""
    match = _ECR_URI.match(uri)
    if not match:
        raise UserError(
            f"{uri!r} is not an ECR repository URI (ACCOUNT.dkr.ecr.REGION.amazonaws.com/NAME); "
            "take it from the stack output ImageRepositoryUri"
        )
    return match["registry"], match["repo"]


def push_argvs(*, engine: str, local_image: str, repository_uri: str, tag: str) -> list[list[str]]:
    """Tag the local build with the ECR name and push it (after `login_argv`)."""
    parse_repository_uri(repository_uri)
    remote = f"{repository_uri}:{tag}"
    return [[engine, "tag", local_image, remote], [engine, "push", remote]]


def pushed_digest(ecr_client: Any, repository_uri: str, tag: str) -> str:  # noqa: ANN401 - boto3 clients are dynamic
    """The digest the repository's `tag` names (ecr:DescribeImages), e.g. right after the push."""
    registry, repository = parse_repository_uri(repository_uri)
    details = ecr_client.describe_images(
        registryId=registry.split(".", 1)[0], repositoryName=repository, imageIds=[{"imageTag": tag}]
    )["imageDetails"]
    if not details:
        raise UserError(f"{repository_uri}:{tag} is not in the repository after the push")
    return str(details[0]["imageDigest"])


def login_argv(*, engine: str, registry: str) -> list[str]:
    """`<engine> login` reading the ECR password from stdin (never on the command line)."""
    return [engine, "login", "--username", "AWS", "--password-stdin", registry]


def ecr_password(ecr_client: Any, registry: str) -> str:  # noqa: ANN401 - boto3 clients are dynamic
    """The registry password from ecr:GetAuthorizationToken (the token is base64 `AWS:<password>`)."""
    account = registry.split(".", 1)[0]
    data = ecr_client.get_authorization_token(registryIds=[account])["authorizationData"][0]
    user, _, password = base64.b64decode(data["authorizationToken"]).decode().partition(":")
    if user != "AWS" or not password:
        raise UserError(f"ECR returned an unexpected authorization token for {registry}")
    return password


def image_requirements(
    *, pins: ImagePins = IMAGE, pyproject: Path = REPO_ROOT / "pyproject.toml"
) -> list[str]:
    """What the locks resolve: torch and NVRx at the pins, numpy (the trainer's data path imports it)
    and the trainer's dependencies at pyproject's ranges."""
    declared = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    by_name = {re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0].lower(): spec for spec in declared}
    missing = [name for name in IMAGE_DEPENDENCIES if name not in by_name]
    if missing:
        raise RuntimeError(f"image dependencies not declared in pyproject.toml: {missing}")
    return [
        f"torch=={pins.torch_version}",
        "numpy",
        f"nvidia-resiliency-ext=={pins.nvrx_version}",
        *(by_name[n] for n in IMAGE_DEPENDENCIES),
    ]


def lock_argv(*, python: str, requirements: Iterable[str], pins: ImagePins = IMAGE) -> list[str]:
    """Resolve `requirements` for the image's Python and platform with this machine's pip. The image
    starts from a CUDA base without Python packages (everything comes from the two locks), so the base
    has nothing to say; `--isolated` keeps this machine's pip configuration (local indexes, constraints)
    out. pip's JSON report (stdout) lists exactly what the image installs."""
    abi = pins.python_abi.removeprefix("cp")
    glibc_minor = int(pins.min_glibc.split(".")[1])
    # manylinux_2_39 means "glibc 2.39 or older": pip takes the platforms literally, so list them all.
    platforms = [f"manylinux_2_{minor}_x86_64" for minor in range(glibc_minor, 16, -1)]
    platforms += ["manylinux2014_x86_64", "linux_x86_64"]
    return [
        python, "-m", "pip", "--isolated", "install", "--dry-run", "--quiet", "--ignore-installed",
        "--only-binary=:all:", "--implementation", "cp", "--python-version", f"{abi[0]}.{abi[1:]}",
        *(arg for platform in platforms for arg in ("--platform", platform)),
        "--report", "-", *requirements,
    ]  # fmt: skip


STORE_PROVIDED = re.compile(r"^torch$")
"""The store image installs torch from its checksummed CPU wheel, not from the lock."""


def render_lock(
    report: dict[str, Any], *, header: str = "", provided: re.Pattern[str] = TORCH_PROVIDED
) -> str:
    """A `--require-hashes` requirements file from a pip installation report, without what the image
    gets otherwise (`provided`)."""
    lines = [header.rstrip()] if header else []
    for item in sorted(report["install"], key=lambda i: i["metadata"]["name"].lower()):
        name = item["metadata"]["name"].lower().replace("_", "-")
        if provided.match(name):
            continue
        sha = item["download_info"].get("archive_info", {}).get("hashes", {}).get("sha256")
        if not sha:
            raise UserError(
                f"pip resolved {name} without a sha256 (not from an index archive); cannot lock it"
            )
        lines.append(f"{name}=={item['metadata']['version']} \\\n    --hash=sha256:{sha}")
    return "\n".join(lines) + "\n"


def lock_header(*, pins: ImagePins = IMAGE) -> str:
    return (
        "# The training image's Python dependencies beyond torch (images/torch-requirements.lock), with\n"
        "# hashes. Generated by `nvrx-eks image lock` (pip's resolver for the image's Python and\n"
        "# platform); do not edit by hand.\n"
        f"# base: {pins.base_image}  nvrx: {pins.nvrx_version}  abi: {pins.python_abi}\n"
    )


def torch_lock_header(*, pins: ImagePins = IMAGE) -> str:
    return (
        "# torch (PyPI's CUDA build, its CUDA libraries as pip packages), what it pulls and numpy, for\n"
        "# the training image, with hashes. Generated by `nvrx-eks image lock` (pip's resolver for the\n"
        "# image's Python and platform); do not edit by hand.\n"
        f"# torch: {pins.torch_version}  abi: {pins.python_abi}  min glibc: {pins.min_glibc}\n"
    )


NOT_TORCH = re.compile(f"^(?!{TORCH_PROVIDED.pattern[1:-1]}$)")
"""What the torch lock leaves out: everything but torch, what it pulls and numpy."""


def parse_report(stdout: str) -> dict[str, Any]:
    try:
        report: dict[str, Any] = json.loads(stdout)
    except json.JSONDecodeError:
        raise UserError(
            "pip did not print an installation report (is the base image's pip >= 23.0?)"
        ) from None
    if "install" not in report:
        raise UserError("pip's report has no 'install' list")
    return report


def locked_versions(text: str) -> dict[str, str]:
    """name -> version of a lock file (for checks against the pins)."""
    return dict(re.findall(r"^([a-z0-9][a-z0-9._-]*)==([^\s\\]+)", text, flags=re.MULTILINE))


def check_image_name(name: str, *, option: str = "--name") -> str:
    """`name` when it is a valid image repository name (registry host optional), else a UserError."""
    if len(name) > MAX_IMAGE_NAME or not _REPOSITORY.match(name):
        raise UserError(
            f"{option} {name!r} is not an image name: lower-case letters, digits and '.', '_', '-' "
            "between them, path components joined by '/' (e.g. my-training)"
        )
    return name


def check_kit_image(reference: str) -> str:
    """`reference` when it names one build of the kit's image: NAME:TAG (a local build), or
    [NAME[:TAG]]@sha256:DIGEST (a pushed one). A bare name is refused: it would mean whichever image
    `latest` names on the day of the build."""
    name, _, digest = reference.partition("@")
    name, _, tag = name.rpartition(":") if ":" in name.rsplit("/", 1)[-1] else (name, "", "")
    problems = [
        *(["the name"] if not _REPOSITORY.match(name) else []),
        *(["the tag"] if tag and not _TAG.match(tag) else []),
        *(["the digest (sha256: and 64 hex digits)"] if digest and not _DIGEST.match(digest) else []),
    ]
    if problems or not (tag or digest):
        why = f"{' and '.join(problems)} is not valid" if problems else "it names no tag or digest"
        raise UserError(
            f"--base {reference!r}: {why}; give the kit's training image by digest, as "
            "`nvrx-eks image push` prints it (REPOSITORY:TAG@sha256:...), or a local NAME:TAG from "
            "`nvrx-eks image build`"
        )
    return reference


def project_problems(project: Path) -> list[str]:
    """What keeps `project` (a training project's folder, the build context) from building on the kit's
    image, each a sentence with the fix."""
    problems = []
    if not (project / "requirements.txt").is_file():
        problems.append(
            f"{project} has no requirements.txt: add one listing the project's own dependencies "
            "(empty when it has none; the kit's image already has torch and NVRx)"
        )
    if (project / "nvrx_eks").exists():
        problems.append(
            f"{project / 'nvrx_eks'} would shadow the kit's own package (nvrx_eks) in the image: rename it"
        )
    return problems


def user_build_args(*, kit_image: str, pins: ImagePins = IMAGE) -> dict[str, str]:
    """images/user.Dockerfile's build args: the kit's image to build on and its trainer's uid."""
    return {"KIT_IMAGE": check_kit_image(kit_image), "TRAINER_UID": str(pins.trainer_uid)}


def default_project_image_name(project: Path) -> str:
    """The image name for a project folder: its name in lower case, other characters as '-'."""
    name = re.sub(r"[^a-z0-9]+", "-", project.resolve().name.lower()).strip("-")
    return name or "training"
