"""Cut pyproject.toml down to the trainer, for the image's wheel: its dependencies and its packages.

images/Dockerfile runs this in its `wheel` stage (`python images/trainer_requires.py pyproject.toml`):
the kit's cluster tooling (CDK, cdk8s, kubernetes, matplotlib) is not in the image, and a requirement
the wheel declares but the image does not install fails `pip check` there; the stage copies only the
trainer's folders, and a listed package whose folder is absent fails the build. The ranges stay
pyproject.toml's. Standard library only: it runs in the image's build before anything is installed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

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
"""The packages (with their subpackages) the trainer's wheel holds besides the kit's own `nvrx_eks`: the
trainer and the core below it."""


def cut(text: str, keep: tuple[str, ...] = TRAINER_REQUIRES) -> str:
    """`text` (a pyproject.toml) with only the `keep` entries left in [project] dependencies and only
    TRAINER_PACKAGES (and their subpackages) in [tool.setuptools] packages."""
    return _cut_packages(_cut_dependencies(text, keep))


def _cut_packages(text: str) -> str:
    block = re.search(r"^packages = \[\n(.*?)^\]", text, flags=re.DOTALL | re.MULTILINE)
    if block is None:
        raise SystemExit("pyproject.toml has no `packages = [` block")
    kept = [
        line
        for line in block.group(1).splitlines()
        if (name := re.match(r'\s*"([A-Za-z0-9_.]+)"', line))
        and (
            name.group(1) == "nvrx_eks"
            or any(name.group(1) == p or name.group(1).startswith(p + ".") for p in TRAINER_PACKAGES)
        )
    ]
    return text[: block.start(1)] + "\n".join(kept) + "\n" + text[block.end(1) :]


def _cut_dependencies(text: str, keep: tuple[str, ...]) -> str:
    block = re.search(r"^dependencies = \[\n(.*?)^\]", text, flags=re.DOTALL | re.MULTILINE)
    if block is None:
        raise SystemExit("pyproject.toml has no `dependencies = [` block")
    kept = [
        line
        for line in block.group(1).splitlines()
        if (name := re.match(r'\s*"([A-Za-z0-9_.-]+)', line)) and name.group(1).lower() in keep
    ]
    if len(kept) != len(keep):
        raise SystemExit(f"pyproject.toml declares {len(kept)} of {keep}")
    return text[: block.start(1)] + "\n".join(kept) + "\n" + text[block.end(1) :]


def rewrite(path: Path) -> None:
    """Replace `path` by its cut, as a new file: never written in place, because a builder may hand the
    build a hard link to the build context's file (podman's did: an in-place write cut the checkout's
    own pyproject.toml)."""
    partial = path.with_name(f".{path.name}.cut")
    partial.write_text(cut(path.read_text()))
    partial.replace(path)


if __name__ == "__main__":
    rewrite(Path(sys.argv[1]))
