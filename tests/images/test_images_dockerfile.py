"""The Dockerfile: lint-clean, its ARG defaults equal kitcore/pins.py, stages keep build tools out."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import fields
from importlib import metadata
from pathlib import Path

import pytest

from nvrx_eks import layout
from nvrx_eks.images.build import (
    BASE_PARTS,
    BUILD_ARG_NAMES,
    DOCKERFILE,
    LOCK_FILE,
    REPO_ROOT,
    TORCH_LOCK_FILE,
    TORCH_PROVIDED,
    build_args,
    locked_versions,
)
from nvrx_eks.images.trainer_requires import TRAINER_REQUIRES
from nvrx_eks.kitcore import pins
from nvrx_eks.kitcore.pins import IMAGE

TEXT = DOCKERFILE.read_text()


def _stages() -> dict[str, str]:
    """Stage name -> its instructions."""
    parts = re.split(r"^FROM \S+ AS (\w+)\s*$", TEXT, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def _arg_defaults(text: str) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)\s*$", text, flags=re.MULTILINE))


def test_hadolint_reports_nothing_and_every_ignore_has_a_reason():
    hadolint = shutil.which("hadolint") or str(Path(__file__).parents[2] / ".venv/bin/hadolint")
    done = subprocess.run(
        [hadolint, "--format", "json", str(DOCKERFILE)], capture_output=True, text=True, check=False
    )
    assert json.loads(done.stdout or "[]") == [], done.stdout
    assert done.returncode == 0
    lines = TEXT.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("# hadolint ignore="):
            reason = lines[i - 1]
            assert reason.startswith("#"), f"line {i + 1}: an ignore needs a reason on the line above"
            assert len(reason) > 40, f"line {i + 1}: the reason is too thin: {reason!r}"


def test_arg_defaults_equal_the_pins_and_the_build_passes_every_pin():
    defaults = _arg_defaults(TEXT)
    args = build_args(git_revision="abc123")
    assert {f.name for f in fields(IMAGE)} - BASE_PARTS | {"base_image"} == BUILD_ARG_NAMES.keys()
    for name, arg in BUILD_ARG_NAMES.items():
        assert args[arg] == str(getattr(IMAGE, name))
        assert defaults[arg] == args[arg], f"Dockerfile ARG {arg} default != kitcore/pins.py IMAGE.{name}"
    assert args["GIT_REVISION"] == "abc123"
    # Every ARG the Dockerfile declares is one the build sets (none silently left at a default).
    declared = set(re.findall(r"^ARG (\w+)", TEXT, flags=re.MULTILINE))
    assert declared - args.keys() == {"SOURCE_URL", "ACCELERATOR", "REQUIREMENTS_LOCK"}
    # ACCELERATOR and REQUIREMENTS_LOCK are the build's variant, not pins: their defaults are the shipped
    # image's (the local image check alone passes others).
    assert _arg_defaults(TEXT)["ACCELERATOR"] == "cuda"
    assert _arg_defaults(TEXT)["REQUIREMENTS_LOCK"] == "images/requirements.lock"


def test_stage_arg_defaults_agree_with_each_other():
    seen: dict[str, str] = {}
    for stage, body in _stages().items():
        for arg, value in _arg_defaults(body).items():
            assert seen.setdefault(arg, value) == value, f"{stage}: ARG {arg} default differs between stages"


def test_build_tools_stay_out_of_the_runtime_stage():
    stages = _stages()
    assert list(stages) == [
        "torch_cuda",
        "torch_cpu",
        "torch",
        "wheel",
        "ofi",
        "efa_cuda",
        "efa_cpu",
        "runtime",
    ]
    # The runtime stands on the EFA stage of the build's variant, which stands on its torch stage.
    assert re.search(r"^FROM efa_\$\{ACCELERATOR\} AS runtime$", TEXT, flags=re.MULTILINE)
    assert re.search(r"^FROM torch_\$\{ACCELERATOR\} AS torch$", TEXT, flags=re.MULTILINE)
    for stage in ("runtime", "efa_cuda", "efa_cpu"):
        assert not re.search(
            r"\b(autoconf|automake|libtool|build-essential|make -j|g\+\+|gcc|[\w.-]+-dev)\b", stages[stage]
        ), stage
    assert "apt-get install" not in stages["runtime"]
    # What the EFA stage installs by apt is the plugin's runtime libraries alone, by name.
    installed = re.findall(r"apt-get install -y --no-install-recommends ([^\\&]+)", stages["efa_cuda"])
    assert [packages.split() for packages in installed] == [["libhwloc15"]]
    assert "COPY --from=ofi /opt/aws-ofi-nccl /opt/aws-ofi-nccl" in stages["efa_cuda"]
    assert "--enable-platform-aws" in stages["ofi"]
    # The shipped base is CUDA's runtime image; the plugin's stage adds the headers it compiles with.
    assert "-runtime-" in IMAGE.base_tag
    assert re.search(r"cuda-cudart-dev-\$\{cuda\}", stages["ofi"])
    # The shipped torch is the locked one, with hashes; the local variant only checks its base's.
    assert "--require-hashes --no-deps -r /tmp/torch-requirements.lock" in stages["torch_cuda"]
    assert "pip install" not in stages["torch_cpu"]


def test_the_build_fails_naming_a_library_the_plugin_cannot_load():
    """libfabric or libhwloc missing would leave NCCL on TCP sockets with one warning: the image's
    build resolves every library the plugin links, after it is in place, and stops otherwise."""
    efa = _stages()["efa_cuda"]
    check = efa[efa.index("COPY --from=ofi") :]
    assert "ldd /opt/aws-ofi-nccl/lib/libnccl-net-ofi.so" in check
    assert "LD_LIBRARY_PATH=/opt/aws-ofi-nccl/lib:/opt/amazon/efa/lib" in check
    assert "grep 'not found'" in check
    assert "exit 1" in check


def test_locked_dependencies_install_before_the_source():
    runtime = _stages()["runtime"]
    lock_at = runtime.index("COPY ${REQUIREMENTS_LOCK} /tmp/requirements.lock")
    source_at = runtime.index("COPY --from=wheel")
    assert lock_at < source_at
    assert "--require-hashes --no-deps -r /tmp/requirements.lock" in runtime


def test_labels_carry_versions_and_source_revision():
    runtime = _stages()["runtime"]
    for label in (
        'org.opencontainers.image.revision="${GIT_REVISION}"',
        'org.opencontainers.image.base.name="${BASE_IMAGE}"',
        'io.nvrx-eks.nvrx-version="${NVRX_VERSION}"',
        'io.nvrx-eks.efa-installer="${EFA_INSTALLER_VERSION}"',
        'io.nvrx-eks.aws-ofi-nccl="${AWS_OFI_NCCL_VERSION}"',
    ):
        assert label in runtime
    assert "NVRX_EKS_NVRX_VERSION=${NVRX_VERSION}" in runtime


def test_lock_pins_nvrx_at_the_image_pin_with_hashes_and_leaves_the_base_alone():
    text = LOCK_FILE.read_text()
    versions = locked_versions(text)
    assert versions["nvidia-resiliency-ext"] == IMAGE.nvrx_version
    for base_owned in ("torch", "numpy", "triton", "nvidia-nccl-cu12"):
        assert base_owned not in versions
    requirements = [line for line in text.splitlines() if re.match(r"^[a-z0-9]", line)]
    hashes = re.findall(r"--hash=sha256:[0-9a-f]{64}", text)
    assert len(requirements) == len(hashes) == len(versions) > 10
    # Everything the trainer imports in the image is locked.
    for name in ("pydantic", "pyyaml", "typer", "rich", "prometheus-client", "boto3"):
        assert name in versions, name


@pytest.mark.parametrize("python_abi", ["cp311", "cp312"])
def test_the_base_check_in_the_dockerfile_refuses_a_base_nvrx_cannot_install_on(python_abi, tmp_path):
    # The script the runtime stage runs, with the arguments it passes (podman's builder here has no
    # RUN heredocs, so the check is a file).
    runtime = _stages()["runtime"]
    assert 'python /tmp/check_base.py "${PYTHON_ABI}" "${MIN_GLIBC}" "${NVRX_VERSION}"' in runtime
    script = DOCKERFILE.parent / "check_base.py"
    done = subprocess.run(
        [sys.executable, str(script), python_abi, "2.36", IMAGE.nvrx_version],
        capture_output=True,
        text=True,
        check=False,
    )
    # This machine: cp311 on Debian 12 (glibc 2.36). The check passes only for the matching ABI.
    here = f"cp{sys.version_info.major}{sys.version_info.minor}"
    if python_abi == here:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode == 1
        assert f"needs {python_abi} / glibc >= 2.36" in done.stderr


FETCH = DOCKERFILE.parent / "fetch-verified.sh"
INSTALL_EFA = DOCKERFILE.parent / "install-efa.sh"


def test_every_download_goes_through_the_checksum_script():
    # No unverified fetch left: nothing calls curl directly or pipes a download into tar.
    assert not re.search(r"(RUN|&&)\s+curl\s", TEXT)
    assert "| tar" not in TEXT
    for stage in ("ofi", "efa_cuda"):  # both install EFA through the one script, which fetches verified
        body = _stages()[stage]
        assert "source=images/fetch-verified.sh,target=/usr/local/bin/fetch-verified" in body
        assert "source=images/install-efa.sh,target=/usr/local/bin/install-efa" in body
        assert 'install-efa "${EFA_INSTALLER_VERSION}" "${EFA_INSTALLER_SHA256}"' in body
    efa = INSTALL_EFA.read_text(encoding="utf-8")
    assert not re.search(r"^\s*curl\s", efa, re.MULTILINE)
    assert (
        f'fetch-verified "{IMAGE.efa_installer_url.replace(IMAGE.efa_installer, "$1")}" "$2" /tmp/efa.tar.gz'
        in efa
    )
    assert "--skip-kmod" in efa  # the kernel module is the node's
    assert '"${AWS_OFI_NCCL_SHA256}" /tmp/ofi.tar.gz' in _stages()["ofi"]
    # The base is pinned by tag and digest in the pins and in the Dockerfile's default.
    assert IMAGE.base_image == f"{IMAGE.base_repository}:{IMAGE.base_tag}@{IMAGE.base_digest}"
    assert re.fullmatch(r"[^@]+:[^@/]+@sha256:[0-9a-f]{64}", IMAGE.base_image)
    assert _arg_defaults(TEXT)["BASE_IMAGE"] == IMAGE.base_image
    # Each tarball from the URL the pins name (what `nvrx-eks image pin` hashes).
    templated = IMAGE.aws_ofi_nccl_url.replace(IMAGE.aws_ofi_nccl, "${AWS_OFI_NCCL_VERSION}")
    assert f'"{templated}"' in TEXT


def _fetch(tmp_path: Path, sha256: str) -> subprocess.CompletedProcess[str]:
    source = tmp_path / "tarball.tar.gz"
    if not source.exists():
        source.write_bytes(b"not really a tarball, but bytes with a checksum\n")
    return subprocess.run(
        ["bash", str(FETCH), source.as_uri(), sha256, str(tmp_path / "out.tar.gz")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_fetch_verified_accepts_the_right_checksum_and_refuses_others(tmp_path):
    import hashlib  # noqa: PLC0415

    first = _fetch(tmp_path, "0" * 64)  # writes the source; wrong sum
    assert first.returncode == 1
    assert "sha256" in first.stderr
    assert "!= pinned 0000" in first.stderr
    assert not (tmp_path / "out.tar.gz").exists()  # a mismatch leaves nothing to unpack
    right = hashlib.sha256((tmp_path / "tarball.tar.gz").read_bytes()).hexdigest()
    ok = _fetch(tmp_path, right)
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "out.tar.gz").read_bytes() == (tmp_path / "tarball.tar.gz").read_bytes()


def test_fetch_verified_refuses_the_placeholder_without_downloading(tmp_path):
    done = _fetch(tmp_path, pins.UNPUBLISHED_SHA256)
    assert done.returncode == 1
    assert "its pinned sha256 is 'unpublished', not a checksum" in done.stderr
    # It names the command that records the checksum, and only files that exist.
    assert "run 'nvrx-eks image pin'" in done.stderr
    for path in re.findall(r"[\w/.-]+\.(?:py|sh|md)\b", done.stderr):
        assert (REPO_ROOT / path).exists(), f"the message names {path}, which does not exist"
    assert not (tmp_path / "out.tar.gz").exists()


def test_the_image_runs_as_the_pinned_non_root_user():
    runtime = _stages()["runtime"]
    assert _arg_defaults(runtime)["TRAINER_UID"] == str(pins.TRAINER_UID) == str(IMAGE.trainer_uid)
    assert '--uid "${TRAINER_UID}"' in runtime
    # The last USER is the trainer's, and it comes after every RUN (nothing after it needs root).
    users = re.findall(r"^USER (\S+)$", runtime, flags=re.MULTILINE)
    assert users == ["${TRAINER_UID}:${TRAINER_UID}"]
    assert runtime.rindex("\nRUN ") < runtime.index("\nUSER ")


def test_the_image_carries_only_the_trainer_and_the_core_below_it():
    # The layer contract (tests/test_layers.py) keeps the trainer's imports inside these two packages.
    copied = [line.split()[1] for line in _stages()["wheel"].splitlines() if line.startswith("COPY ")]
    assert copied == ["pyproject.toml", "nvrx_eks/__init__.py", "kitcore/", "training/"]


def _imported_top_names(package: Path) -> dict[str, Path]:
    """Every top-level module a package's files import, lazy imports inside functions included."""
    names: dict[str, Path] = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found = [node.module]
            else:
                continue
            for name in found:
                names.setdefault(name.split(".")[0], path)
    return names


def test_every_import_of_the_copied_code_is_installed_by_the_image():
    """The image installs the base's packages and the lock, nothing else: an offline tool (a report
    drawing with matplotlib, a benchmark) left among the copied packages fails here, not on a node."""
    locked = locked_versions(LOCK_FILE.read_text()).keys()
    distributions = metadata.packages_distributions()
    missing = {}
    for package in ("training", "kitcore"):
        for name, path in _imported_top_names(REPO_ROOT / package).items():
            if name in sys.stdlib_module_names or name == "nvrx_eks":
                continue
            dists = {d.lower().replace("_", "-") for d in distributions.get(name, [])}
            if not dists or not any(d in locked or TORCH_PROVIDED.match(d) for d in dists):
                missing[name] = str(path.relative_to(REPO_ROOT))
    assert missing == {}


def test_the_trainer_wheel_declares_only_what_the_image_installs(tmp_path):
    # The wheel stage's cut of pyproject.toml: what stays is TRAINER_REQUIRES at pyproject's ranges, each
    # installed by one of the image's locks, so `pip check` in the image is clean.
    assert "python /tmp/trainer_requires.py pyproject.toml" in _stages()["wheel"]
    target = tmp_path / "pyproject.toml"
    target.write_text((REPO_ROOT / "pyproject.toml").read_text())
    script = REPO_ROOT / "images" / "trainer_requires.py"
    subprocess.run([sys.executable, str(script), str(target)], check=True, timeout=30)
    project = tomllib.loads(target.read_text())["project"]
    names = {re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0].lower() for spec in project["dependencies"]}
    assert names == set(TRAINER_REQUIRES)
    locked = locked_versions(LOCK_FILE.read_text()) | locked_versions(TORCH_LOCK_FILE.read_text())
    assert names <= locked.keys()
    # The wheel maps the parts the stage copied, under the kit's one name; nothing else changes.
    mapped = tomllib.loads(target.read_text())["tool"]["setuptools"]["package-dir"]
    assert mapped == {"nvrx_eks": "nvrx_eks", "nvrx_eks.kitcore": "kitcore", "nvrx_eks.training": "training"}
    assert project["name"] == "nvrx-eks"
    # setup.py derives the packages from that table, over exactly what the stage copies.
    assert "COPY pyproject.toml setup.py ./" in _stages()["wheel"]
    tree = tmp_path / "stage"
    for folder in ("kitcore", "training"):
        shutil.copytree(REPO_ROOT / folder, tree / folder, ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "nvrx_eks").mkdir()
    for name in ("__init__.py", "layout.py"):
        shutil.copy(REPO_ROOT / "nvrx_eks" / name, tree / "nvrx_eks" / name)
    shutil.copy(target, tree / "pyproject.toml")
    packages = layout.packages(tree)
    assert packages[:2] == ["nvrx_eks", "nvrx_eks.kitcore"]
    assert {p.split(".")[1] for p in packages[1:]} == {"kitcore", "training"}
    assert "nvrx_eks.training.resilience" in packages


def test_the_cut_never_writes_through_a_hard_link_to_the_checkout(tmp_path):
    # A builder may give the build a hard link to the context's file: the cut replaces the name only.
    original = tmp_path / "checkout-pyproject.toml"
    original.write_text((REPO_ROOT / "pyproject.toml").read_text())
    linked = tmp_path / "pyproject.toml"
    linked.hardlink_to(original)
    subprocess.run([sys.executable, str(DOCKERFILE.parent / "trainer_requires.py"), str(linked)], check=True)
    assert original.read_text() == (REPO_ROOT / "pyproject.toml").read_text()
    assert "aws-cdk-lib" not in linked.read_text()
