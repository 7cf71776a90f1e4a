"""The kit installs as one package, nvrx_eks: a user's own `training` (or `k8s`, `infra`, ...) package
keeps its name beside it, in their environment and in an image built on the kit's."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SETUPTOOLS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_of_the_kit_is_listed_under_its_mapped_name():
    found = set()
    for package, folder in SETUPTOOLS["package-dir"].items():
        for init in (REPO / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(REPO / folder)
            found.add(".".join([package, *relative.parts]))
    assert found == set(SETUPTOOLS["packages"])
    assert {name.split(".")[0] for name in SETUPTOOLS["packages"]} == {"nvrx_eks"}


def test_a_checkout_on_the_python_path_resolves_the_kit_as_installed(tmp_path):
    """Without the editable install (python -S: no site-packages), a checkout on PYTHONPATH finds
    nvrx_eks.kitcore in its kitcore/ folder, as the installed wheel finds it inside nvrx_eks/."""
    probe = "import nvrx_eks.kitcore.pins as p, training; print(p.__file__); print(training.__file__)"
    (tmp_path / "training").mkdir()
    (tmp_path / "training" / "__init__.py").write_text("")
    done = subprocess.run(
        [
            sys.executable,
            "-S",
            "-c",
            f"import sys; sys.path[:0] = sys.argv[1:3]; {probe}",
            str(tmp_path),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    pins, training = done.stdout.split()
    assert pins == str(REPO / "kitcore" / "pins.py")
    assert training == str(tmp_path / "training" / "__init__.py")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_installing_the_kit_leaves_a_users_own_training_package_intact(tmp_path):
    # The wheel, built from a copy of what pyproject.toml packages (setuptools builds in the source tree).
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for folder in SETUPTOOLS["package-dir"].values():
        shutil.copytree(REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
    subprocess.run(
        [*pip_wheel, "--wheel-dir", str(tmp_path / "dist"), str(source)],
        check=True,
        timeout=240,
    )
    (wheel,) = (tmp_path / "dist").glob("nvrx_eks-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        top = {name.split("/")[0] for name in archive.namelist()}
    assert top == {"nvrx_eks", wheel.name.split("-py3")[0] + ".dist-info"}, top

    # A user's environment: their own `training` package, then the kit installed into it.
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
        timeout=120,
    )
    project = tmp_path / "project"
    (project / "training").mkdir(parents=True)
    (project / "training" / "__init__.py").write_text("OWNER = 'the user'\n")
    probe = (
        "import sys; sys.path[:0] = sys.argv[1:3];"
        "import training, nvrx_eks.kitcore.pins as pins, nvrx_eks;"
        "print(training.OWNER); print(pins.__file__); print(nvrx_eks.__path__)"
    )
    # -S: only the two folders above and the standard library (not this checkout's editable install).
    done = subprocess.run(
        [sys.executable, "-S", "-c", probe, str(project), str(site)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    owner, pins, path = done.stdout.splitlines()
    assert owner == "the user"
    assert pins == str(site / "nvrx_eks" / "kitcore" / "pins.py")
    assert path == str([str(site / "nvrx_eks")])  # an installed kit adds no folder to its path
