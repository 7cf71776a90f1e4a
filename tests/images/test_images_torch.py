"""One torch release everywhere: the local environment, the training image and the store image all
take kitcore/pins.py TORCH_VERSION (TCPStore, DCP and FSDP2 change between releases)."""

from __future__ import annotations

import re
from importlib import metadata

from nvrx_eks.images.build import (
    DOCKERFILE,
    LOCK_FILE,
    REPO_ROOT,
    STORE_DOCKERFILE,
    TORCH_LOCK_FILE,
    build_args,
    locked_versions,
    store_build_args,
)
from nvrx_eks.kitcore.pins import IMAGE, STORE_IMAGE, TORCH_VERSION
from nvrx_eks.training.node.selfcheck import BAD_NCCL


def _release(version: str) -> str:
    """2.13.0 of 2.13.0+cpu: the local build and PyPI's CUDA build are one release."""
    return version.split("+", 1)[0]


def test_both_images_take_the_one_pin():
    assert IMAGE.torch_version == STORE_IMAGE.torch_version == TORCH_VERSION
    assert build_args(git_revision="x")["TORCH_VERSION"] == TORCH_VERSION
    assert store_build_args(git_revision="x")["TORCH_VERSION"] == TORCH_VERSION
    for dockerfile in (DOCKERFILE, STORE_DOCKERFILE):
        defaults = set(re.findall(r"^ARG TORCH_VERSION=(\S+)$", dockerfile.read_text(), flags=re.MULTILINE))
        assert defaults == {TORCH_VERSION}, dockerfile.name


def test_the_local_environment_runs_the_pinned_release():
    assert _release(metadata.version("torch")) == TORCH_VERSION
    constraints = locked_versions((REPO_ROOT / "constraints.txt").read_text())
    assert _release(constraints["torch"]) == TORCH_VERSION
    # make setup installs the release the pins name, not a number of its own.
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert "torch==$(TORCH_VERSION)" in makefile
    assert not re.search(r"torch==\d", makefile)


def test_the_training_image_locks_the_pinned_torch_with_hashes():
    text = TORCH_LOCK_FILE.read_text()
    versions = locked_versions(text)
    assert versions["torch"] == TORCH_VERSION
    assert len(re.findall(r"--hash=sha256:[0-9a-f]{64}", text)) == len(versions)
    # PyPI's CUDA build brings its own NCCL: outside the range NVRx's in-process restart breaks on.
    nccl = next(v for name, v in versions.items() if name.startswith("nvidia-nccl-"))
    low, high = BAD_NCCL
    assert not low <= tuple(int(p) for p in nccl.split(".")[:3]) <= high, nccl
    # The two locks install one after the other with --no-deps: a package in both has one version.
    rest = locked_versions(LOCK_FILE.read_text())
    assert {n: v for n, v in rest.items() if n in versions} == {n: versions[n] for n in rest if n in versions}


def test_the_torch_lock_holds_what_torch_imports_so_torch_imports_where_it_is_installed():
    # The torch stage imports torch right after installing this lock (its version check): every
    # unconditional requirement of the pinned release (this venv's build of it) must be in it.
    locked = locked_versions(TORCH_LOCK_FILE.read_text()).keys()
    required = {
        re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0].lower()
        for spec in metadata.requires("torch") or []
        if ";" not in spec
    }
    assert required
    assert required <= locked, sorted(required - locked)
