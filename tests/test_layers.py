"""The kit's layers import one way and nothing imports in a circle (pyproject `[tool.importlinter]`).

The contracts are import-linter's, run as `make check` runs them (tools/lint_imports.py: over the kit laid
out as installed, one package nvrx_eks); the second test proves they bite by running them on a copy of
the tree with one upward import and one cycle added.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from children import run_python

from nvrx_eks.layout import parts

if TYPE_CHECKING:
    import subprocess

REPO = Path(__file__).resolve().parents[1]
PACKAGES = parts(REPO)  # the kit's folders, as pyproject.toml's package-dir declares them


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    return run_python(
        str(REPO / "tools" / "lint_imports.py"),
        str(root),
        timeout=120,
        cwd=root,
        env={"PATH": str(Path(sys.executable).parent)},
    )


def test_layers_and_no_cycles_hold_on_the_tree() -> None:
    done = _lint(REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 kept, 0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "line", "expected"),
    [
        # The trainer must ship without the cluster package.
        ("training/config.py", "import nvrx_eks.infra.config", "training.config -> nvrx_eks.infra.config"),
        # The reference trainer reaches the kit through the public API only, as a user's script does.
        (
            "training/trainer.py",
            "import nvrx_eks.training.checkpoint.base",
            "training.trainer -> nvrx_eks.training.checkpoint",
        ),
        # A type-only import still couples the modules: the charts' values must not know the launcher.
        (
            "k8s/values.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import nvrx_eks.k8s.launcher",
            ".values -> .launcher",
        ),
    ],
)
def test_contracts_fail_on_an_upward_import_or_a_cycle(
    tmp_path: Path, module: str, line: str, expected: str
) -> None:
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    for package in PACKAGES:
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n{line}\n")
    done = _lint(tmp_path)
    assert done.returncode != 0, done.stdout
    assert "1 broken" in done.stdout
    assert expected in done.stdout
