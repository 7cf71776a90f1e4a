"""Which images a checkout builds, and its source revision.

`image_revision()` is the tag `nvrx-eks image build/push` give the training and store images: a hash of
what their Dockerfiles take from the checkout. The stack's node check names the image by it and the
job-values fallback points at it (infra/app.py, infra/ops/stack_values.py), so a checkout that deploys
names the images any checkout with the same image inputs built: a commit to docs, charts or stacks
names the images already pushed, and only a change to what goes into them asks for a new push. A file
the build rewrites before it uses it counts as what the image holds of it: pyproject.toml as
images/trainer_requires.py cuts it (the trainer's dependencies and packages), so a development tool
added to it names the same images. Here, below images/ and infra/ops/, so all of them compute the
same tag.
"""

from __future__ import annotations

import hashlib
import re
import runpy
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
IMAGE_RECIPES = ("images/Dockerfile", "images/store.Dockerfile")
"""The training and store images' Dockerfiles, relative to the checkout (their build context)."""
IMAGE_TAG_PREFIX = "img-"
"""Marks a content tag apart from a git revision (the images' revision label) in the repository."""
_ARG = re.compile(r"^ARG (\w+)=(\S+)$", re.MULTILINE)
_BIND_SOURCE = re.compile(r"--mount=type=bind,source=([^,\s]+)")
_SKIPPED = frozenset({"__pycache__"})
CUT_IN_BUILD = {"pyproject.toml": "images/trainer_requires.py"}
"""Inputs the training image's build rewrites before it uses them, and the script that does: its
`cut(text)` is what the image holds of the file (the script is standard library only: it runs in the
build before anything is installed, and here without importing the layer above)."""


def image_revision(root: Path = REPO_ROOT) -> str:
    """The images' tag for the checkout at `root`: `img-` and 12 hex digits of a SHA-256 over every file
    the image recipes take from it (each path and its bytes, in path order)."""
    digest = hashlib.sha256()
    for path in image_inputs(root):
        name = path.relative_to(root).as_posix()
        digest.update(name.encode() + b"\0")
        digest.update(_as_built(root, name) + b"\0")
    return IMAGE_TAG_PREFIX + digest.hexdigest()[:12]


def _as_built(root: Path, name: str) -> bytes:
    """What the images hold of the input `name`: its bytes, or its cut where the build rewrites it."""
    script = CUT_IN_BUILD.get(name)
    if script is None:
        return (root / name).read_bytes()
    cut = runpy.run_path(str(root / script))["cut"]
    return str(cut((root / name).read_text())).encode()


def image_inputs(root: Path = REPO_ROOT) -> list[Path]:
    """The files of `root` the image recipes read: themselves, their COPY sources (an ARG's default
    where a source is `${ARG}`; not `COPY --from`, which copies from another stage) and their bind
    mounts, folders expanded to the files below them."""
    sources = set(IMAGE_RECIPES)
    for recipe in IMAGE_RECIPES:
        text = (root / recipe).read_text().replace("\\\n", " ")
        defaults = dict(_ARG.findall(text))
        named: set[str] = set()
        for line in text.splitlines():
            words = line.split()
            if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
                named.update(w for w in words[1:-1] if not w.startswith("--"))
            named.update(_BIND_SOURCE.findall(line))
        sources.update(_with_defaults(source, defaults) for source in named)
    files: set[Path] = set()
    for source in sources:
        path = root / source
        if path.is_dir():
            files.update(
                p for p in path.rglob("*") if p.is_file() and not _SKIPPED & set(p.relative_to(root).parts)
            )
        elif path.is_file():
            files.add(path)
        else:
            raise FileNotFoundError(f"{source}: named by {' or '.join(IMAGE_RECIPES)}, not in {root}")
    return sorted(files)


def source_revision(root: Path = REPO_ROOT) -> str | None:
    """The short commit of `root`, with `-dirty` when tracked files changed; None outside a git checkout."""
    try:
        commit = _git(root, "rev-parse", "--short=12", "HEAD")
        dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{commit}-dirty" if dirty else commit


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def _with_defaults(source: str, defaults: dict[str, str]) -> str:
    """`source` with each `${ARG}` replaced by the ARG's default in its Dockerfile."""
    return re.sub(r"\$\{(\w+)\}", lambda match: defaults.get(match[1], match[0]), source)
