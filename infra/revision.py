"""The source revision of this checkout: the tag `nvrx-eks image build/push` gives the training image.

Here, below images/ and infra/ops/, so both the image commands and the job-values fallback name the
same tag (images/build.py tags with it; infra/ops/stack_values.py points job values at it).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


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
