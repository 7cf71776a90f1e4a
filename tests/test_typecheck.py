"""The kit type-checks (pyproject `[tool.mypy]`: strict over every part).

The check is mypy, run as `make check` runs it (tools/typecheck.py: over the kit laid out as installed,
one package nvrx_eks, with each reported path mapped back to the repository's). The first test proves
it bites and names the repository's file; the second runs it over the tree, which with a cold cache
reads torch's annotations for about a minute, so it is slow (`make check` runs the tool itself).
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


def _typecheck(root: Path, cache: Path, *mypy_options: str) -> subprocess.CompletedProcess[str]:
    return run_python(
        str(REPO / "tools" / "typecheck.py"),
        str(root),
        f"--cache-dir={cache}",
        *mypy_options,
        timeout=280,
        cwd=root,
        env={"PATH": str(Path(sys.executable).parent)},
    )


def test_type_check_fails_on_a_type_error_and_names_the_repository_file(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    shutil.copy(REPO / "pyproject.toml", tree / "pyproject.toml")
    for package in PACKAGES:
        shutil.copytree(REPO / package, tree / package, ignore=shutil.ignore_patterns("__pycache__"))
    target = tree / "kitcore" / "naming.py"
    source = target.read_text()
    target.write_text(source + '\n\ndef mistyped() -> int:\n    return "not an int"\n')
    line = source.count("\n") + 4
    # kitcore alone, under the same configuration: seconds, where the whole kit reads torch first.
    done = _typecheck(tree, tmp_path / "cache", "-p", "nvrx_eks.kitcore")
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"kitcore/naming.py:{line}: error: Incompatible return value type" in done.stdout, done.stdout
    assert "nvrx_eks/kitcore" not in done.stdout


@pytest.mark.slow
@pytest.mark.shareable
def test_type_check_passes_on_the_tree() -> None:
    # The checkout's own cache, as `make check` runs it: minutes cold, seconds once it ran.
    done = _typecheck(REPO, REPO / ".mypy_cache")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success: no issues found" in done.stdout
