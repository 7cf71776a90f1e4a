"""Run import-linter (pyproject.toml's contracts) over the kit as it is installed: one package, nvrx_eks.

The repository keeps the kit's parts in top-level folders that pyproject.toml's package-dir maps under
nvrx_eks; import-linter (grimp) finds a package's modules by walking the one folder its import spec
names, so it would see nvrx_eks/ alone. This lays the mapped folders out as the wheel does
(nvrx_eks/layout.py, from pyproject.toml's package-dir), in a temporary folder, and runs `lint-imports`
there with the same configuration.

    python tools/lint_imports.py [CHECKOUT]    # exit code and output: lint-imports'
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from nvrx_eks.layout import lay_out

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


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
