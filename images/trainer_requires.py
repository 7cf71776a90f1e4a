"""Cut pyproject.toml down to the trainer, for the image's wheel: its dependencies and its packages.

images/Dockerfile runs this in its `wheel` stage (`python images/trainer_requires.py pyproject.toml`):
the kit's cluster tooling (CDK, cdk8s, kubernetes, matplotlib) is not in the image, and a requirement
the wheel declares but the image does not install fails `pip check` there; the stage copies only the
trainer's folders, and a mapped part whose folder is absent fails the build (setup.py derives the
packages from pyproject.toml's package-dir). The ranges stay
pyproject.toml's. Only what builds the wheel is kept (the build system, the project's metadata and
the package layout): the development extras, the `nvrx-eks` command (its module is not in the image),
the tools' settings and comments go, so an edit to any of them leaves the images' tag alone
(infra/revision.py hashes this cut of the file). Standard library only: it runs in the image's build
before anything is installed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

TRAINER_REQUIRES = (
    "torch",
    "nvidia-resiliency-ext",
    "pydantic",
    "pyyaml",
    "typer",
    "rich",
    "prometheus-client",
    "boto3",
)
"""What the trainer's wheel declares; each is installed by images/requirements.lock or
images/torch-requirements.lock (tests/images checks)."""


TRAINER_PACKAGES = ("nvrx_eks.kitcore", "nvrx_eks.training")
"""The parts the trainer's wheel holds besides the kit's own `nvrx_eks`: the trainer and the core below
it (each with its subpackages)."""


WHEEL_TABLES = (
    "build-system",
    "project",
    "tool.setuptools",
    "tool.setuptools.package-dir",
    "tool.setuptools.package-data",
)
"""The pyproject.toml tables the wheel is built from; every other one is cut."""


def cut(text: str, keep: tuple[str, ...] = TRAINER_REQUIRES) -> str:
    """`text` (a pyproject.toml) with only WHEEL_TABLES, no comment, only the `keep` entries left in
    [project] dependencies, only TRAINER_PACKAGES (and `nvrx_eks`) in [tool.setuptools.package-dir], and
    no readme."""
    text = _wheel_tables(text)
    text, declared = _keep_entries(text, "dependencies", lambda name: name.lower() in keep)
    if declared != len(keep):
        raise SystemExit(f"pyproject.toml declares {declared} of {keep}")
    # The README is the kit's page, not the trainer's: left out of the image, an edit to it does not
    # change the images' tag (infra/revision.py hashes what the image recipes copy).
    text = re.sub(r'^readme = "README.md"\n', "", text, count=1, flags=re.MULTILINE)
    return _keep_parts(text, ("nvrx_eks", *TRAINER_PACKAGES))


def _keep_parts(text: str, parts: tuple[str, ...]) -> str:
    """`text` with only the `parts` left in its [tool.setuptools.package-dir] table (one `"part" =
    "folder"` line each)."""
    table = re.search(r"^\[tool\.setuptools\.package-dir\]\n(.*?)(?=^\[|\Z)", text, re.DOTALL | re.MULTILINE)
    if table is None:
        raise SystemExit("pyproject.toml has no [tool.setuptools.package-dir] table")
    kept = [
        line
        for line in table.group(1).splitlines()
        if not (entry := re.match(r'\s*"([A-Za-z0-9_.]+)"\s*=', line)) or entry.group(1) in parts
    ]
    return text[: table.start(1)] + "\n".join(kept) + "\n" + text[table.end(1) :]


def _wheel_tables(text: str) -> str:
    """`text` with only the WHEEL_TABLES and no comment line or comment after a list entry."""
    kept: list[str] = []
    keeping = True
    for line in text.splitlines():
        header = re.match(r"^\[\[?([^\]]+)\]", line)
        if header:
            keeping = not line.startswith("[[") and header.group(1).strip() in WHEEL_TABLES
        if keeping and not line.lstrip().startswith("#"):
            kept.append(re.sub(r'^(\s*"[^"]*",?)\s*#.*$', r"\1", line))
    return "\n".join(kept) + "\n"


def _keep_entries(text: str, key: str, keeps: Callable[[str], bool]) -> tuple[str, int]:
    """`text` with only the entries of its `key = [` list (one quoted entry per line) whose name
    `keeps`, and how many stayed. A name is the entry up to its first version operator or quote."""
    block = re.search(rf"^{key} = \[\n(.*?)^\]", text, flags=re.DOTALL | re.MULTILINE)
    if block is None:
        raise SystemExit(f"pyproject.toml has no `{key} = [` block")
    kept = [
        line
        for line in block.group(1).splitlines()
        if (name := re.match(r'\s*"([A-Za-z0-9_.-]+)', line)) and keeps(name.group(1))
    ]
    return text[: block.start(1)] + "\n".join(kept) + "\n" + text[block.end(1) :], len(kept)


def rewrite(path: Path) -> None:
    """Replace `path` by its cut, as a new file: never written in place, because a builder may hand the
    build a hard link to the build context's file (podman's did: an in-place write cut the checkout's
    own pyproject.toml)."""
    partial = path.with_name(f".{path.name}.cut")
    partial.write_text(cut(path.read_text()))
    partial.replace(path)


if __name__ == "__main__":
    rewrite(Path(sys.argv[1]))
