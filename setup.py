"""The wheel's package list, derived from pyproject.toml's package-dir (nvrx_eks/layout.py): the kit
declares its layout once, there; everything else about the build is in pyproject.toml."""

import importlib.util
from pathlib import Path

from setuptools import setup

_HERE = Path(__file__).resolve().parent
_SPEC = importlib.util.spec_from_file_location("nvrx_eks_layout", _HERE / "nvrx_eks" / "layout.py")
_LAYOUT = importlib.util.module_from_spec(_SPEC)  # type: ignore[arg-type]
_SPEC.loader.exec_module(_LAYOUT)  # type: ignore[union-attr]

setup(packages=_LAYOUT.packages(_HERE))
