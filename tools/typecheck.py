"""Run mypy (pyproject.toml's `[tool.mypy]`) over the kit as it is installed: one package, nvrx_eks.

Every import in the kit names `nvrx_eks.<part>`, and the parts live in top-level folders that
pyproject.toml's package-dir maps under nvrx_eks. mypy finds a module by walking folders from its search
path, so in the checkout `nvrx_eks.training` is nowhere: nvrx_eks/ holds no training/. Pointing mypy at
the real folders instead (`explicit_package_bases` with the checkout on `mypy_path`) names the files
`training.api`, `kitcore.configio`, ..., and then every `from nvrx_eks.kitcore ... import` fails to
resolve; a farm of symbolic links would need links the repository cannot carry everywhere. So, as
tools/lint_imports.py does for import-linter, this copies the mapped folders into a temporary folder in
the installed layout (nvrx_eks/layout.py, from pyproject.toml's package-dir) and runs mypy there, which
resolves every name as an installed kit does. mypy's report names the copies; each is rewritten to the
repository's own path (nvrx_eks/training/api.py:12 -> training/api.py:12) so an error points at a file a
developer edits.

The copies keep their modification times and the cache (CHECKOUT/.mypy_cache by default) is keyed by
module, not by folder, so a rerun rechecks only what changed: about a minute cold, seconds warm.

    python tools/typecheck.py [CHECKOUT] [MYPY_OPTION ...]   # exit code: mypy's
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

from nvrx_eks.layout import lay_out, source_of

# The path that starts a line of mypy's report, before `:LINE:`.
REPORTED_PATH = re.compile(r"^(?P<path>[^\s:]+\.pyi?)(?=:)", re.MULTILINE)


def to_repository_paths(checkout: Path, report: str) -> str:
    """`report` with each laid-out path replaced by the repository path of the same file."""

    def replace(match: re.Match[str]) -> str:
        return source_of(checkout, match["path"]) or match["path"]

    return REPORTED_PATH.sub(replace, report)


def main(checkout: Path, mypy_options: list[str]) -> int:
    options = list(mypy_options)
    if not any(option.startswith("--cache-dir") for option in options):
        options.append(f"--cache-dir={checkout / '.mypy_cache'}")
    with tempfile.TemporaryDirectory(prefix="nvrx-eks-typecheck-") as view:
        lay_out(checkout, Path(view))
        done = subprocess.run(
            [sys.executable, "-m", "mypy", "--config-file", str(checkout / "pyproject.toml"), *options],
            cwd=view,
            capture_output=True,
            text=True,
            check=False,
        )
    sys.stdout.write(to_repository_paths(checkout, done.stdout))
    sys.stderr.write(to_repository_paths(checkout, done.stderr))
    return done.returncode


if __name__ == "__main__":
    arguments = sys.argv[1:]
    has_checkout = bool(arguments) and not arguments[0].startswith("-")
    root = Path(arguments[0]).resolve() if has_checkout else Path(__file__).resolve().parent.parent
    sys.exit(main(root, arguments[1:] if has_checkout else arguments))
