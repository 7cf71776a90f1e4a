"""The kit's sources laid out as the wheel installs them, for tools that find modules by folder.

The repository keeps the kit's parts in top-level folders that pyproject.toml's package-dir maps under
nvrx_eks (training/ is nvrx_eks.training, kitcore/ is nvrx_eks.kitcore, ...). Python resolves those names
at run time (nvrx_eks/__init__.py extends its `__path__`; an install maps them), but a static tool that
walks the folder an import names (import-linter's grimp, mypy) sees nvrx_eks/ alone. `lay_out` copies
each mapped folder to its dotted path under a scratch folder; `source_of` maps a path there back to the
repository's file, so a tool's report can name the file a developer edits.
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path


def package_dirs(checkout: Path) -> dict[str, str]:
    """pyproject.toml's package-dir of `checkout`: dotted package -> folder, relative to the checkout."""
    setuptools = tomllib.loads((checkout / "pyproject.toml").read_text())["tool"]["setuptools"]
    return dict(setuptools["package-dir"])


def lay_out(checkout: Path, dest: Path) -> None:
    """Copy the Python sources of each package-dir entry of `checkout`'s pyproject.toml under `dest`, at
    the package's dotted path. Modification times are kept, so a tool's cache keyed on them stays valid."""
    for package, folder in package_dirs(checkout).items():
        target = dest.joinpath(*package.split("."))
        source = checkout / folder
        for path in source.rglob("*.py"):
            relative = path.relative_to(source)
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target / relative)


def source_of(checkout: Path, laid_out: str) -> str | None:
    """The repository path (relative to `checkout`) of `laid_out`, a path relative to the layout's root
    such as nvrx_eks/training/api.py; None when no package-dir entry holds it."""
    parts = Path(laid_out).parts
    # The longest package first: nvrx_eks.training owns nvrx_eks/training/api.py, not nvrx_eks.
    for package, folder in sorted(package_dirs(checkout).items(), key=lambda item: -len(item[0])):
        prefix = tuple(package.split("."))
        if parts[: len(prefix)] == prefix:
            return Path(folder, *parts[len(prefix) :]).as_posix()
    return None
