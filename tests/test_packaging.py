"""The kit installs as one package, nvrx_eks: a user's own `training` (or `k8s`, `infra`, ...) package
keeps its name beside it, in their environment and in an image built on the kit's."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from nvrx_eks import layout

REPO = Path(__file__).resolve().parents[1]
SETUPTOOLS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
LEAKS = ("nvrx_eks.tests", "nvrx_eks.examples.hf_llama", "nvrx_eks.nvrx_eks.kitcore.pins", "nvrx_eks.build")
"""Folders of a checkout that are no part of the kit, and a second copy of a part: none may import."""
LEAK_PROBE = (
    "import importlib, sys\n"
    "for name in sys.argv[1:]:\n"
    "    try:\n"
    "        importlib.import_module(name)\n"
    "    except ImportError:\n"
    "        continue\n"
    "    print('imports:', name)\n"
)


def test_the_layout_is_declared_once_and_every_package_derives_from_it():
    """pyproject.toml's package-dir is the one declaration: no package list beside it; setup.py, the
    checkout finder and the static tools all read it (nvrx_eks/layout.py)."""
    assert "packages" not in SETUPTOOLS
    assert "_LAYOUT.packages(" in (REPO / "setup.py").read_text()
    found = layout.packages(REPO)
    for package, folder in SETUPTOOLS["package-dir"].items():
        for init in (REPO / folder).rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                assert ".".join([package, *init.parent.relative_to(REPO / folder).parts]) in found
    assert {name.split(".")[0] for name in found} == {"nvrx_eks"}
    assert "nvrx_eks.k8s.values" in found  # the data the CLI defaults to ships beside its modules


def test_a_mapped_folder_that_is_no_package_is_refused(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools.package-dir]\n"nvrx_eks.gone" = "gone"\n')
    with pytest.raises(FileNotFoundError, match=r"maps nvrx_eks\.gone to gone/, which holds no __init__\.py"):
        layout.packages(tmp_path)


def test_no_folder_of_the_checkout_leaks_in_as_a_part_of_the_kit():
    """This environment's install (editable, from this checkout) imports the kit's parts and nothing
    else of the checkout under the kit's name."""
    done = subprocess.run(
        [sys.executable, "-c", LEAK_PROBE, "nvrx_eks.kitcore.pins", *LEAKS],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.splitlines() == ["imports: nvrx_eks.kitcore.pins"]


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
    leaks = subprocess.run(
        [
            *(sys.executable, "-S", "-c", f"import sys; sys.path[:0] = [sys.argv.pop(1)]\n{LEAK_PROBE}"),
            *(str(REPO), "nvrx_eks.kitcore.pins", *LEAKS),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert leaks.stdout.splitlines() == ["imports: nvrx_eks.kitcore.pins"]


def test_the_cli_finds_its_default_files_from_any_folder(nvrx_eks, tmp_path):
    """Run from a folder outside the checkout: the defaults are the kit's own files (package data),
    and a values file given by path renders."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    helped = nvrx_eks("demo", "--help", timeout=120, cwd=outside)
    assert helped.returncode == 0, helped.stderr
    default = REPO / "k8s" / "values" / "local-cpu.yaml"
    assert str(default) in re.sub(r"\s+", "", re.sub(r"[│╭╮╰╯─]", " ", helped.stdout)), helped.stdout
    shutil.copy(default, outside / "job.yaml")
    rendered = nvrx_eks("job", "render", "-f", "job.yaml", "-o", "dist", timeout=180, cwd=outside)
    assert rendered.returncode == 0, rendered.stderr
    assert (outside / "dist" / "nvrx-local.k8s.yaml").is_file()


@pytest.mark.slow
@pytest.mark.shareable
@pytest.mark.timeout(300)
def test_installing_the_kit_leaves_a_users_own_training_package_intact(tmp_path):
    # The wheel, built from a copy of what pyproject.toml packages (setuptools builds in the source tree).
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
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

    # The installed kit's command, from a folder that is no checkout: its defaults are its own files.
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "COLUMNS": "400"}
    env["PATH"] = os.pathsep.join([str(REPO / "node_modules" / ".bin"), env.get("PATH", "")])
    kit = functools.partial(
        subprocess.run, cwd=outside, env=env, capture_output=True, text=True, timeout=180, check=False
    )
    helped = kit([sys.executable, "-m", "nvrx_eks", "demo", "--help"])
    assert helped.returncode == 0, helped.stderr
    assert str(site / "nvrx_eks" / "k8s" / "values" / "local-cpu.yaml") in helped.stdout
    shutil.copy(site / "nvrx_eks" / "k8s" / "values" / "local-cpu.yaml", outside / "job.yaml")
    rendered = kit([sys.executable, "-m", "nvrx_eks", "job", "render", "-f", "job.yaml", "-o", "dist"])
    assert rendered.returncode == 0, rendered.stderr
    assert (outside / "dist" / "nvrx-local.k8s.yaml").is_file()
