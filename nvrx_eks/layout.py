"""The kit's layout, read from its one declaration: pyproject.toml's `[tool.setuptools.package-dir]`.

The repository keeps the kit's parts in top-level folders (training/ is `nvrx_eks.training`, kitcore/ is
`nvrx_eks.kitcore`, ...); the table maps each dotted part to its folder, and everything else follows
from it, never restated:

- setup.py: the wheel's package list, every folder below a mapped one;
- nvrx_eks/__init__.py: `CheckoutFinder`, which resolves the mapped parts (and only those) for a
  checkout used without an install, as the images' store does;
- tools/typecheck.py and tools/lint_imports.py: `lay_out`, the sources copied to their installed paths
  for the static tools that find a module by its folder, and `source_of` back to the file a developer
  edits.

Standard library only: setup.py loads this file by path before anything is installed.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import shutil
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType

PACKAGE = "nvrx_eks"


def package_dirs(checkout: Path) -> dict[str, str]:
    """pyproject.toml's package-dir of `checkout`: dotted part -> its folder, relative to the checkout."""
    with (checkout / "pyproject.toml").open("rb") as file:
        setuptools = tomllib.load(file).get("tool", {}).get("setuptools", {})
    return dict(setuptools.get("package-dir", {}))


def packages(checkout: Path) -> list[str]:
    """Every package of the kit: each mapped part and every folder below it, the data folders beside its
    modules included (k8s/values/, infra/configs/, ...: what the CLI reads at run time). A mapped folder
    without an `__init__.py` is an error: the declaration names what the wheel must hold."""
    found = []
    for package, folder in package_dirs(checkout).items():
        root = checkout / folder
        if not (root / "__init__.py").is_file():
            raise FileNotFoundError(f"pyproject.toml maps {package} to {folder}/, which holds no __init__.py")
        below = sorted(
            path
            for path in root.rglob("*")
            if path.is_dir()
            and not any(part.startswith((".", "__")) for part in path.relative_to(root).parts)
        )
        found += [package, *(".".join([package, *path.relative_to(root).parts]) for path in below)]
    return found


def parts(checkout: Path) -> list[str]:
    """The kit's folders in the checkout, its own package's first (nvrx_eks, kitcore, training, ...)."""
    return list(package_dirs(checkout).values())


def lay_out(checkout: Path, dest: Path) -> None:
    """Copy the Python sources of each mapped folder of `checkout` under `dest`, at the package's dotted
    path. Modification times are kept, so a tool's cache keyed on them stays valid."""
    for package, folder in package_dirs(checkout).items():
        target = dest.joinpath(*package.split("."))
        source = checkout / folder
        for path in source.rglob("*.py"):
            relative = path.relative_to(source)
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target / relative)


def source_of(checkout: Path, laid_out: str) -> str | None:
    """The repository path (relative to `checkout`) of `laid_out`, a path relative to the layout's root
    such as nvrx_eks/training/api.py; None when no mapped part holds it."""
    path_parts = Path(laid_out).parts
    # The longest package first: nvrx_eks.training owns nvrx_eks/training/api.py, not nvrx_eks.
    for package, folder in sorted(package_dirs(checkout).items(), key=lambda item: -len(item[0])):
        prefix = tuple(package.split("."))
        if path_parts[: len(prefix)] == prefix:
            return Path(folder, *path_parts[len(prefix) :]).as_posix()
    return None


class CheckoutFinder(importlib.abc.MetaPathFinder):
    """Resolves each mapped part of a source checkout (`nvrx_eks.training` -> CHECKOUT/training) and
    nothing else: the checkout's other folders (tests/, examples/, the nvrx_eks/ folder itself) are no
    parts of the kit and do not import as `nvrx_eks.<folder>`. Subpackages then resolve through their
    part's own `__path__`, as installed."""

    def __init__(self, checkout: Path) -> None:
        self.checkout = checkout
        self._folders: dict[str, Path] | None = None

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,  # noqa: ARG002 - the finder protocol's; a part is found by name
        target: ModuleType | None = None,  # noqa: ARG002
    ) -> ModuleSpec | None:
        if self._folders is None:  # read once, on the first name no other finder resolved
            mapped = package_dirs(self.checkout).items()
            self._folders = {name: self.checkout / folder for name, folder in mapped if name != PACKAGE}
        folder = self._folders.get(fullname)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(
            fullname, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )
