"""Run import-linter (pyproject.toml's contracts) over the kit as it is installed: one package, nvrx_eks.

The repository keeps the kit's parts in top-level folders that pyproject.toml's package-dir maps under
nvrx_eks; import-linter (grimp) finds a package's modules by walking the one folder its import spec
names, so it would see nvrx_eks/ alone. This lays the mapped folders out as the wheel does, in a
temporary folder, and runs `lint-imports` there with the same configuration.

    python tools/lint_imports.py [CHECKOUT]    # exit code and output: lint-imports'
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lay_out(checkout: Path, dest: Path) -> None:
    """Copy the Python sources of each package-dir entry of `checkout`'s pyproject.toml under `dest`, at
    the package's dotted path."""
    setuptools = tomllib.loads((checkout / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package, folder in setuptools["package-dir"].items():
        target = dest.joinpath(*package.split("."))
        source = checkout / folder
        for path in source.rglob("*.py"):
            relative = path.relative_to(source)
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target / relative)


def main(checkout: Path) -> int:
    with tempfile.TemporaryDirectory(prefix="nvrx-eks-imports-") as view:
        lay_out(checkout, Path(view))
        env = {**os.environ, "PYTHONPATH": view}
        return subprocess.run(
            [str(LINT_IMPORTS), "--no-cache", str(checkout / "pyproject.toml")],
            cwd=view,
            env=env,
            check=False,
        ).returncode


if __name__ == "__main__":
    sys.exit(
        main(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
    )
